"""The C API of runtime/include/inferrt.h through ctypes.

The structs below mirror inferrt.h; load() checks each one's size against the library's own
(irt_struct_size) before any other call, so a library and a binding that disagree fail at
import with the struct named, never with corrupted memory. ctypes releases the GIL for the
length of every call into the library.
"""
import ctypes
import os
from ctypes import (POINTER, Structure, byref, c_bool, c_char, c_char_p, c_double, c_float,
                    c_int, c_int32, c_int64, c_size_t, c_uint64, c_void_p)

IRT_OK, IRT_INVALID_ARG, IRT_IO, IRT_BAD_FORMAT, IRT_VERSION_MISMATCH, IRT_OOM, \
    IRT_UNSUPPORTED, IRT_DEVICE, IRT_BUSY = range(9)
STATUS_NAMES = ["OK", "INVALID_ARG", "IO", "BAD_FORMAT", "VERSION_MISMATCH", "OOM",
                "UNSUPPORTED", "DEVICE", "BUSY"]
FINISH_NONE, FINISH_LENGTH, FINISH_STOP, FINISH_CANCELLED = range(4)
KV_DTYPES = {"f32": 0, "float32": 0, "auto": 0, "int8": 1, "f16": 2, "float16": 2,
             "half": 2}
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024
MAX_STOP_TOKEN_IDS = 256


class EngineError(RuntimeError):
    """An error the engine reported: .status is its name (e.g. "BAD_FORMAT"), the message
    its one line naming the problem."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class InvalidArgument(EngineError, ValueError):
    """A bad parameter or input (IRT_INVALID_ARG): also a ValueError, as vLLM raises."""


class Unsupported(EngineError, NotImplementedError):
    """Something the engine does not do (IRT_UNSUPPORTED)."""


class Busy(EngineError):
    """The engine's queue is full (IRT_BUSY): retry later."""


class irt_error(Structure):
    _fields_ = [("status", c_int), ("msg", c_char * 512)]


irt_log_fn = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)


class irt_model_opts(Structure):
    _fields_ = [("n_threads", c_int), ("kv_tokens", c_int64),
                ("skip_weight_checksum", c_bool), ("device", c_char_p),
                ("cuda_device", c_int), ("no_cuda_graphs", c_bool), ("kv_dtype", c_int),
                ("log", c_void_p), ("log_user", c_void_p), ("cuda_profile", c_bool),
                ("cuda_dequant_gemm_m", c_int64), ("cuda_lib", c_char_p),
                ("comm", c_void_p), ("preload", c_int), ("no_cuda_pdl", c_bool)]


class irt_model_info(Structure):
    _fields_ = [("arch", c_char_p), ("vocab_size", c_int64), ("context_length", c_int64),
                ("n_layers", c_int64), ("hidden_size", c_int64), ("bos_token_id", c_int64),
                ("eos_token_id", c_int64), ("max_step_tokens", c_int64),
                ("max_step_seqs", c_int64), ("max_step_logits", c_int64),
                ("weight_bytes", c_uint64), ("arena_bytes", c_uint64), ("kv_bytes", c_uint64),
                ("kv_tokens", c_int64), ("kv_dtype", c_char_p), ("device", c_char_p),
                ("n_heads", c_int64), ("n_kv_heads", c_int64), ("head_dim", c_int64),
                ("tp_size", c_int)]


class irt_sampling(Structure):
    _fields_ = [("temperature", c_float), ("top_k", c_int), ("top_p", c_float),
                ("seed", c_uint64), ("min_p", c_float)]


class irt_engine_opts(Structure):
    _fields_ = [("max_batched_tokens", c_int64), ("max_running", c_int64),
                ("max_waiting", c_int64), ("disable_prefix_cache", c_bool),
                ("static_batching", c_bool), ("spec_tokens", c_int),
                ("spec_ngram_min", c_int), ("spec_ngram_max", c_int), ("spec_always", c_bool),
                ("draft", c_void_p)]


class irt_event(Structure):
    _fields_ = [("id", c_uint64), ("index", c_int), ("token", c_int32), ("logprob", c_float),
                ("text", POINTER(c_char)), ("text_len", c_size_t), ("finish", c_int),
                ("request_done", c_bool), ("prompt_tokens", c_int64),
                ("cached_tokens", c_int64), ("n_top", c_int),
                ("top_tokens", POINTER(c_int32)), ("top_logprobs", POINTER(c_float)),
                ("prompt", c_bool)]


