/* cli_dist: inferrt under mpirun. A plan built with `infc build --tp N` runs as
 * `mpirun -n N inferrt generate|batch|bench|serve plan ...`: every rank opens the plan with
 * MPI's collectives (irt_comm over MPI_COMM_WORLD); rank 0 goes on with the command (the
 * scheduler, HTTP, batch I/O) while ranks 1.. run the steps rank 0 sends
 * (irt_model_follow) and exit when rank 0 closes its model. Without mpirun nothing here
 * runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* mpirun (Open MPI, MPICH's hydra, PMIx launchers) says so in the environment. */
static bool launched_by_mpi(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

#ifdef INFERRT_HAVE_MPI
#include <limits.h>
#include <mpi.h>

static struct {
  bool on; /* MPI is initialized and the job has more than one rank */
  bool inited;
  irt_comm comm;
  irt_model *open; /* rank 0: the model its ranks follow, until cli_model_close */
  /* this rank's time inside each kind of collective (waits for the other ranks included),
   * printed at exit: the share of a step the ranks spend meeting */
  double ms[3];
  long calls[3];
  bool data_parallel; /* batch with a one-rank plan: each rank runs its share of the lines */
} g_dist;

enum { C_REDUCE, C_GATHER, C_BCAST };

static void account(int kind, double t0) {
  g_dist.ms[kind] += cli_now_ms() - t0;
  g_dist.calls[kind]++;
}

/* Peak resident memory of this process (VmHWM), in MiB, or -1. */
static double peak_rss_mib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  double kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmHWM:", 6)) kib = strtod(line + 6, NULL);
  if (f) fclose(f);
  return kib < 0 ? -1 : kib / 1024.0;
}

static void print_stats(void) {
  if (!g_dist.on || !(g_dist.calls[0] + g_dist.calls[1] + g_dist.calls[2])) return;
  fprintf(stderr,
          "inferrt: rank %d of %d: collectives %.1f ms (all_reduce %ld in %.1f ms, all_gather %ld "
          "in %.1f ms, broadcast %ld in %.1f ms); peak RSS %.1f MiB\n",
          g_dist.comm.rank, g_dist.comm.size, g_dist.ms[0] + g_dist.ms[1] + g_dist.ms[2],
          g_dist.calls[C_REDUCE], g_dist.ms[C_REDUCE], g_dist.calls[C_GATHER], g_dist.ms[C_GATHER],
          g_dist.calls[C_BCAST], g_dist.ms[C_BCAST], peak_rss_mib());
}

/* Counts above INT_MAX go in pieces (MPI counts are int). */
static int all_reduce(void *ctx, float *buf, size_t n) {
  (void)ctx;
  double t0 = cli_now_ms();
  for (size_t off = 0; off < n;) {
    int c = n - off > INT_MAX ? INT_MAX : (int)(n - off);
    if (MPI_Allreduce(MPI_IN_PLACE, buf + off, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
      return 1;
    off += (size_t)c;
  }
  account(C_REDUCE, t0);
  return 0;
}

static int all_gather(void *ctx, const void *send, size_t bytes, void *recv) {
  (void)ctx;
  if (bytes > INT_MAX) return 1;
  double t0 = cli_now_ms();
  int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD) !=
           MPI_SUCCESS;
  account(C_GATHER, t0);
  return rc;
}

static int broadcast(void *ctx, void *buf, size_t bytes, int root) {
  (void)ctx;
  if (bytes > INT_MAX) return 1;
  double t0 = cli_now_ms();
  int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD) != MPI_SUCCESS;
  account(C_BCAST, t0);
  return rc;
}

