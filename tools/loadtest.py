#!/usr/bin/env python3
"""loadtest: a bounded closed-loop load test of `inferrt serve` on loopback.

Sends --requests requests from --concurrency client threads (each keeps one request in
flight) and reports requests/s, output tokens/s, and latency / time-to-first-token
percentiles. Bounded in count and in time (--time-limit): it stops by itself. Standard
library only. Either point it at a running server (--url, loopback only) or let it start
one (--plan and --inferrt; stopped at the end).

  tools/loadtest.py --plan model.plan --inferrt build/inferrt --requests 200 --concurrency 16
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse


def percentile(xs, p):
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def dist(xs):
    return {"p50": percentile(xs, 50), "p90": percentile(xs, 90), "p99": percentile(xs, 99),
            "mean": sum(xs) / len(xs) if xs else 0.0, "max": max(xs) if xs else 0.0}


def one_request(host, port, a, i):
    """(status, latency_s, ttft_s or None, output tokens) of one request."""
    body = {"prompt": f"Request {i}: {a.prompt}", "max_tokens": a.max_tokens, "temperature": a.temperature,
            "ignore_eos": True, "stream": a.stream}
    if a.stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = f"Bearer {a.api_key}"
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=a.time_limit)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
        r = c.getresponse()
        ttft, tokens = None, 0
        if r.status != 200:
            r.read()
            return r.status, time.perf_counter() - t0, None, 0
        if not a.stream:
            tokens = json.loads(r.read())["usage"]["completion_tokens"]
        else:
            for line in r:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                o = json.loads(line[6:])
                if ttft is None and o.get("choices") and o["choices"][0].get("text"):
                    ttft = time.perf_counter() - t0
                if o.get("usage"):
                    tokens = o["usage"]["completion_tokens"]
        return 200, time.perf_counter() - t0, ttft, tokens
    finally:
        c.close()


def drive(host, port, a):
    lock = threading.Lock()
    state = {"next": 0, "results": [], "errors": []}
    deadline = time.monotonic() + a.time_limit

    def worker():
        while time.monotonic() < deadline:
            with lock:
                i = state["next"]
                if i >= a.requests:
                    return
                state["next"] += 1
            try:
                res = one_request(host, port, a, i)
            except Exception as e:  # noqa: BLE001 - count and carry on
                with lock:
                    state["errors"].append(repr(e))
                continue
            with lock:
                state["results"].append(res)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 5)
    wall = time.perf_counter() - t0
    res = state["results"]
    ok = [r for r in res if r[0] == 200]
    statuses = {}
    for r in res:
        statuses[str(r[0])] = statuses.get(str(r[0]), 0) + 1
    out_tokens = sum(r[3] for r in ok)
    return {
        "requests": a.requests, "concurrency": a.concurrency, "stream": a.stream, "max_tokens": a.max_tokens,
        "ok": len(ok), "statuses": statuses, "errors": len(state["errors"]), "duration_s": wall,
        "timed_out": len(res) + len(state["errors"]) < a.requests,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "output_tokens_per_s": out_tokens / wall if wall > 0 else 0.0,
        "latency_ms": {k: v * 1e3 for k, v in dist([r[1] for r in ok]).items()},
        "ttft_ms": {k: v * 1e3 for k, v in dist([r[2] for r in ok if r[2] is not None]).items()} if a.stream else None,
        "first_errors": state["errors"][:3],
    }


def start_server(a):
    cmd = [a.inferrt, "serve", a.plan, "--port", "0", "--kv-tokens", str(a.kv_tokens)]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    import ctypes  # the server gets SIGTERM if this script dies (PR_SET_PDEATHSIG)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: ctypes.CDLL(None).prctl(1, signal.SIGTERM))
    line = p.stderr.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not m:
        p.kill()
        sys.exit(f"loadtest: the server did not start: {line}")
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    return p, int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server on loopback, e.g. http://127.0.0.1:8000")
    ap.add_argument("--plan", help="start `inferrt serve PLAN` on a free port for the run")
    ap.add_argument("--inferrt", default=os.path.join(os.path.dirname(__file__), "..", "build", "inferrt"))
    ap.add_argument("--threads", type=int, default=0, help="server CPU threads (with --plan)")
    ap.add_argument("--kv-tokens", type=int, default=32768, help="server KV capacity (with --plan)")
    ap.add_argument("--api-key")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompt", default="Once upon a time, in a land far away,")
    ap.add_argument("--no-stream", dest="stream", action="store_false", help="plain JSON responses")
    ap.add_argument("--time-limit", type=float, default=120.0, help="stop after this many seconds")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.requests < 1 or a.requests > 100000 or a.concurrency < 1 or a.concurrency > 1024:
        sys.exit("loadtest: --requests must be 1..100000 and --concurrency 1..1024")
    proc = None
    if a.plan:
        proc, port = start_server(a)
        host = "127.0.0.1"
    elif a.url:
        u = urlparse(a.url)
        host, port = u.hostname, u.port or 80
        if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("127."):
            sys.exit("loadtest: only loopback servers are load-tested")
    else:
        sys.exit("loadtest: give --url or --plan")
    try:
        rep = drive(host, port, a)
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    if a.json:
        print(json.dumps(rep))
    else:
        print(f"requests     {rep['ok']}/{rep['requests']} ok at concurrency {rep['concurrency']} in "
              f"{rep['duration_s']:.2f} s; statuses {rep['statuses']}, {rep['errors']} errors")
        print(f"throughput   {rep['requests_per_s']:.1f} req/s, {rep['output_tokens_per_s']:.0f} output tok/s")
        for key in ("latency_ms", "ttft_ms"):
            d = rep[key]
            if d:
                print(f"{key:<12} p50 {d['p50']:7.1f}  p90 {d['p90']:7.1f}  p99 {d['p99']:7.1f}  "
                      f"mean {d['mean']:7.1f}  max {d['max']:7.1f}")
    return 0 if rep["ok"] == rep["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
