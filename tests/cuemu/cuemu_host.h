/* cuemu_host.h: the host side of the CUDA emulator (tests/cuemu), callable from C: finds a
 * kernel of kernels/cuda built for the CPU and launches it. One OS thread at a time. */
#ifndef CUEMU_HOST_H
#define CUEMU_HOST_H

#ifdef __cplusplus
extern "C" {
#endif

struct cuemu_kernel;

/* The extern "C" __global__ entry `name` of kernels/cuda/<file>.cu, or NULL if the emulator
 * was not built with it. Borrowed, valid for the life of the process. */
const struct cuemu_kernel *cuemu_find(const char *file, const char *name);

/* Runs k over a grid (gx, gy, gz) of blocks (bx, by, bz), at most 1024 threads a block, and
 * returns when every block has finished. args as cuLaunchKernel's kernelParams: args[i]
 * points to the value of parameter i. Returns 0, or 1 for an invalid launch or a deadlock
 * (the launch is abandoned; cuemu_error() says why). */
int cuemu_launch(const struct cuemu_kernel *k, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                 unsigned by, unsigned bz, void **args);

/* The message of the last failed launch ("" if none). Borrowed. */
const char *cuemu_error(void);

#ifdef __cplusplus
}
#endif

#endif
