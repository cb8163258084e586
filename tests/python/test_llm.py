"""LLM.generate / LLM.chat / the tokenizer against external oracles: transformers' greedy
tokens and chat prompts (tests/fixtures/llama-text/oracle.json), HF tokenizers, the
`inferrt generate` CLI on the same plan, and Python's re / json for structured output."""
import json
import os
import re

import pytest

import inferrt
from inferrt import GuidedDecodingParams, SamplingParams, StructuredOutputsParams
from conftest import FIX, run_cli


def greedy(n, **kw):
    return SamplingParams(temperature=0, max_tokens=n, **kw)


def test_greedy_matches_transformers(text_llm, oracle):
    cases = [c for c in oracle if "prompt" in c]
    outs = text_llm.generate([c["prompt"] for c in cases],
                             [greedy(len(c["generated_ids"]), ignore_eos=True) for c in cases],
                             use_tqdm=False)
    assert len(outs) == len(cases)
    for c, o in zip(cases, outs):
        assert o.prompt == c["prompt"]
        assert o.prompt_token_ids == c["prompt_ids"]
        assert o.outputs[0].token_ids == c["generated_ids"]
        assert o.outputs[0].text == c["text"]
        assert o.outputs[0].finish_reason == "length"
        assert o.finished


def test_chat_matches_transformers(text_llm, oracle):
    cases = [c for c in oracle if "chat" in c]
    assert cases
    outs = text_llm.chat([c["chat"] for c in cases],
                         [greedy(len(c["generated_ids"]), ignore_eos=True) for c in cases],
                         use_tqdm=False)
    tok = text_llm.get_tokenizer()
    for c, o in zip(cases, outs):
        assert o.prompt_token_ids == c["prompt_ids"]
        assert tok.apply_chat_template(c["chat"], add_generation_prompt=True) == c["prompt_ids"]
        assert o.outputs[0].token_ids == c["generated_ids"]
        assert o.outputs[0].text == c["text"]


def test_greedy_matches_cli(text_plan, text_llm):
    prompts = ["Hello", "A B C D", "1 2 3 4 5"]
    outs = text_llm.generate(prompts, greedy(20), use_tqdm=False)
    for p, o in zip(prompts, outs):
        cli = json.loads(run_cli("generate", text_plan, "--prompt", p, "-n", 20, "--json"))
        assert o.prompt_token_ids == cli["prompt_ids"]
        assert o.outputs[0].token_ids == cli["generated_ids"]
        assert o.outputs[0].text == cli["text"]
        assert o.outputs[0].finish_reason == cli["finish_reason"]


def test_one_call_batches_like_single_requests(text_llm):
    """All prompts go through the engine at once; the engine is batch-invariant, so each
    equals its own run alone."""
    prompts = ["prompt %d: %s" % (i, "x " * (i % 7)) for i in range(40)]
    before = text_llm.stats()["steps"]
    together = text_llm.generate(prompts, greedy(12), use_tqdm=False)
    steps = text_llm.stats()["steps"] - before
    alone = [text_llm.generate(p, greedy(12), use_tqdm=False)[0] for p in prompts[:5]]
    for a, b in zip(alone, together):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    # 40 requests of 12 tokens in about 12 steps, not 40 x 12: they ran together
    assert steps <= 3 * 12, steps


def test_token_id_prompts_and_order(text_llm):
    outs = text_llm.generate([{"prompt_token_ids": [5, 6, 7]}, [8, 9], {"prompt": "hi"}],
                             greedy(4), use_tqdm=False)
    assert [o.prompt_token_ids for o in outs][:2] == [[5, 6, 7], [8, 9]]
    assert outs[0].prompt is None and outs[2].prompt == "hi"
    single = text_llm.generate([5, 6, 7], greedy(4), use_tqdm=False)
    assert single[0].outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_seeded_sampling_reproducible(text_llm):
    sp = SamplingParams(n=3, temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    a = text_llm.generate("Once upon", sp, use_tqdm=False)[0]
    b = text_llm.generate("Once upon", sp, use_tqdm=False)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert [c.index for c in a.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1  # three different draws
    # completion i is the n=1 request with seed + i
    for i in range(3):
        one = text_llm.generate("Once upon", SamplingParams(temperature=1.0, top_p=0.9,
                                seed=1234 + i, max_tokens=16, ignore_eos=True),
                                use_tqdm=False)[0]
        assert one.outputs[0].token_ids == a.outputs[i].token_ids


def test_sampling_matches_cli(text_plan, text_llm):
    o = text_llm.generate("The quick", SamplingParams(temperature=0.8, top_k=40, top_p=0.95,
                          seed=7, max_tokens=16, ignore_eos=True), use_tqdm=False)[0]
    cli = json.loads(run_cli("generate", text_plan, "--prompt", "The quick", "-n", 16,
                             "--temperature", 0.8, "--top-k", 40, "--top-p", 0.95, "--seed", 7,
                             "--ignore-eos", "--json"))
    assert o.outputs[0].token_ids == cli["generated_ids"]


def test_logprobs(text_llm):
    o = text_llm.generate("The quick brown", greedy(8, logprobs=5, prompt_logprobs=3),
                          use_tqdm=False)[0]
    c = o.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 8
    total = 0.0
    for tok, lp in zip(c.token_ids, c.logprobs):
        assert tok in lp and lp[tok].rank == 1  # greedy: the likeliest
        assert 5 <= len(lp) <= 6
        ranked = sorted((v.rank, v.logprob) for v in lp.values())
        assert all(x[1] >= y[1] for x, y in zip(ranked, ranked[1:]))
        assert all(v.logprob <= 0 for v in lp.values())
        total += lp[tok].logprob
    assert c.cumulative_logprob == pytest.approx(total, abs=1e-4)
    assert o.prompt_logprobs[0] is None
    assert len(o.prompt_logprobs) == len(o.prompt_token_ids)
    for tok, lp in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:]):
        assert tok in lp and len(lp) <= 4


