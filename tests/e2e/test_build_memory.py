#!/usr/bin/env python3
"""test_build_memory: infc builds stream the checkpoint, so a build's peak resident set
stays small whatever the model's size. A checkpoint of a real shape (tools/gen-checkpoint:
Llama-3.2-1B's layers, four of them, 1 GB of bf16) is built as bf16, f16, q4_0, int8 and
two tensor-parallel ranks; each build's peak RSS (the kernel's count for that process,
os.wait4) must stay under a bound far below the checkpoint's size, and the plan must load
and generate, with --preload and without.

--slow (ctest label slow): Llama-3.1-8B's exact shape (16 GB of bf16, four shards), built
as bf16, q4_0, int4:g128, w8a8 and for CUDA, each under 3 GiB; then the time to the first
token of a cold bf16 plan with and without --preload.

usage: test_build_memory.py INFC INFERRT FIXTURES TMP [--slow]
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elib import check, done  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GiB = 1 << 30


def run_rss(cmd):
    """(exit status, peak RSS in bytes, seconds, stderr) of one process."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read().decode(errors="replace")
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, ru.ru_maxrss * 1024, time.monotonic() - t0, err


def sanitized(binary):
    """An AddressSanitizer build: its allocator keeps up to 256 MiB of freed blocks in
    quarantine, and shadow memory besides."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    except OSError:
        return False
    return "libasan" in out


def checkpoint_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
               if f.endswith(".safetensors"))


def drop_cache(path):
    """Evicts a file's pages from the page cache (clean pages: no privilege needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def build_all(infc, ck, tmp, variants, bound):
    size = checkpoint_bytes(ck)
    print("checkpoint: %.2f GB" % (size / 1e9))
    plans = {}
    for name, args in variants:
        plan = os.path.join(tmp, "bm-%s.plan" % name)
        rc, rss, secs, err = run_rss([infc, "build", ck, "-o", plan, "-q", "--max-context",
                                      "8192"] + args)
        print("build %-10s %6.1f s  peak RSS %7.1f MiB  plan %.2f GB" %
              (name, secs, rss / 2**20, os.path.getsize(plan) / 1e9 if rc == 0 else 0))
        check("build %s" % name, rc == 0, err[-400:])
        check("build %s peak RSS under %.0f MiB" % (name, bound / 2**20), rss < bound,
              "%.1f MiB" % (rss / 2**20))
        if rc == 0 and name == "bf16":
            plans[name] = plan  # run below
        elif os.path.exists(plan):
            os.remove(plan)  # a few GB each: one at a time on the disk
    return plans


def generate(inferrt, plan, extra):
    """(process, its JSON, seconds to the first token from the start) of a greedy 4-token
    generation from a 4-token prompt."""
    cmd = [inferrt, "generate", plan, "--prompt-ids", "1,2,3,4", "-n", "4", "--json"]
    p = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=1800)
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
        t = out["timings"]
        first = (t["load_ms"] + 4000.0 / t["prefill_tokens_per_s"]) / 1000.0
    except (ValueError, IndexError, KeyError, ZeroDivisionError):
        out, first = {}, float("nan")
    return p, out, first


def main():
    infc, inferrt, _fixtures, tmp = sys.argv[1:5]
    slow = "--slow" in sys.argv[5:]
    os.makedirs(tmp, exist_ok=True)
    ck = os.path.join(tmp, "bm-ck-8b" if slow else "bm-ck-1b")
    shutil.rmtree(ck, ignore_errors=True)
    gen = [sys.executable, os.path.join(ROOT, "tools", "gen-checkpoint"), "-o", ck]
    gen += ["--preset", "llama-3.1-8b"] if slow else ["--preset", "llama-3.2-1b", "--layers", "4"]
    subprocess.run(gen, check=True)
    if slow:
        variants = [("bf16", []), ("q4_0", ["--quant", "q4_0"]),
                    ("int4-g128", ["--quant", "int4:g128"]), ("w8a8", ["--quant", "w8a8"])]
        if shutil.which("nvcc") or os.path.exists("/usr/local/cuda"):
            variants.append(("cuda", ["--target", "cuda"]))
        bound = 3 * GiB
    else:
        variants = [("bf16", []), ("f16", ["--dtype", "f16"]), ("q4_0", ["--quant", "q4_0"]),
                    ("int8", ["--quant", "int8:g128:asym"]), ("tp2", ["--tp", "2"])]
        # the checkpoint is 1 GB: a build that held it would exceed either bound
        bound = (768 if sanitized(infc) else 256) << 20
    plans = build_all(infc, ck, tmp, variants, bound)
    shutil.rmtree(ck, ignore_errors=True)
    bf16 = plans.get("bf16")
    if bf16:
        # the plan runs, cold and preloaded; the tokens are the same either way
        runs = {}
        for name, extra in (("cold", []), ("wait", ["--preload=wait"]),
                            ("background", ["--preload"]), ("warm", [])):
            if name != "warm":
                drop_cache(bf16)
            runs[name] = generate(inferrt, bf16, extra)
            p, out, first = runs[name]
            check("generate (%s)" % name, p.returncode == 0 and out.get("generated_ids"),
                  p.stderr[-300:])
            print("first token, %-10s page cache %s: %6.2f s (load %.2f s)" %
                  (name, "warm" if name == "warm" else "cold", first,
                   out.get("timings", {}).get("load_ms", float("nan")) / 1000.0))
        ids = [r[1].get("generated_ids") for r in runs.values()]
        check("the same tokens with and without preload", all(i == ids[0] for i in ids), ids)
        check("--preload=wait says what it read", "preload:" in runs["wait"][0].stderr,
              runs["wait"][0].stderr[-300:])
    for p in plans.values():
        os.remove(p)
    done("test_build_memory" + (" --slow" if slow else ""))


if __name__ == "__main__":
    main()
