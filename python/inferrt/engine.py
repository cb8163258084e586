"""The engine under LLM and AsyncLLM: a model, the C engine stepping on its own thread, and
one event queue its requests report to. Requests are built here from SamplingParams, and
events become RequestOutputs here; the two front ends differ only in who drains the queue.
"""
import ctypes
import random
import threading
import time
from ctypes import byref, c_char_p, c_float, c_int32, c_uint64, c_void_p

from . import _lib
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .sampling_params import SamplingParams
from .tokenizer import Tokenizer

FINISH = {_lib.FINISH_LENGTH: "length", _lib.FINISH_STOP: "stop", _lib.FINISH_CANCELLED: "abort"}
POP_BATCH = 4096

# vLLM engine arguments that say nothing to this engine (memory fractions, loaders, logging).
IGNORED_ARGS = {"trust_remote_code", "gpu_memory_utilization", "swap_space", "cpu_offload_gb",
                "disable_log_stats", "disable_custom_all_reduce", "load_format", "revision",
                "tokenizer_revision", "tokenizer_mode", "hf_overrides", "compilation_config",
                "disable_async_output_proc", "max_seq_len_to_capture", "quantization",
                "download_dir", "block_size", "enable_chunked_prefill", "disable_log_requests"}



def sampled(params):
    """The completions the engine samples for params: best_of (when over n), else n."""
    return params.best_of if params.best_of and params.best_of > params.n else params.n

class Request:
    """One submitted request: its prompt, its params and its completions so far."""

    __slots__ = ("rid", "cid", "prompt", "prompt_ids", "params", "comps", "prompt_lps",
                 "done", "cached", "metrics", "sent", "top", "scores")

    def __init__(self, rid, prompt, prompt_ids, params):
        self.rid = rid
        self.cid = None
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self.params = params
        self.comps = [CompletionOutput(index=i, text="", token_ids=[],
                                       cumulative_logprob=0.0 if params.logprobs is not None else None,
                                       logprobs=[] if params.logprobs is not None else None)
                      for i in range(sampled(params))]
        self.scores = [0.0] * sampled(params)  # cumulative logprobs: best_of picks by them
        self.prompt_lps = [None] if params.prompt_logprobs is not None else None
        self.done = False
        self.cached = 0
        self.metrics = RequestMetrics(arrival_time=time.time())
        self.sent = [(0, 0, 0)] * sampled(params)  # DELTA: (text chars, tokens, logprobs) out
        self.top = max(params.logprobs or 0, params.prompt_logprobs or 0)