def test_stops(text_llm, oracle):
    case = oracle[0]
    stop = case["text"][5:9]
    o = text_llm.generate(case["prompt"], greedy(24, ignore_eos=True, stop=stop),
                          use_tqdm=False)[0].outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop
    assert o.text == case["text"][:case["text"].find(stop)]
    o = text_llm.generate(case["prompt"], greedy(24, ignore_eos=True, stop=[stop],
                          include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert o.text == case["text"][:case["text"].find(stop) + len(stop)]
    tid = case["generated_ids"][3]
    o = text_llm.generate(case["prompt"], greedy(24, ignore_eos=True, stop_token_ids=[tid]),
                          use_tqdm=False)[0].outputs[0]
    assert o.token_ids == case["generated_ids"][:4] and o.stop_reason == tid
    assert o.finish_reason == "stop"


def test_structured_outputs(text_llm):
    schema = {"type": "object", "properties": {"a": {"type": "integer"},
              "b": {"type": "string", "enum": ["x", "y"]}}, "required": ["a", "b"],
              "additionalProperties": False}
    sp = [SamplingParams(temperature=1.0, seed=s, max_tokens=64,
                         structured_outputs=StructuredOutputsParams(json=schema))
          for s in range(4)]
    for o in text_llm.generate(["Give JSON:"] * 4, sp, use_tqdm=False):
        c = o.outputs[0]
        assert c.finish_reason == "stop", c
        v = json.loads(c.text)
        assert isinstance(v["a"], int) and v["b"] in ("x", "y") and set(v) == {"a", "b"}
    choice = ["red", "green", "blue"]
    o = text_llm.generate("Color:", SamplingParams(temperature=1.0, seed=3, max_tokens=8,
                          guided_decoding=GuidedDecodingParams(choice=choice)), use_tqdm=False)
    assert o[0].outputs[0].text in choice
    rx = r"\d{3}-[a-c]{2}"
    o = text_llm.generate("Code:", SamplingParams(temperature=1.0, seed=5, max_tokens=16,
                          structured_outputs=StructuredOutputsParams(regex=rx)), use_tqdm=False)
    assert re.fullmatch(rx, o[0].outputs[0].text)
    g = 'root ::= "yes" | "no"'
    o = text_llm.generate("Answer:", SamplingParams(temperature=1.0, seed=1, max_tokens=8,
                          structured_outputs=StructuredOutputsParams(grammar=g)), use_tqdm=False)
    assert o[0].outputs[0].text in ("yes", "no")
    o = text_llm.generate("Obj:", SamplingParams(temperature=1.0, seed=2, max_tokens=48,
                          structured_outputs=StructuredOutputsParams(json_object=True)),
                          use_tqdm=False)
    if o[0].outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(o[0].outputs[0].text), dict)


def test_tokenizer_matches_hf(text_llm, oracle):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(os.path.join(FIX, "llama-text", "tokenizer.json"))
    tok = text_llm.get_tokenizer()
    for text in ["The quick brown fox", "héllo wörld 日本語", "  spaces\n\nand\ttabs", ""]:
        assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False).ids
        ids = tok.encode(text)
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    for c in oracle:
        if "prompt" in c:
            assert tok.encode(c["prompt"]) == c["prompt_ids"]
            assert tok(c["prompt"])["input_ids"] == c["prompt_ids"]
    assert len(tok) == hf.get_vocab_size()
    assert tok.eos_token_id == 0


