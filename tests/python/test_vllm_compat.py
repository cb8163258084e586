"""A script written for vLLM's offline API (vllm_offline_script.py) runs unchanged except
its imports, on SmolLM2; its greedy and chat results equal the inferrt CLI's."""
import json
import os
import re
import subprocess
import sys

from conftest import ROOT, run_cli

HERE = os.path.dirname(os.path.abspath(__file__))


def test_vllm_script_runs_unchanged(smollm2_plan, tmp_path):
    src = open(os.path.join(HERE, "vllm_offline_script.py"), encoding="utf-8").read()
    ported = re.sub(r"^(from|import) vllm\b", r"\1 inferrt", src, flags=re.M)
    changed = [(a, b) for a, b in zip(src.splitlines(), ported.splitlines()) if a != b]
    assert changed and all(a.startswith(("from vllm", "import vllm")) for a, _ in changed)
    script = tmp_path / "ported.py"
    script.write_text(ported, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, str(script), smollm2_plan], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])

    assert len(res["sampled"]) == 4
    assert all(s["text"] and s["finish_reason"] in ("stop", "length") for s in res["sampled"])
    assert "Processed prompts" in r.stderr  # vLLM's progress bar

    cli = json.loads(run_cli("generate", smollm2_plan, "--prompt", "The capital of France is",
                             "-n", 16, "--json"))
    assert res["greedy"]["ids"] == cli["generated_ids"]
    assert res["greedy"]["text"] == cli["text"]
    assert res["greedy"]["n_lp"] and all(2 <= n <= 3 for n in res["greedy"]["n_lp"])
    assert res["tokens"] == cli["prompt_ids"]
    assert res["roundtrip"] == "The capital of France is"

    chat = json.loads(run_cli("generate", smollm2_plan, "--system", "You are a helpful assistant",
                              "--chat", "Write a one-line poem about the sea.", "-n", 32, "--json"))
    assert res["chat"]["prompt_ids"] == chat["prompt_ids"]
    assert res["chat"]["text"] == chat["text"]
    assert res["template"].endswith("<|im_start|>assistant\n")

    assert res["choice"] in ("Positive", "Negative")
    car = json.loads(res["json"])
    assert isinstance(car["brand"], str) and len(car["brand"]) <= 12
    assert isinstance(car["year"], int)
    assert len(res["n"]) == 4 and len({tuple(x) for x in res["n"]}) > 1