class irt_request(Structure):
    _fields_ = [("prompt_ids", POINTER(c_int32)), ("n_prompt", c_size_t),
                ("prompt_text", c_char_p), ("add_special", c_bool),
                ("sampling", irt_sampling), ("max_tokens", c_int64),
                ("stop", POINTER(c_char_p)), ("n_stop", c_int),
                ("include_stop_str", c_bool), ("ignore_eos", c_bool), ("n", c_int),
                ("priority", c_int), ("tenant", c_char_p), ("on_event", c_void_p),
                ("user", c_void_p), ("presence_penalty", c_float),
                ("frequency_penalty", c_float), ("top_logprobs", c_int),
                ("logit_bias_ids", POINTER(c_int32)), ("logit_bias", POINTER(c_float)),
                ("n_logit_bias", c_int), ("grammar", c_char_p),
                ("repetition_penalty", c_float), ("min_tokens", c_int64),
                ("stop_token_ids", POINTER(c_int32)), ("n_stop_token_ids", c_int),
                ("prompt_logprobs", c_bool)]


class irt_chat_message(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p), ("reasoning", c_char_p)]


class irt_chat_opts(Structure):
    _fields_ = [("tools", c_bool), ("no_thinking", c_bool)]


class irt_chat_info(Structure):
    _fields_ = [("family", c_char * 16), ("default_system", c_char * 512), ("thinks", c_bool)]


class irt_engine_stats(Structure):
    _fields_ = [(n, c_int64) for n in (
        "running", "waiting", "kv_blocks_total", "kv_blocks_used", "kv_blocks_cached",
        "preemptions", "prompt_tokens", "cached_prompt_tokens", "generated_tokens", "steps",
        "requests_finished", "spec_draft_tokens", "spec_accepted_tokens")] + [
        ("spec_step_ms", c_double), ("spec_token_ms", c_double)]


STRUCTS = [irt_error, irt_model_opts, irt_model_info, irt_sampling, irt_engine_opts, irt_event,
           irt_request, irt_chat_message, irt_chat_opts, irt_chat_info, irt_engine_stats]

P = c_void_p
# name: (restype, argtypes)
SIGNATURES = {
    "irt_version": (c_char_p, []),
    "irt_struct_size": (c_size_t, [c_char_p]),
    "irt_status_name": (c_char_p, [c_int]),
    "irt_free": (None, [c_void_p]),
    "irt_model_opts_default": (irt_model_opts, []),
    "irt_model_open": (c_int, [c_char_p, POINTER(irt_model_opts), POINTER(P), POINTER(irt_error)]),
    "irt_model_close": (None, [P]),
    "irt_model_get_info": (POINTER(irt_model_info), [P]),
    "irt_model_get_tokenizer": (P, [P]),
    "irt_plan_verify": (c_int, [c_char_p, POINTER(irt_error)]),
    "irt_engine_opts_default": (irt_engine_opts, []),
    "irt_engine_create": (c_int, [P, POINTER(irt_engine_opts), POINTER(P), POINTER(irt_error)]),
    "irt_engine_destroy": (None, [P]),
    "irt_engine_submit": (c_int, [P, POINTER(irt_request), POINTER(c_uint64), POINTER(irt_error)]),
    "irt_engine_cancel": (None, [P, c_uint64]),
    "irt_engine_start": (c_int, [P, POINTER(irt_error)]),
    "irt_engine_get_stats": (None, [P, POINTER(irt_engine_stats)]),
    "irt_event_queue_create": (c_int, [POINTER(P), POINTER(irt_error)]),
    "irt_event_queue_destroy": (None, [P]),
    "irt_event_queue_pop": (c_int, [P, POINTER(irt_event), c_int, c_int, POINTER(irt_error)]),
    "irt_event_queue_wake": (None, [P]),
    "irt_event_queue_size": (c_int64, [P]),
    "irt_tokenizer_open_plan": (c_int, [c_char_p, POINTER(P), POINTER(irt_error)]),
    "irt_tokenizer_open_json": (c_int, [c_char_p, c_char_p, POINTER(P), POINTER(irt_error)]),
    "irt_tokenizer_open_gguf": (c_int, [c_char_p, POINTER(P), POINTER(irt_error)]),
    "irt_tokenizer_destroy": (None, [P]),
    "irt_tokenize_alloc": (c_int, [P, c_char_p, c_size_t, c_bool, c_bool,
                                   POINTER(POINTER(c_int32)), POINTER(c_size_t),
                                   POINTER(irt_error)]),
    "irt_detokenize_alloc": (c_int, [P, POINTER(c_int32), c_size_t, c_bool, POINTER(c_void_p),
                                     POINTER(c_size_t), POINTER(irt_error)]),
    "irt_token_is_eog": (c_bool, [P, c_int32]),
    "irt_tokenizer_vocab_size": (c_int32, [P]),
    "irt_chat_tokenize": (c_int, [P, c_char_p, POINTER(irt_chat_message), c_size_t, c_bool,
                                  POINTER(irt_chat_opts), c_bool, POINTER(POINTER(c_int32)),
                                  POINTER(c_size_t), POINTER(c_void_p), POINTER(irt_error)]),
    "irt_chat_get_info": (c_int, [P, c_char_p, POINTER(irt_chat_info), POINTER(irt_error)]),
    "irt_grammar_json": (c_int, [c_char_p, POINTER(c_void_p), POINTER(irt_error)]),
    "irt_grammar_regex": (c_int, [c_char_p, POINTER(c_void_p), POINTER(irt_error)]),
    "irt_grammar_choice": (c_int, [POINTER(c_char_p), c_int, POINTER(c_void_p),
                                   POINTER(irt_error)]),
    "irt_grammar_check": (c_int, [c_char_p, POINTER(irt_error)]),
}

