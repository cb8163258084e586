"""elib: what the Python e2e drivers share (tlib.sh's twin for the shell ones): counted
checks and the exit status they give, a free TCP port, waiting for a server's /health, and
the environment mpirun runs under in the tests."""
import os
import socket
import sys
import time
import urllib.request

passed = failed = 0


def check(name, cond, detail=""):
    """Counts a check; a failed one is reported on stderr with its detail."""
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s %s" % (name, detail), file=sys.stderr, flush=True)


def done(suite):
    """Prints the counts and exits: 1 when a check failed or none ran."""
    print("%s: %d passed, %d failed" % (suite, passed, failed))
    sys.exit(1 if failed or not passed else 0)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_health(port, proc, secs=30.0):
    """True once http://127.0.0.1:port/health answers; False when proc ends first or secs
    pass."""
    end = time.monotonic() + secs
    while time.monotonic() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def mpi_env():
    """This environment for mpirun: as root, oversubscribed (more ranks than cores), no
    single-copy shared memory (containers forbid it). Under the sanitizer build leaks are
    not checked there: Open MPI's components leave allocations at exit from modules it has
    unloaded, which no suppression can name (tests/unit/test_tp.c checks the tensor-parallel
    code's leaks without MPI); memory errors still are."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    if "ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] += ":detect_leaks=0"
    return env
