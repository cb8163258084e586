/* cli_run: `inferrt run`, the generic run mode on the command line: runs a program plan
 * (e.g. one built from model.onnx) on inputs read from serialized ONNX TensorProto files
 * and writes its outputs the same way. */
#ifndef IRT_CLI_RUN_H
#define IRT_CLI_RUN_H

/* argv[0] is the command name ("run"). Returns the process exit code; prints
 * "inferrt: error: ..." on failure. */
int cmd_run(int argc, char **argv);

#endif
