#!/usr/bin/env python3
"""Tensor parallelism across two hosts: two network namespaces on this machine, joined by a
veth pair (10.77.R.1 and 10.77.R.2), stand for two machines. mpirun runs in the first and
starts the second host's daemon through an rsh agent (Open MPI's plm_rsh_agent) that execs
into the second namespace; MPI's traffic takes TCP over the veth (btl self,tcp, restricted
to its subnet), as it would between machines. The greedy tokens equal one rank's, and the
agent really launched the second host. Needs root (ip netns); without it, reports a skip
(exit 77).
usage: test_tp_hosts.py INFC INFERRT FIXTURES TMP
"""
import json
import os
import shutil
import subprocess
import sys
from elib import check, done, mpi_env

INFC, INFERRT, FIX, TMP = sys.argv[1:5]
TMP = os.path.join(TMP, "tp_hosts")
os.makedirs(TMP, exist_ok=True)
ENV = mpi_env()


def sh(*cmd, ok=True):
    r = subprocess.run(list(cmd), capture_output=True, text=True, env=ENV, timeout=300)
    if ok and r.returncode:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r


tag = "%d" % (os.getpid() % 10000)
nsa, nsb, va, vb = "infA" + tag, "infB" + tag, "ivA" + tag, "ivB" + tag
net = "10.77.%d" % (os.getpid() % 250 + 1)
host_a, host_b = net + ".1", net + ".2"
if os.geteuid() != 0 or not shutil.which("ip") or sh("ip", "netns", "add", nsa, ok=False).returncode:
    print("SKIP: network namespaces need root and iproute2 (ip netns)")
    sys.exit(77)
try:
    sh("ip", "netns", "add", nsb)
    sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
    sh("ip", "link", "set", va, "netns", nsa)
    sh("ip", "link", "set", vb, "netns", nsb)
    for ns, dev, ip in ((nsa, va, host_a), (nsb, vb, host_b)):
        sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    agent, log = os.path.join(TMP, "nsagent"), os.path.join(TMP, "agent.log")
    if os.path.exists(log):
        os.remove(log)
    with open(agent, "w") as f:
        f.write("#!/bin/sh\n# mpirun's rsh agent: HOST CMD... runs CMD in HOST's namespace\n"
                "host=$1; shift\necho \"$host\" >> %s\n"
                "case \"$host\" in %s) ns=%s ;; %s) ns=%s ;; *) exit 1 ;; esac\n"
                "exec ip netns exec \"$ns\" sh -c \"$*\"\n" % (log, host_a, nsa, host_b, nsb))
    os.chmod(agent, 0o755)
    t1 = os.path.join(TMP, "text-tp1.plan")
    t2 = os.path.join(TMP, "text-tp2.plan")
    sh(INFC, "build", os.path.join(FIX, "llama-text"), "-o", t1, "-q")
    sh(INFC, "build", os.path.join(FIX, "llama-text"), "-o", t2, "-q", "--tp", "2")
    gen = ["generate", "--prompt", "The quick brown fox", "-n", "24", "--ignore-eos", "--json",
           "--threads", "1"]
    one = json.loads(sh(INFERRT, gen[0], t1, *gen[1:]).stdout.strip().splitlines()[-1])
    mpi = ["ip", "netns", "exec", nsa, "mpirun", "-n", "2", "--host",
           "%s:1,%s:1" % (host_a, host_b), "--mca", "plm_rsh_agent", agent, "--mca", "btl",
           "self,tcp", "--mca", "btl_tcp_if_include", net + ".0/24", "--mca",
           "oob_tcp_if_include", net + ".0/24"]
    r = sh(*mpi, INFERRT, gen[0], t2, *gen[1:], ok=False)
    check("two hosts: the job ran", r.returncode == 0, r.stderr[-800:])
    two = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    check("two hosts: greedy tokens = one rank's",
          two.get("generated_ids") == one["generated_ids"], "%s vs %s" % (two, one))
    launched = open(log).read().split() if os.path.exists(log) else []
    check("the second host was started through its namespace", host_b in launched, launched)
    check("each rank reported its collectives", r.stderr.count("collectives") == 2, r.stderr)
    r = sh(*mpi, INFERRT, "bench", t2, "--requests", "1", "--prompt-len", "64:64",
           "--output-len", "32:32", "--threads", "1", ok=False)
    check("two hosts: bench ran", r.returncode == 0, r.stderr[-500:])
    print("tp_hosts: bench over the veth:\n" + "\n".join(
        line for line in (r.stdout + r.stderr).splitlines()
        if line.startswith(("tpot", "ttft", "inferrt: rank"))))
finally:
    sh("ip", "netns", "del", nsa, ok=False)
    sh("ip", "netns", "del", nsb, ok=False)
done("tp_hosts")