static void abort_job(void *ctx, int code) {
  (void)ctx;
  fprintf(stderr, "inferrt: rank %d: a step failed midway; ending the job\n", g_dist.comm.rank);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

static void dist_exit(void) {
  if (g_dist.open) { /* rank 0 left without closing: let the other ranks go first */
    irt_model_close(g_dist.open);
    g_dist.open = NULL;
  }
  print_stats();
  if (g_dist.inited) MPI_Finalize();
  g_dist.inited = false;
}

int cli_dist_init(const char *cmd) {
  if (!launched_by_mpi()) return 0;
  int provided = 0;
  if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    return cli_fail("MPI_Init_thread failed");
  g_dist.inited = true;
  atexit(dist_exit);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size <= 1) return 0;
  if (provided < MPI_THREAD_SERIALIZED)
    return cli_fail("rank %d: this MPI gives no MPI_THREAD_SERIALIZED (the engine's thread "
                    "calls the collectives)",
                    rank);
  static const char *const ok[] = {"generate", "batch", "bench", "serve"};
  bool known = false;
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) known |= !strcmp(cmd, ok[i]);
  if (!known)
    return cli_fail("'%s' does not run under mpirun; generate, batch, bench and serve do (with "
                    "a plan built by infc build --tp N)",
                    cmd);
  g_dist.on = true;
  g_dist.comm = (irt_comm){.rank = rank,
                           .size = size,
                           .all_reduce_sum_f32 = all_reduce,
                           .all_gather = all_gather,
                           .broadcast = broadcast,
                           .abort = abort_job};
  return 0;
}

int cli_dist_rank(void) { return g_dist.on ? g_dist.comm.rank : 0; }

int cli_dist_data_parallel(const char *plan, int *rank) {
  *rank = 0;
  int tp = 0;
  irt_error err = {0};
  if (!g_dist.on || irt_plan_tp_size(plan, &tp, &err) != IRT_OK || tp != 1) return 1;
  g_dist.data_parallel = true; /* every rank its own model: no collectives */
  *rank = g_dist.comm.rank;
  return g_dist.comm.size;
}

int cli_dist_barrier(void) {
  if (!g_dist.on) return 0;
  return MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS;
}

void cli_dist_abort(int code) {
  if (!g_dist.on) return;
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

irt_status cli_model_open(const char *path, irt_model_opts *o, irt_model **out, irt_error *err) {
  if (!g_dist.on || g_dist.data_parallel) return irt_model_open(path, o, out, err);
  o->comm = &g_dist.comm;
  irt_status st = irt_model_open(path, o, out, err);
  if (g_dist.comm.rank == 0 && st == IRT_OK) {
    g_dist.open = *out;
    return st;
  }
  if (g_dist.comm.rank == 0) { /* the other ranks may wait on it: end the job */
    fprintf(stderr, "inferrt: error: %s\n", err->msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* ranks 1..: the steps of rank 0, then out (a failure ends the job: mpirun stops it) */
  if (st == IRT_OK) {
    st = irt_model_follow(*out, err);
    irt_model_close(*out);
  }
  if (st == IRT_OK) print_stats(), g_dist.on = false; /* once, before exit's handler */
  if (st != IRT_OK) {
    fprintf(stderr, "inferrt: rank %d: error: %s\n", g_dist.comm.rank, err->msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  exit(0);
}

void cli_model_close(irt_model *m) {
  if (m && m == g_dist.open) g_dist.open = NULL;
  irt_model_close(m);
}

#else /* built without MPI */

int cli_dist_init(const char *cmd) {
  (void)cmd;
  if (launched_by_mpi())
    return cli_fail("this inferrt is built without MPI (install libopenmpi-dev and rebuild) "
                    "and cannot run under mpirun");
  return 0;
}

int cli_dist_rank(void) { return 0; }

int cli_dist_data_parallel(const char *plan, int *rank) {
  (void)plan;
  *rank = 0;
  return 1;
}

int cli_dist_barrier(void) { return 0; }

void cli_dist_abort(int code) { (void)code; }

irt_status cli_model_open(const char *path, irt_model_opts *o, irt_model **out, irt_error *err) {
  return irt_model_open(path, o, out, err);
}

void cli_model_close(irt_model *m) { irt_model_close(m); }

#endif
