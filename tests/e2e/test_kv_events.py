#!/usr/bin/env python3
"""inferrt serve --kv-events: the prefix cache's events over ZeroMQ in vLLM's KV-events
format, read by a pyzmq subscriber and decoded with msgpack as vLLM's own subscriber
example reads them ([topic, 8-byte big-endian sequence, [ts, [events]]], events tagged
"BlockStored" / "BlockRemoved"), and checked against what the server did:

- a prompt's full blocks are stored as one hash chain (each parent the previous block's
  hash, the first none) holding exactly the prompt's tokens, block_size each;
- a small cache evicts: every removed hash was stored before, and after the requests end
  the blocks stored and not removed are the cache's cached blocks (/metrics);
- the same prompt again reuses the cache (cached prompt tokens in usage);
- sequence numbers run 0, 1, 2, ... without gaps.
usage: test_kv_events.py INFC INFERRT FIXTURES TMP
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import msgpack
import zmq
from elib import check, done, free_port, wait_health

INFC, INFERRT, FIX, TMP = sys.argv[1:5]
TMP = os.path.join(TMP, "kv_events")
os.makedirs(TMP, exist_ok=True)
plan = os.path.join(TMP, "text.plan")
r = subprocess.run([INFC, "build", os.path.join(FIX, "llama-text"), "-o", plan, "-q"],
                   capture_output=True, text=True)
check("build", r.returncode == 0, r.stderr)
http, zport = free_port(), free_port()
BS = 16
srv = subprocess.Popen([INFERRT, "serve", plan, "--port", str(http), "--model-name", "m",
                        "--threads", "1", "--kv-tokens", str(16 * BS), "--kv-events",
                        "tcp://127.0.0.1:%d" % zport], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.connect("tcp://127.0.0.1:%d" % zport)
sub.setsockopt_string(zmq.SUBSCRIBE, "kv-events")


def get(path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (http, path), timeout=30) as f:
        return f.read().decode()


def complete(ids, n=1):
    body = {"model": "m", "prompt": ids, "max_tokens": n, "temperature": 0}
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % http,
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as f:
        return json.loads(f.read())


seqs, events = [], []


def drain(secs=1.0):
    end = time.time() + secs
    while time.time() < end:
        if sub.poll(50):
            topic, seq, payload = sub.recv_multipart()
            check("topic", topic == b"kv-events", topic)
            seqs.append(int.from_bytes(seq, "big"))
            batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            check("a batch is [ts, events]", isinstance(batch, list) and len(batch) >= 2 and
                  isinstance(batch[0], float) and isinstance(batch[1], list), str(batch)[:200])
            events.extend(batch[1])


check("serve is up", wait_health(http, srv), srv.stderr.read().decode() if srv.poll() is not None else "")
time.sleep(0.3)  # the subscription reaches the publisher

prompt = [(i * 7 + 3) % 2000 + 2 for i in range(70)]  # 4 full blocks and 6 tokens
complete(prompt)
drain()
stored = [e for e in events if e[0] == "BlockStored"]
check("the prompt's 4 full blocks are stored", len(stored) >= 4, str(events)[:300])
chain = stored[:4]
for k, e in enumerate(chain):
    check("BlockStored has vLLM's 7 fields", len(e) == 7, e)
    hashes, parent, toks, bs, lora, medium = e[1:7]
    check("block %d tokens" % k, toks == prompt[k * BS:(k + 1) * BS], "%s" % toks)
    check("block %d size" % k, bs == BS and lora is None and medium is None)
    check("block %d parent" % k, parent == (None if k == 0 else chain[k - 1][1][0]),
          "%s" % parent)
    check("block %d one hash" % k, len(hashes) == 1 and isinstance(hashes[0], int))

again = complete(prompt)
cached = again.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0)
check("the same prompt reuses the stored blocks", cached >= 4 * BS, str(again.get("usage")))

# more prompts than the 16-block cache holds: old blocks are evicted
for j in range(8):
    complete([(i * 13 + j * 101) % 2000 + 2 for i in range(64)])
drain()
all_stored = {e[1][0] for e in events if e[0] == "BlockStored"}
removed = [e for e in events if e[0] == "BlockRemoved"]
check("a full cache evicts", len(removed) > 0)
for e in removed:
    check("BlockRemoved has vLLM's 3 fields", len(e) == 3 and e[2] is None, e)
    check("a removed block was stored", e[1][0] in all_stored, e)
live = set()
for e in events:
    if e[0] == "BlockStored":
        live.add(e[1][0])
    elif e[0] == "BlockRemoved":
        live.discard(e[1][0])
m = re.search(r'inferrt_kv_cache_blocks\{state="cached"\} (\d+)', get("/metrics"))
check("stored - removed = the cache's cached blocks", m and int(m.group(1)) == len(live),
      "%s vs %d" % (m and m.group(1), len(live)))
check("sequence numbers 0, 1, 2, ...", seqs == list(range(len(seqs))) and seqs, str(seqs))

srv.send_signal(signal.SIGTERM)
try:
    srv.wait(timeout=30)
    check("serve stops cleanly", srv.returncode == 0, srv.returncode)
except subprocess.TimeoutExpired:
    srv.kill()
    check("serve stops", False)
sub.close()
ctx.term()

r = subprocess.run([INFERRT, "serve", plan, "--port", "0", "--kv-events", "nonsense://x"],
                   capture_output=True, text=True, timeout=60)
check("a bad endpoint is refused by name",
      r.returncode == 1 and "--kv-events nonsense://x" in r.stderr, r.stderr)
done("kv_events")
