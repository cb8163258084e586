"""Errors become Python exceptions carrying the engine's message; nothing crashes the
interpreter, and Ctrl-C cancels what is in flight and leaves the LLM usable."""
import os
import signal
import threading

import pytest

import inferrt
from inferrt import SamplingParams


def test_bad_plans(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.plan"):
        inferrt.LLM(str(tmp_path / "missing.plan"))
    junk = tmp_path / "junk.plan"
    junk.write_bytes(b"\0garbage" * 100)
    with pytest.raises(inferrt.EngineError, match="junk.plan") as e:
        inferrt.LLM(str(junk))
    assert e.value.status == "BAD_FORMAT"
    with pytest.raises(inferrt.EngineError):
        inferrt.LLM(str(tmp_path))  # a directory


def test_truncated_plan(tmp_path, text_plan):
    data = open(text_plan, "rb").read()
    cut = tmp_path / "cut.plan"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(inferrt.EngineError) as e:
        inferrt.LLM(str(cut))
    assert e.value.status in ("BAD_FORMAT", "IO")


def test_bad_params():
    for kw in [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(n=0), dict(max_tokens=0),
               dict(logprobs=21), dict(min_p=2), dict(presence_penalty=3),
               dict(repetition_penalty=0), dict(n=3, best_of=2), dict(bad_words=["x"]),
               dict(allowed_token_ids=[1]), dict(skip_special_tokens=False),
               dict(min_tokens=20, max_tokens=10), dict(stop=[""]), dict(seed=-1),
               dict(logit_bias={1: 500})]:
        with pytest.raises(ValueError):
            SamplingParams(**kw)
    with pytest.raises(ValueError, match="one of"):
        inferrt.StructuredOutputsParams(json={}, regex="a")


def test_bad_requests(text_llm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        text_llm.generate([[1, 2, 999999]], use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        text_llm.generate([[]], use_tqdm=False)
    with pytest.raises(ValueError):
        text_llm.generate([3.5], use_tqdm=False)
    with pytest.raises(ValueError, match="2 sampling params for 1"):
        text_llm.generate(["a"], [SamplingParams(), SamplingParams()], use_tqdm=False)
    # the engine's own checks: a prompt past the context, a bad grammar
    with pytest.raises(inferrt.InvalidArgument, match="context"):
        text_llm.generate([[5] * 5000], use_tqdm=False)
    bad = inferrt.StructuredOutputsParams(grammar="root ::= ( unclosed")
    with pytest.raises(inferrt.InvalidArgument):
        text_llm.generate("x", SamplingParams(structured_outputs=bad), use_tqdm=False)
    with pytest.raises(inferrt.Unsupported, match="lookbehind|lookaround|backreference"):
        text_llm.generate("x", SamplingParams(structured_outputs=inferrt.StructuredOutputsParams(
            regex=r"(?<=a)b")), use_tqdm=False)
    with pytest.raises(TypeError):
        text_llm.generate("x", nonsense=1)
    # still fine afterwards
    assert text_llm.generate("x", SamplingParams(max_tokens=2), use_tqdm=False)[0].finished


def test_bad_engine_args(text_plan):
    with pytest.raises(TypeError, match="frobnicate"):
        inferrt.LLM(text_plan, frobnicate=1)
    with pytest.raises(ValueError, match="kv_dtype"):
        inferrt.LLM(text_plan, kv_dtype="fp4")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        inferrt.LLM(text_plan, tensor_parallel_size=2)
    with pytest.raises(inferrt.EngineError, match="device"):
        inferrt.LLM(text_plan, device="tpu")
    with pytest.raises(inferrt.EngineError):
        inferrt.LLM(text_plan, chat_template="nosuchfamily")


def test_closed(text_plan):
    llm = inferrt.LLM(text_plan)
    llm.close()
    llm.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate("x", use_tqdm=False)
    with pytest.raises(RuntimeError, match="closed"):
        llm.get_tokenizer()


def test_ctrl_c_cancels(text_plan):
    llm = inferrt.LLM(text_plan, kv_tokens=65536)
    sp = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["x %d" % i for i in range(2000)], sp, use_tqdm=False)
    timer.join()
    st = llm.stats()
    assert st["running"] == 0 and st["waiting"] == 0
    assert st["generated_tokens"] < 2000 * 200  # it stopped early
    o = llm.generate("after", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(o[0].outputs[0].token_ids) == 4  # nothing of the cancelled run leaks in
    llm.close()


def test_build_errors(tmp_path):
    with pytest.raises(inferrt.BuildError) as e:
        inferrt.build(tmp_path / "nothing.gguf", tmp_path / "x.plan")
    assert "nothing.gguf" in str(e.value)
    with pytest.raises(TypeError, match="frob"):
        inferrt.build("a", "b", frob=1)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(inferrt.BuildError):
        inferrt.build(bad, tmp_path / "y.plan")
    assert not os.path.exists(tmp_path / "y.plan")
    with pytest.raises(inferrt.BuildError, match="attn_dtype"):  # the flag reaches infc
        inferrt.build(bad, tmp_path / "z.plan", attn_dtype="f8")
