#!/usr/bin/env python3
"""test_hostile: crafted model, config, tokenizer, build.yaml and plan-path inputs
(tools/gen-hostile writes them from scratch) each end the command with one error line naming
the problem: exit status 1, never a signal, a sanitizer report, a hang or a large
allocation. Peak RSS is bounded per case in a release build (ASan's shadow memory makes it
meaningless under sanitizers, where the memory errors themselves are what fails).
usage: test_hostile.py INFC INFERRT FIXTURES_DIR TMP_DIR"""
import json
import os
import subprocess
import sys
import time

from elib import check, done

INFC, INFERRT, TMP = sys.argv[1], sys.argv[2], os.path.join(sys.argv[4], "hostile")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SANITIZED = bool(os.environ.get("ASAN_OPTIONS"))

# Runs a shell command in a fresh interpreter that prints its children's peak RSS (KB) as
# the last stderr line: RUSAGE_CHILDREN is a running maximum, so each case gets its own.
PROBE = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1], shell=True); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
         "sys.exit(r.returncode)")


def run(cmd, secs):
    """Returns (status, stderr lines without the RSS line, seconds, peak RSS in MB); status -1:
    killed after the limit (a hang)."""
    t0 = time.time()
    p = subprocess.Popen([sys.executable, "-c", PROBE, cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        _, err = p.communicate(timeout=max(secs * (20 if SANITIZED else 1), 30))
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        return -1, err.decode(errors="replace").splitlines(), time.time() - t0, -1
    dt = time.time() - t0
    lines = err.decode(errors="replace").strip().splitlines()
    rss = int(lines.pop()) / 1024 if lines and lines[-1].isdigit() else -1
    return p.returncode, lines, dt, rss


# The fuzzers' finds (tests/fuzz/regressions/TARGET/FILE) are replayed through their target
# by ctest's fuzz_replay_TARGET; those that are a file a user would hand a command also go
# through that command here: refused with one error line, no sanitizer report, no hang.
REPLAY = {
    "hfconfig": lambda f, d: ("{infc} build %s -o %s/x.plan" % (as_config(f, d), d)),
    "onnx": lambda f, d: "{infc} build %s -o %s/x.plan" % (f, d),
    "tokenizer_json": lambda f, d: "{inferrt} tokenize --tokenizer %s --text ab" % f,
}


def as_config(f, d):
    sub = os.path.join(d, "reg-" + os.path.basename(f))
    os.makedirs(sub, exist_ok=True)
    with open(f, "rb") as a, open(os.path.join(sub, "config.json"), "wb") as b:
        b.write(a.read())
    return sub


def regressions():
    base = os.path.join(ROOT, "tests", "fuzz", "regressions")
    seen = 0
    for target in sorted(os.listdir(base)):
        if target not in REPLAY:
            continue
        for name in sorted(os.listdir(os.path.join(base, target))):
            cmd = REPLAY[target](os.path.join(base, target, name), TMP)
            st, msg, dt, rss = run(cmd.format(infc=INFC, inferrt=INFERRT), 5)
            seen += 1
            label = "%s/%s" % (target, name)
            check(label + ": refused", st == 1 and len(msg) == 1 and "error:" in msg[0],
                  "status %d: %s" % (st, "\n".join(msg)[-2000:]))
            print("%-28s %5.2f s %7.1f MB  %s" % (label[:28], dt, rss, msg[0][:110] if msg else ""))
    check("regressions replayed", seen >= 4, str(seen))


def main():
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen-hostile"), TMP], check=True,
                   stdout=subprocess.DEVNULL)
    cases = json.load(open(os.path.join(TMP, "cases.json")))
    check("cases written", len(cases) >= 15, str(len(cases)))
    for c in cases:
        cmd = c["cmd"].format(infc=INFC, inferrt=INFERRT, dir=TMP)
        st, msg, dt, rss = run(cmd, c["secs"])
        name = c["name"]
        check(name + ": exit 1", st == 1, "status %d: %s" % (st, "\n".join(msg)[-2000:]))
        check(name + ": one error line", len(msg) == 1 and "error:" in msg[0], repr(msg[:3]))
        check(name + ": names the problem", any(c["want"] in m for m in msg),
              "want %r in %r" % (c["want"], msg[:2]))
        if not SANITIZED:
            check(name + ": time", dt < c["secs"], "%.2f s > %d s" % (dt, c["secs"]))
            check(name + ": peak RSS", 0 < rss < c["rss_mb"], "%.1f MB >= %d MB" % (rss, c["rss_mb"]))
        print("%-28s %5.2f s %7.1f MB  %s" % (name, dt, rss, msg[0][:110] if msg else ""))
    regressions()
    done("hostile")


main()
