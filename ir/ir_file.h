/* ir_file: opening untrusted input files. Every model, plan, tokenizer, config and batch
 * file goes through here: a FIFO, a device or a directory is refused at once (opened with
 * O_NONBLOCK, so a FIFO with no writer cannot hang the open), and a whole-file read is
 * bounded by the caller's limit, so a file's size never decides an allocation alone. */
#ifndef IR_FILE_H
#define IR_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ir_status.h"

/* Opens path read-only if it is a regular file; *out_fd (close-on-exec, blocking reads) and
 * its size. Errors (IR_IO) say "cannot open: <errno text>" or "not a regular file". */
ir_status ir_file_open(const char *path, int *out_fd, uint64_t *out_size, ir_diag *d);

/* The same as a stdio stream ("rb"); NULL with d set on error. */
FILE *ir_file_fopen(const char *path, ir_diag *d);

/* The whole regular file, NUL-terminated (malloc'd), and its length; refused (IR_BAD_FORMAT)
 * past max_bytes before anything is allocated. */
ir_status ir_file_read(const char *path, size_t max_bytes, char **out, size_t *out_len, ir_diag *d);

#endif