def test_smollm2_chat(smollm2_plan):
    """The real model: chat equals `inferrt generate --chat`, and thinks nothing odd."""
    with inferrt.LLM(smollm2_plan) as llm:
        msgs = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is the capital of France?"}]
        o = llm.chat(msgs, greedy(24), use_tqdm=False)[0]
        cli = json.loads(run_cli("generate", smollm2_plan, "--system", "Be brief.", "--chat",
                                 "What is the capital of France?", "-n", 24, "--json"))
        assert o.prompt_token_ids == cli["prompt_ids"]
        assert o.outputs[0].token_ids == cli["generated_ids"]
        assert o.outputs[0].text == cli["text"]
        assert "Paris" in o.outputs[0].text
        assert o.outputs[0].finish_reason == "stop"
        # a list of conversations, content as OpenAI parts
        two = llm.chat([msgs, [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]],
                       greedy(8), use_tqdm=False)
        assert len(two) == 2 and two[0].outputs[0].token_ids == o.outputs[0].token_ids[:8]
        text = llm.get_tokenizer().apply_chat_template(msgs, tokenize=False,
                                                       add_generation_prompt=True)
        assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
        assert text.endswith("<|im_start|>assistant\n")



def test_gil_released(text_llm):
    """The wait on the engine's events releases the GIL: while the main thread waits (up to
    a minute) on an idle engine, another Python thread runs and ends the wait with wake()."""
    import threading
    import time
    eng = text_llm._engine
    ran = threading.Event()

    def waker():
        time.sleep(0.2)  # let the main thread enter the wait
        ran.set()
        eng.wake()

    th = threading.Thread(target=waker)
    th.start()
    t = time.monotonic()
    events = eng.take(60000)
    waited = time.monotonic() - t
    th.join()
    # holding the GIL, the wait would last its whole minute before the waker could run
    assert events == [] and ran.is_set() and waited < 30, waited


@pytest.mark.parametrize("preload", ["wait", "background"])
def test_preload_same_tokens_as_transformers(text_plan, oracle, preload):
    """LLM(preload=...) reads the weights at open; the greedy tokens stay transformers'."""
    c = next(c for c in oracle if "prompt" in c)
    llm = inferrt.LLM(text_plan, kv_tokens=4096, preload=preload)
    try:
        out = llm.generate([c["prompt"]], greedy(len(c["generated_ids"]), ignore_eos=True),
                           use_tqdm=False)
        assert out[0].outputs[0].token_ids == c["generated_ids"]
    finally:
        llm.close()


def test_preload_refuses_unknown_mode(text_plan):
    with pytest.raises(ValueError, match="preload"):
        inferrt.LLM(text_plan, preload="eager")


def test_draft_model_greedy_matches_transformers(text_plan, oracle, tmp_path):
    """speculative_config with a draft plan (the target's own q8_0 build): the greedy tokens
    stay transformers', with drafts proposed and kept; sampled requests still complete."""
    draft = inferrt.build(os.path.join(FIX, "llama-text"), tmp_path / "draft.plan", quant="q8_0",
                          quiet=True)
    cases = [c for c in oracle if "prompt" in c]
    llm = inferrt.LLM(text_plan, kv_tokens=4096,
                      speculative_config={"model": str(draft), "num_speculative_tokens": 3})
    try:
        outs = llm.generate([c["prompt"] for c in cases],
                            [greedy(len(c["generated_ids"]), ignore_eos=True) for c in cases],
                            use_tqdm=False)
        for c, o in zip(cases, outs):
            assert o.outputs[0].token_ids == c["generated_ids"]
        sampled = llm.generate([cases[0]["prompt"]],
                               SamplingParams(temperature=0.8, seed=3, max_tokens=12,
                                              ignore_eos=True), use_tqdm=False)
        assert len(sampled[0].outputs[0].token_ids) == 12
        st = llm.stats()
        assert st["spec_draft_tokens"] > 0 and st["spec_accepted_tokens"] > 0, st
    finally:
        llm.close()


def test_draft_model_vocabulary_mismatch(text_plan, tmp_path):
    other = inferrt.build(os.path.join(FIX, "llama-gqa-f32"), tmp_path / "other.plan", quiet=True)
    with pytest.raises(Exception, match="vocabulary"):
        inferrt.LLM(text_plan, speculative_config={"model": str(other)})


def test_best_of(text_llm):
    """best_of > n: the candidates are those of n = best_of with the same seed; the n with the
    highest cumulative logprob come back, best first."""
    prompt = "The sea"
    kw = dict(temperature=1.0, seed=21, max_tokens=8, ignore_eos=True)
    cands = text_llm.generate([prompt], SamplingParams(n=5, logprobs=0, **kw),
                              use_tqdm=False)[0].outputs
    ranked = sorted(cands, key=lambda c: (-c.cumulative_logprob, c.index))
    best = text_llm.generate([prompt], SamplingParams(n=2, best_of=5, **kw),
                             use_tqdm=False)[0].outputs
    assert [c.token_ids for c in best] == [c.token_ids for c in ranked[:2]]
    assert [c.index for c in best] == [0, 1]
    assert best[0].cumulative_logprob >= best[1].cumulative_logprob
    assert abs(best[0].cumulative_logprob - ranked[0].cumulative_logprob) < 1e-3
