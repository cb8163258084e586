"""`pip install ./python` builds the engine and installs a package that works on its own:
its own libinferrt.so and infc, from any directory, without the source tree's build."""
import os
import subprocess
import sys

from conftest import FIX, ROOT


def test_pip_install(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("INFERRT_") and k not in ("PYTHONPATH", "PIP_BREAK_SYSTEM_PACKAGES")}
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        os.path.join(ROOT, "python")], capture_output=True, text=True,
                       timeout=1200, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    code = """
import json, os, sys, inferrt
from inferrt import _lib, build
here = os.path.dirname(inferrt.__file__)
assert _lib.load().path.startswith(here), _lib.load().path
from inferrt.build import infc_path
assert infc_path().startswith(here), infc_path()
plan = inferrt.build(sys.argv[1], sys.argv[2], quiet=True)
llm = inferrt.LLM(plan)
case = json.load(open(sys.argv[3], encoding="utf-8"))["cases"][0]
out = llm.generate(case["prompt"], inferrt.SamplingParams(temperature=0, max_tokens=24,
                   ignore_eos=True), use_tqdm=False)[0]
assert out.outputs[0].token_ids == case["generated_ids"], out
print("ok", inferrt.__version__)
"""
    r = subprocess.run([py, "-c", code, os.path.join(FIX, "llama-text"), str(tmp_path / "t.plan"),
                        os.path.join(FIX, "llama-text", "oracle.json")], capture_output=True,
                       text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]
