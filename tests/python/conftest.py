"""Fixtures of the Python package's tests: plans built with inferrt.build from the committed
fixtures (and SmolLM2 when INFC_SMOLLM2 names its GGUF), and the inferrt CLI they are
compared with. Run by ctest (tests/CMakeLists.txt) as
    PYTHONPATH=python INFERRT_LIB=build/libinferrt.so INFERRT_INFC=build/infc \
    INFERRT_CLI=build/inferrt python3 -m pytest tests/python
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "fixtures")
sys.path.insert(0, os.path.join(ROOT, "python"))

import inferrt  # noqa: E402


def cli_path():
    p = os.environ.get("INFERRT_CLI") or os.path.join(ROOT, "build", "inferrt")
    if not os.path.isfile(p):
        pytest.fail("the inferrt CLI is missing at %s (set INFERRT_CLI)" % p)
    return p


@pytest.fixture(scope="session")
def cli():
    return cli_path()


def run_cli(*args, timeout=300):
    r = subprocess.run([cli_path()] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, "inferrt %s: %s" % (" ".join(map(str, args)), r.stderr[-500:])
    return r.stdout


@pytest.fixture(scope="session")
def text_plan(tmp_path_factory):
    """The tiny text Llama with its tokenizer and chat template (oracle: transformers)."""
    out = tmp_path_factory.mktemp("plans") / "llama-text.plan"
    return inferrt.build(os.path.join(FIX, "llama-text"), out, quiet=True)


@pytest.fixture(scope="session")
def oracle():
    with open(os.path.join(FIX, "llama-text", "oracle.json"), encoding="utf-8") as f:
        return json.load(f)["cases"]


@pytest.fixture(scope="session")
def text_llm(text_plan):
    llm = inferrt.LLM(text_plan, kv_tokens=16384)
    yield llm
    llm.close()


@pytest.fixture(scope="session")
def smollm2_plan(tmp_path_factory):
    gguf = os.environ.get("INFC_SMOLLM2")
    if not gguf or not os.path.isfile(gguf):
        pytest.skip("INFC_SMOLLM2 is not set (tools/get-smollm2 fetches SmolLM2)")
    out = tmp_path_factory.mktemp("plans") / "smollm2.plan"
    return inferrt.build(gguf, out, dtype="f32", quiet=True)