class Engine:
    def __init__(self, model, threads=None, device=None, kv_dtype=None, kv_tokens=None,
                 max_num_seqs=None, max_num_batched_tokens=None, enable_prefix_caching=True,
                 chat_template=None, seed=None, enforce_eager=False, speculative_config=None,
                 max_model_len=None, tensor_parallel_size=1, pipeline_parallel_size=1,
                 dtype="auto", tokenizer=None, skip_tokenizer_init=False,
                 verify_weights=False, preload=None, **kwargs):
        unknown = set(kwargs) - IGNORED_ARGS
        if unknown:
            raise TypeError("LLM: unexpected argument(s): %s" % ", ".join(sorted(unknown)))
        if tensor_parallel_size != 1 or pipeline_parallel_size != 1:
            raise ValueError("LLM: tensor_parallel_size and pipeline_parallel_size must be 1 "
                             "(one process runs one plan)")
        if dtype not in (None, "auto"):
            raise ValueError("LLM: dtype is fixed by the plan (infc build --dtype); pass 'auto'")
        self.lib = lib = _lib.load()
        self._model = self._engine = self._queue = self._draft = None
        self._closed = False
        opts = lib.irt_model_opts_default()
        opts.n_threads = int(threads or 0)
        opts.skip_weight_checksum = not verify_weights
        dev = device.encode() if device else None
        opts.device = dev
        if kv_dtype is not None:
            if kv_dtype not in _lib.KV_DTYPES:
                raise ValueError("LLM: kv_dtype must be one of f32, f16, int8 (got %r)" % (kv_dtype,))
            opts.kv_dtype = _lib.KV_DTYPES[kv_dtype]
        opts.kv_tokens = int(kv_tokens or 0)
        opts.no_cuda_graphs = bool(enforce_eager)
        preloads = {None: 0, False: 0, "background": 1, True: 1, "wait": 2}
        if preload not in preloads:
            raise ValueError("LLM: preload must be None, 'background' or 'wait' (got %r)" % (preload,))
        opts.preload = preloads[preload]
        h, err = c_void_p(), _lib.irt_error()
        _lib.check(lib.irt_model_open(str(model).encode(), byref(opts), byref(h), byref(err)), err)
        self._model = h.value
        self.plan_path = str(model)
        self.info = lib.irt_model_get_info(self._model).contents
        if max_model_len is not None and max_model_len > self.info.context_length:
            self.close()
            raise ValueError("LLM: max_model_len %d is over the plan's context length %d"
                             % (max_model_len, self.info.context_length))
        self.max_model_len = int(max_model_len or self.info.context_length)
        eo = lib.irt_engine_opts_default()
        eo.max_running = int(max_num_seqs or 0)
        eo.max_batched_tokens = int(max_num_batched_tokens or 0)
        eo.disable_prefix_cache = not enable_prefix_caching
        eo.max_waiting = 1 << 20
        if speculative_config:
            sc = dict(speculative_config)
            draft = sc.pop("model", None)
            method = sc.pop("method", "draft_model" if draft else "ngram")
            if method not in ("ngram", "prompt_lookup", "draft_model") or \
                    (method == "draft_model") != (draft is not None):
                self.close()
                raise ValueError("LLM: speculative_config method %r is not supported (ngram, or "
                                 "draft_model with a 'model' plan)" % (method,))
            eo.spec_tokens = int(sc.pop("num_speculative_tokens", 4))
            eo.spec_ngram_min = int(sc.pop("prompt_lookup_min", 0))
            eo.spec_ngram_max = int(sc.pop("prompt_lookup_max", 0))
            if draft is not None:  # its own KV cache, as large as the target's
                dopts = lib.irt_model_opts_default()
                dopts.n_threads = opts.n_threads
                dopts.skip_weight_checksum = opts.skip_weight_checksum
                dopts.kv_tokens = self.info.kv_tokens
                dh = c_void_p()
                try:
                    _lib.check(lib.irt_model_open(str(draft).encode(), byref(dopts), byref(dh),
                                                  byref(err)), err)
                except Exception:
                    self.close()
                    raise
                self._draft = dh.value
                eo.draft = self._draft
            if sc:
                self.close()
                raise ValueError("LLM: speculative_config keys not supported: %s" % ", ".join(sc))
        e, q = c_void_p(), c_void_p()
        try:
            _lib.check(lib.irt_engine_create(self._model, byref(eo), byref(e), byref(err)), err)
            self._engine = e.value
            _lib.check(lib.irt_event_queue_create(byref(q), byref(err)), err)
            self._queue = q.value
            _lib.check(lib.irt_engine_start(self._engine, byref(err)), err)
        except Exception:
            self.close()
            raise
        tok = lib.irt_model_get_tokenizer(self._model)
        self.tokenizer = None
        if tok and not skip_tokenizer_init:
            self.tokenizer = Tokenizer(tok, owner=self, chat_template=chat_template)
            if chat_template:
                self.tokenizer.chat_family()  # an unknown family fails here, not at chat
        elif chat_template:
            self.close()
            raise ValueError("LLM: chat_template needs a plan with a tokenizer")
        self._rng = random.Random(seed)
        self._decoded = {}
        self._evs = (_lib.irt_event * POP_BATCH)()
        self._err = _lib.irt_error()
        self._lock = threading.Lock()  # one consumer of the queue at a time

    # --- lifetime ---------------------------------------------------------------------------
    def close(self):
        """Stops the engine (requests in flight end as aborted) and frees the model."""
        if self._closed:
            return
        self._closed = True
        lib = self.lib
        if self._engine:
            lib.irt_engine_destroy(self._engine)
            self._engine = None
        if self._queue:
            lib.irt_event_queue_destroy(self._queue)
            self._queue = None
        if self._model:
            lib.irt_model_close(self._model)
            self._model = None
        if self._draft:
            lib.irt_model_close(self._draft)
            self._draft = None

    def check_open(self):
        if self._closed:
            raise RuntimeError("the LLM is closed")

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # --- prompts ------------------------------------------------------------------------------
    def prompt_ids(self, text):
        if self.tokenizer is None:
            raise ValueError("this plan has no tokenizer: give prompts as token ids "
                             "({'prompt_token_ids': [...]})")
        return self.tokenizer.encode(text, add_special_tokens=True)

    def parse_prompt(self, p):
        """(text or None, ids) of one prompt in any of vLLM's forms."""
        if isinstance(p, str):
            return p, self.prompt_ids(p)
        if isinstance(p, dict):
            if "prompt_token_ids" in p:
                ids = [int(t) for t in p["prompt_token_ids"]]
                return p.get("prompt"), ids
            if "prompt" in p:
                if not isinstance(p["prompt"], str):
                    raise ValueError("prompt must be a string")
                return p["prompt"], self.prompt_ids(p["prompt"])
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p):
            return None, [int(t) for t in p]
        raise ValueError("a prompt must be a string, a list of token ids, or a dict with "
                         "'prompt' or 'prompt_token_ids' (got %s)" % type(p).__name__)

    # --- requests -----------------------------------------------------------------------------
    def submit(self, req):
        """Submits req (a Request); returns False when the engine's queue is full."""
        self.check_open()
        p = req.params
        ids = req.prompt_ids
        if p.truncate_prompt_tokens is not None and p.truncate_prompt_tokens > 0:
            ids = req.prompt_ids = ids[-p.truncate_prompt_tokens:]
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.info.vocab_size
        for t in ids:
            if not 0 <= t < vocab:
                raise ValueError("prompt token id %d is outside the vocabulary (0..%d)"
                                 % (t, vocab - 1))
        r = _lib.irt_request()
        arr = (c_int32 * len(ids))(*ids)
        r.prompt_ids, r.n_prompt = arr, len(ids)
        temp = p.temperature if p.temperature >= 1e-5 else 0.0
        seed = p.seed if p.seed is not None else self._rng.getrandbits(63)
        r.sampling = _lib.irt_sampling(temp, p.top_k if p.top_k > 0 else 0, p.top_p, seed, p.min_p)
        r.max_tokens = int(p.max_tokens) if p.max_tokens is not None else 0
        keep = [arr]
        if p.stop:
            if self.tokenizer is None:
                raise ValueError("stop strings need a plan with a tokenizer")
            stops = (c_char_p * len(p.stop))(*[s.encode() for s in p.stop])
            r.stop, r.n_stop = stops, len(p.stop)
            keep.append(stops)
        r.include_stop_str = p.include_stop_str_in_output
        r.ignore_eos = p.ignore_eos
        r.n = sampled(p)
        r.priority = int(p.priority)
        r.on_event, r.user = self.lib.event_push, self._queue
        r.presence_penalty, r.frequency_penalty = p.presence_penalty, p.frequency_penalty
        r.top_logprobs = req.top
        if p.logit_bias:
            items = sorted((int(k), float(v)) for k, v in p.logit_bias.items())
            bids = (c_int32 * len(items))(*[k for k, _ in items])
            bvals = (c_float * len(items))(*[v for _, v in items])
            r.logit_bias_ids, r.logit_bias, r.n_logit_bias = bids, bvals, len(items)
            keep += [bids, bvals]
        c = p.constraint
        g = c.to_gbnf() if c is not None else None
        if g is not None:
            if self.tokenizer is None:
                raise ValueError("structured outputs need a plan with a tokenizer")
            r.grammar = g.encode()
        r.repetition_penalty = p.repetition_penalty if p.repetition_penalty != 1.0 else 0.0
        r.min_tokens = p.min_tokens
        if p.stop_token_ids:
            sids = (c_int32 * len(p.stop_token_ids))(*[int(t) for t in p.stop_token_ids])
            r.stop_token_ids, r.n_stop_token_ids = sids, len(p.stop_token_ids)
            keep.append(sids)
        r.prompt_logprobs = p.prompt_logprobs is not None
        rid, err = c_uint64(), _lib.irt_error()
        st = self.lib.irt_engine_submit(self._engine, byref(r), byref(rid), byref(err))
        if st == _lib.IRT_BUSY:
            return False
        _lib.check(st, err)
        req.cid = rid.value
        return True

    def cancel(self, req):
        if req.cid is not None and not req.done and self._engine:
            self.lib.irt_engine_cancel(self._engine, req.cid)

    def wake(self):
        if self._queue:
            self.lib.irt_event_queue_wake(self._queue)

    def stats(self):
        s = _lib.irt_engine_stats()
        if self._engine:
            self.lib.irt_engine_get_stats(self._engine, byref(s))
        return {k: getattr(s, k) for k, _ in s._fields_}

    # --- events -------------------------------------------------------------------------------
    def decoded(self, tid):
        s = self._decoded.get(tid)
        if s is None:
            s = self.tokenizer.decode([tid], skip_special_tokens=False) if self.tokenizer else None
            self._decoded[tid] = s
        return s

    def _lp_dict(self, token, logprob, tops, lps, k):
        d, rank = {}, None
        tops, lps = tops or (), lps or ()
        for j in range(min(len(tops), k)):
            d[tops[j]] = Logprob(lps[j], j + 1, self.decoded(tops[j]))
        if token in tops:
            rank = tops.index(token) + 1
        d[token] = Logprob(logprob, rank, self.decoded(token))
        return d

    def take(self, timeout_ms):
        """The events the queue holds (waiting up to timeout_ms for one), as tuples (id,
        index, token, logprob, text, finish, done, cached, tops, lps, prompt), so that the
        library's buffers can be reused while they are applied."""
        n = self.lib.irt_event_queue_pop(self._queue, self._evs, POP_BATCH, timeout_ms,
                                         byref(self._err))
        if n < 0:
            _lib.raise_error(self._err.status, self._err)
        out = []
        string_at = ctypes.string_at
        for i in range(n):
            ev = self._evs[i]
            k = ev.n_top
            out.append((ev.id, ev.index, ev.token, ev.logprob,
                        string_at(ev.text, ev.text_len) if ev.text_len else b"", ev.finish,
                        ev.request_done, ev.cached_tokens, ev.top_tokens[:k] if k else None,
                        ev.top_logprobs[:k] if k else None, ev.prompt))
        return out

    def apply(self, events, by_cid):
        """Applies taken events to the requests of by_cid (engine id -> Request); returns the
        requests that changed, in order of first change. Events of other ids are dropped."""
        changed = {}
        now = None
        for cid, index, tok, lp, text, finish, done, cached, tops, lps, prompt in events:
            req = by_cid.get(cid)
            if req is None:
                continue
            changed[cid] = req
            if prompt:
                if req.prompt_lps is not None and tok >= 0:
                    req.prompt_lps.append(self._lp_dict(tok, lp, tops, lps,
                                                        req.params.prompt_logprobs))
                continue
            comp = req.comps[index]
            if tok >= 0:
                req.scores[index] += lp
                comp.token_ids.append(tok)
                if text:
                    comp.text += text.decode("utf-8", "replace")
                if comp.logprobs is not None:
                    comp.cumulative_logprob += lp
                    comp.logprobs.append(self._lp_dict(tok, lp, tops, lps, req.params.logprobs))
                if req.metrics.first_token_time is None:
                    now = now or time.time()
                    req.metrics.first_token_time = now
            if finish:
                comp.finish_reason = FINISH.get(finish, "abort")
                if finish == _lib.FINISH_STOP:
                    comp.stop_reason = self._stop_reason(req, comp)
            req.cached = cached
            if done:
                req.done = True
                req.metrics.finished_time = now = now or time.time()
        return list(changed.values())

    def _stop_reason(self, req, comp):
        """The stop token id or stop string that ended comp (None for end of generation)."""
        p = req.params
        if comp.token_ids and comp.token_ids[-1] in p.all_stop_token_ids:
            return comp.token_ids[-1]
        if not p.stop or self.tokenizer is None:
            return None
        if comp.token_ids and self.tokenizer.is_end_of_generation(comp.token_ids[-1]) \
                and not p.ignore_eos:
            return None
        if p.include_stop_str_in_output:
            return next((s for s in p.stop if comp.text.endswith(s)), None)
        full = self.tokenizer.decode(comp.token_ids)
        rest = full[len(comp.text):] if full.startswith(comp.text) else full
        return next((s for s in p.stop if s in rest), None)

    def output(self, req, kind=None):
        """The RequestOutput of req now: everything (CUMULATIVE) or what is new (DELTA)."""
        from .sampling_params import RequestOutputKind
        comps = req.comps
        p = req.params
        if sampled(p) > p.n:  # best_of: the n of the highest cumulative logprob, best first
            best = sorted(range(len(comps)), key=lambda i: (-req.scores[i], i))[:p.n]
            comps = [CompletionOutput(k, comps[i].text, comps[i].token_ids, req.scores[i],
                                      comps[i].logprobs, comps[i].finish_reason,
                                      comps[i].stop_reason) for k, i in enumerate(best)]
        if kind is RequestOutputKind.DELTA:
            out = []
            for i, c in enumerate(comps):
                t0, k0, l0 = req.sent[i]
                out.append(CompletionOutput(
                    index=c.index, text=c.text[t0:], token_ids=c.token_ids[k0:],
                    cumulative_logprob=c.cumulative_logprob,
                    logprobs=c.logprobs[l0:] if c.logprobs is not None else None,
                    finish_reason=c.finish_reason, stop_reason=c.stop_reason))
                req.sent[i] = (len(c.text), len(c.token_ids),
                               len(c.logprobs) if c.logprobs is not None else 0)
            comps = out
        else:
            comps = [CompletionOutput(c.index, c.text, list(c.token_ids), c.cumulative_logprob,
                                      list(c.logprobs) if c.logprobs is not None else None,
                                      c.finish_reason, c.stop_reason) for c in comps]
        return RequestOutput(request_id=req.rid, prompt=req.prompt,
                             prompt_token_ids=req.prompt_ids,
                             prompt_logprobs=list(req.prompt_lps) if req.prompt_lps is not None else None,
                             outputs=comps, finished=req.done, metrics=req.metrics,
                             num_cached_tokens=req.cached)


def as_params_list(params, n):
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError("got %d sampling params for %d prompts" % (len(params), n))
    for p in params:
        if not isinstance(p, SamplingParams):
            raise TypeError("sampling_params must be SamplingParams objects")
    return params
