#!/usr/bin/env python3
"""Serving replicas behind an existing load balancer: two `inferrt serve` processes of one
plan behind nginx (Debian's, round robin, as docs/SERVING.md configures it), driven by the
openai client through nginx: every answer equals a replica's own (greedy), streams pass
through whole, and each replica took its share (its /metrics).
usage: test_replicas.py INFC INFERRT FIXTURES TMP
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request

from openai import OpenAI
from elib import check, done, free_port, wait_health

INFC, INFERRT, FIX, TMP = sys.argv[1:5]
TMP = os.path.join(TMP, "replicas")
os.makedirs(TMP, exist_ok=True)
def wait_up(port, proc, what):
    up = wait_health(port, proc)
    check("%s is up" % what, up, proc.stderr.read().decode()[-500:] if proc.poll() else "")
    return up


def requests_served(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as f:
        text = f.read().decode()
    return sum(float(v) for v in re.findall(
        r'inferrt_requests_total\{endpoint="/v1/completions"[^}]*\} ([\d.e+]+)', text))


NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
if not NGINX:
    print("FAIL: nginx is missing (tools/bootstrap installs nginx-light)", file=sys.stderr)
    sys.exit(1)
plan = os.path.join(TMP, "text.plan")
r = subprocess.run([INFC, "build", os.path.join(FIX, "llama-text"), "-o", plan, "-q"],
                   capture_output=True, text=True)
check("build", r.returncode == 0, r.stderr)
ports = [free_port(), free_port()]
reps = [subprocess.Popen([INFERRT, "serve", plan, "--port", str(p), "--model-name", "m",
                          "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for p in ports]
lb = free_port()
conf = os.path.join(TMP, "nginx.conf")
with open(conf, "w") as f:
    f.write("""pid %(tmp)s/nginx.pid;
error_log %(tmp)s/error.log;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %(tmp)s/body;
  proxy_temp_path %(tmp)s/proxy;
  fastcgi_temp_path %(tmp)s/fastcgi;
  uwsgi_temp_path %(tmp)s/uwsgi;
  scgi_temp_path %(tmp)s/scgi;
  upstream inferrt { server 127.0.0.1:%(a)d; server 127.0.0.1:%(b)d; }
  server {
    listen 127.0.0.1:%(lb)d;
    location / {
      proxy_pass http://inferrt;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 3600s;
    }
  }
}
""" % {"tmp": TMP, "a": ports[0], "b": ports[1], "lb": lb})
ng = subprocess.Popen([NGINX, "-p", TMP, "-c", conf, "-g", "daemon off;"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
ok = all(wait_up(p, proc, "replica %d" % i) for i, (p, proc) in enumerate(zip(ports, reps)))
ok = ok and wait_up(lb, ng, "nginx")
if ok:
    direct = OpenAI(base_url="http://127.0.0.1:%d/v1" % ports[0], api_key="x")
    prompts = ["Once upon a time %d" % i for i in range(8)]
    want = [direct.completions.create(model="m", prompt=p, max_tokens=12, temperature=0)
            .choices[0].text for p in prompts]
    before = [requests_served(p) for p in ports]
    client = OpenAI(base_url="http://127.0.0.1:%d/v1" % lb, api_key="x")
    got = [client.completions.create(model="m", prompt=p, max_tokens=12, temperature=0)
           .choices[0].text for p in prompts]
    check("through nginx = a replica's answer", got == want, "%s\n%s" % (got, want))
    after = [requests_served(p) for p in ports]
    share = [a - b for a, b in zip(after, before)]
    check("each replica took its share", share == [4, 4], str(share))
    stream = client.chat.completions.create(model="m", messages=[{"role": "user",
                                                                  "content": "Hi"}],
                                            max_tokens=12, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    whole = direct.chat.completions.create(model="m", messages=[{"role": "user",
                                                                 "content": "Hi"}],
                                           max_tokens=12, temperature=0)
    check("a stream through nginx = the whole answer", text == whole.choices[0].message.content,
          "%r vs %r" % (text, whole.choices[0].message.content))
for proc in reps + [ng]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM if proc is not ng else signal.SIGQUIT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
done("replicas")