_lib = None


def _candidates():
    env = os.environ.get("INFERRT_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "lib", "libinferrt.so"),  # the installed package
            os.path.join(here, "..", "..", "build", "libinferrt.so")]  # a source checkout


def load():
    """The library, loaded once and checked against these declarations."""
    global _lib
    if _lib is not None:
        return _lib
    tried = _candidates()
    path = next((p for p in tried if os.path.isfile(p)), None)
    if path is None:
        raise ImportError("inferrt: libinferrt.so not found (tried %s); install the package "
                          "with `pip install ./python`, build the tree with cmake, or set "
                          "INFERRT_LIB" % ", ".join(tried))
    lib = ctypes.CDLL(os.path.realpath(path))
    for name, (res, args) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    for st in STRUCTS:
        want = lib.irt_struct_size(st.__name__.encode())
        if want != ctypes.sizeof(st):
            raise ImportError("inferrt: %s is %d bytes in %s but %d in this binding: the "
                              "package and the library are from different versions"
                              % (st.__name__, want, path, ctypes.sizeof(st)))
    lib.path = path
    lib.event_push = ctypes.cast(lib.irt_event_queue_push, c_void_p).value
    _lib = lib
    return lib


def raise_error(status, err):
    """Raises the exception of a failed call's status and irt_error."""
    name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else str(status)
    msg = err.msg.decode("utf-8", "replace") or name
    if status == IRT_INVALID_ARG:
        raise InvalidArgument(name, msg)
    if status == IRT_UNSUPPORTED:
        raise Unsupported(name, msg)
    if status == IRT_BUSY:
        raise Busy(name, msg)
    if status == IRT_IO and "cannot open" in msg:
        exc = EngineError(name, msg)
        raise FileNotFoundError(msg) from exc
    raise EngineError(name, msg)


def check(status, err):
    if status != IRT_OK:
        raise_error(status, err)


def take_string(lib, ptr, n):
    """A string the library allocated (irt_free'd here)."""
    if not ptr.value:
        return ""
    try:
        return ctypes.string_at(ptr.value, n).decode("utf-8", "replace")
    finally:
        lib.irt_free(ptr.value)


def take_ids(lib, ptr, n):
    if not ptr:
        return []
    try:
        return ptr[:n]
    finally:
        lib.irt_free(ctypes.cast(ptr, c_void_p))


def grammar_from(fn_name, *args):
    lib = load()
    out, err = c_void_p(), irt_error()
    st = getattr(lib, fn_name)(*args, byref(out), byref(err))
    check(st, err)
    s = ctypes.string_at(out.value).decode()
    lib.irt_free(out.value)
    return s


def int_array(values):
    return (c_int32 * len(values))(*values) if values else None
