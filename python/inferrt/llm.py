"""LLM: vLLM's offline API over a plan.

    from inferrt import LLM, SamplingParams
    llm = LLM("model.plan")
    for out in llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, top_p=0.95)):
        print(out.outputs[0].text)

Every request of one generate() call is submitted at once, and the engine's continuous
batching runs them together (its own thread, the GIL released); this thread only drains the
event queue. Ctrl-C cancels the requests in flight and raises KeyboardInterrupt.
"""
import itertools

from .engine import Engine, Request, as_params_list
from .sampling_params import SamplingParams


def _progress(total, enabled):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True,
                postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s")


class LLM:
    """A plan opened for offline generation.

    model: the plan file (`infc build` / inferrt.build). threads: CPU threads (default all
    cores). device: "auto" (the plan's target), "cpu" or "cuda". kv_dtype: "auto"/"f32",
    "f16" or "int8". kv_tokens: KV cache capacity in tokens over all requests (default one
    context length). max_num_seqs, max_num_batched_tokens: the step limits (default the
    plan's). enable_prefix_caching, enforce_eager (no CUDA graphs), chat_template (a family
    name: chatml, qwen3, llama3, ...), seed (the default seeds of requests without one),
    speculative_config ({"method": "ngram", "num_speculative_tokens": k}, or {"model": DRAFT_PLAN,
    "num_speculative_tokens": k} for a draft model with the same tokenizer) as in vLLM.
    """

    def __init__(self, model, **kwargs):
        self._engine = Engine(model, **kwargs)
        self._ids = itertools.count()

    # --- lifetime ---------------------------------------------------------------------------
    def close(self):
        self._engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def info(self):
        self._engine.check_open()
        i = self._engine.info
        return {k: (v.decode() if isinstance(v, bytes) else v)
                for k, v in ((f, getattr(i, f)) for f, _ in i._fields_)}

    def get_tokenizer(self):
        self._engine.check_open()
        if self._engine.tokenizer is None:
            raise ValueError("this plan has no tokenizer")
        return self._engine.tokenizer

    def get_default_sampling_params(self):
        return SamplingParams()

    def stats(self):
        """The engine's counters (steps, tokens, prefix-cache hits, preemptions, ...)."""
        return self._engine.stats()

    # --- generation -------------------------------------------------------------------------
    def generate(self, prompts=None, sampling_params=None, use_tqdm=True, lora_request=None,
                 prompt_token_ids=None, priority=None, **kwargs):
        """RequestOutputs of prompts (a string, token ids, a {"prompt": ...} or
        {"prompt_token_ids": [...]} dict, or a list of them), in their order."""
        if lora_request is not None:
            raise ValueError("generate: LoRA adapters are not supported")
        if kwargs:
            raise TypeError("generate: unexpected argument(s): %s" % ", ".join(sorted(kwargs)))
        eng = self._engine
        eng.check_open()
        if prompts is None and prompt_token_ids is not None:
            prompts = [{"prompt_token_ids": list(p)} for p in
                       ([prompt_token_ids] if prompt_token_ids and isinstance(prompt_token_ids[0], int)
                        else prompt_token_ids)]
        if prompts is None:
            raise ValueError("generate: no prompts")
        if isinstance(prompts, (str, dict)) or (
                isinstance(prompts, (list, tuple)) and prompts and
                all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        params = as_params_list(sampling_params, len(prompts))
        if priority is not None:
            if len(priority) != len(prompts):
                raise ValueError("generate: got %d priorities for %d prompts"
                                 % (len(priority), len(prompts)))
            params = [_with_priority(p, pr) for p, pr in zip(params, priority)]
        reqs = []
        for p, sp in zip(prompts, params):
            text, ids = eng.parse_prompt(p)
            reqs.append(Request(str(next(self._ids)), text, ids, sp))
        return self._run(reqs, use_tqdm)

    def chat(self, messages, sampling_params=None, use_tqdm=True, lora_request=None,
             chat_template=None, chat_template_content_format="auto",
             add_generation_prompt=True, continue_final_message=False, tools=None,
             chat_template_kwargs=None, mm_processor_kwargs=None):
        """Generates the next assistant turn of a conversation (a list of {"role",
        "content"} messages) or of each of a list of conversations, rendered with the plan's
        chat template (or the family named by chat_template); chat_template_kwargs may say
        {"enable_thinking": False}."""
        if lora_request is not None:
            raise ValueError("chat: LoRA adapters are not supported")
        if tools:
            raise ValueError("chat: tools are not supported offline (inferrt serve renders "
                             "and parses tool calls)")
        if continue_final_message:
            raise ValueError("chat: continue_final_message is not supported")
        eng = self._engine
        eng.check_open()
        tok = self.get_tokenizer()
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        params = as_params_list(sampling_params, len(convs))
        kw = dict(chat_template_kwargs or {})
        reqs = []
        for conv, sp in zip(convs, params):
            ids, text = tok.chat_ids(list(conv), add_generation_prompt, chat_template,
                                     kw.get("enable_thinking"))
            reqs.append(Request(str(next(self._ids)), text, ids, sp))
        return self._run(reqs, use_tqdm)

    def _run(self, reqs, use_tqdm):
        eng = self._engine
        if not reqs:
            return []
        with eng._lock:
            by_cid, pending = {}, list(reversed(reqs))
            bar = _progress(len(reqs), use_tqdm)
            n_in = n_out = 0
            left = len(reqs)
            try:
                while left:
                    while pending:  # submit what the engine's queue takes
                        if not eng.submit(pending[-1]):
                            break
                        r = pending.pop()
                        by_cid[r.cid] = r
                    for r in eng.apply(eng.take(100), by_cid):
                        if r.done:
                            del by_cid[r.cid]
                            left -= 1
                            if bar is not None:
                                n_in += len(r.prompt_ids)
                                n_out += sum(len(c.token_ids) for c in r.comps)
                                el = bar.format_dict["elapsed"] or 1e-9
                                bar.set_postfix_str("est. speed input: %.2f toks/s, output: "
                                                    "%.2f toks/s" % (n_in / el, n_out / el),
                                                    refresh=False)
                                bar.update(1)
            except BaseException:
                # every request the engine took, even one whose submit an interrupt cut
                # short before it reached by_cid
                self._abort({r.cid: r for r in reqs if r.cid is not None and not r.done})
                raise
            finally:
                if bar is not None:
                    bar.close()
        return [eng.output(r) for r in reqs]

    def _abort(self, by_cid):
        """Cancels the requests in flight and waits (briefly) for the engine to end them, so
        none of their events reach a later call."""
        eng = self._engine
        if eng._closed:
            return
        for r in by_cid.values():
            eng.cancel(r)
        import time
        deadline = time.monotonic() + 30.0  # a step takes far less; never wait forever
        while by_cid and time.monotonic() < deadline:
            try:
                for r in eng.apply(eng.take(100), by_cid):
                    if r.done:
                        del by_cid[r.cid]
            except KeyboardInterrupt:
                continue
        # the engine publishes its counts at the end of the step whose events ended them
        while time.monotonic() < deadline:
            try:
                st = eng.stats()
                if st["running"] == 0 and st["waiting"] == 0:
                    break
                time.sleep(0.001)
            except KeyboardInterrupt:
                continue


def _with_priority(p, pr):
    q = p.clone()
    q.priority = int(pr)
    return q
