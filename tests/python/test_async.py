"""AsyncLLM: streamed deltas add up to what LLM.generate returns (itself checked against
transformers in test_llm.py); concurrent streams, abort and early exit cancel cleanly."""
import asyncio

import pytest

import inferrt
from inferrt import RequestOutputKind, SamplingParams


@pytest.fixture(scope="module")
def engine(text_plan):
    e = inferrt.AsyncLLM(text_plan, kv_tokens=16384)
    yield e
    e.shutdown()


def run(coro):
    return asyncio.run(coro)


def test_delta_stream_equals_generate(engine, text_llm, oracle):
    case = oracle[1]
    n = len(case["generated_ids"])
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                        output_kind=RequestOutputKind.DELTA)

    async def go():
        text, ids, outs = "", [], 0
        async for out in engine.generate(case["prompt"], sp, "r1"):
            outs += 1
            assert out.request_id == "r1"
            text += out.outputs[0].text
            ids += out.outputs[0].token_ids
            last = out
        return text, ids, outs, last

    text, ids, outs, last = run(go())
    assert ids == case["generated_ids"] and text == case["text"]
    # deltas that arrive while the consumer is busy come merged into one output (as vLLM's
    # do), so how many outputs there are depends on timing; the abort test below needs
    # outputs before the end
    assert 1 <= outs <= n and last.finished and last.outputs[0].finish_reason == "length"


def test_cumulative_and_final_only(engine):
    async def collect(kind):
        sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, output_kind=kind)
        return [o async for o in engine.generate("Hello", sp)]

    cum = run(collect(RequestOutputKind.CUMULATIVE))
    fin = run(collect(RequestOutputKind.FINAL_ONLY))
    assert len(fin) == 1 and fin[0].finished
    assert cum[-1].outputs[0].token_ids == fin[0].outputs[0].token_ids
    lens = [len(o.outputs[0].token_ids) for o in cum]
    assert lens == sorted(lens) and lens[-1] == 10


def test_concurrent_streams(engine, text_llm):
    prompts = ["stream %d" % i for i in range(16)]
    want = [o.outputs[0].token_ids for o in
            text_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                              use_tqdm=False)]

    async def one(p):
        sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
        ids = []
        async for o in engine.generate(p, sp):
            ids += o.outputs[0].token_ids
        return ids

    async def go():
        return await asyncio.gather(*[one(p) for p in prompts])

    assert run(go()) == want


def test_abort_and_early_exit(engine):
    async def go():
        sp = SamplingParams(temperature=0, max_tokens=10000, ignore_eos=True)
        last = None
        async for o in engine.generate([5] * 4, sp, "long"):
            last = o
            if len(o.outputs[0].token_ids) >= 3:
                await engine.abort("long")
        assert last.finished and last.outputs[0].finish_reason == "abort"
        assert len(last.outputs[0].token_ids) < 10000
        # leaving the loop early cancels the request
        async for o in engine.generate([6] * 4, sp, "left"):
            break
        with pytest.raises(ValueError, match="already running"):
            async for _ in engine.generate("x", sp, "dup-a"):
                async for _ in engine.generate("x", sp, "dup-a"):
                    pass
        await asyncio.sleep(0.2)
        return engine._engine.stats()

    st = run(go())
    assert st["running"] == 0 and st["waiting"] == 0


def test_errors_raise(engine):
    async def go():
        async for _ in engine.generate([[1, 2]][0] + [10 ** 7]):
            pass

    with pytest.raises(ValueError, match="vocabulary"):
        run(go())
