"""SamplingParams and structured-output parameters in vLLM's shape.

Values are checked here, as vLLM checks them (ValueError naming the field), and again by the
engine at submit. What the engine does not do is refused by name, never ignored.
"""
import enum
import json
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Union

from . import _lib


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # every output holds everything so far
    DELTA = 1  # every output holds what is new since the last one
    FINAL_ONLY = 2  # one output, at the end


@dataclass
class StructuredOutputsParams:
    """Constrained decoding (vLLM's StructuredOutputsParams): exactly one of json (a JSON
    Schema as a dict or a string), regex, choice (a list of strings), grammar (GBNF / EBNF
    text with a `root` rule) or json_object=True (any JSON object)."""
    json: Optional[Union[str, Dict[str, Any]]] = None
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    backend: Optional[str] = None  # accepted, one backend: the engine's own grammar
    whitespace_pattern: Optional[str] = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    structural_tag: Optional[str] = None

    def __post_init__(self):
        given = [k for k in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, k) not in (None, False)]
        if len(given) > 1:
            raise ValueError("structured outputs: give one of json, regex, choice, grammar, "
                             "json_object (got %s)" % ", ".join(given))
        if self.structural_tag is not None:
            raise ValueError("structured outputs: structural_tag is not supported")
        if self.whitespace_pattern is not None:
            raise ValueError("structured outputs: whitespace_pattern is not supported")

    def to_gbnf(self):
        """The GBNF grammar the engine runs, or None when nothing is asked."""
        if self.json is not None:
            schema = self.json if isinstance(self.json, str) else json.dumps(self.json)
            return _lib.grammar_from("irt_grammar_json", schema.encode())
        if self.json_object:
            return _lib.grammar_from("irt_grammar_json", None)
        if self.regex is not None:
            return _lib.grammar_from("irt_grammar_regex", self.regex.encode())
        if self.choice is not None:
            choices = [str(c) for c in self.choice]
            if not choices:
                raise ValueError("structured outputs: choice is empty")
            arr = (_lib.c_char_p * len(choices))(*[c.encode() for c in choices])
            return _lib.grammar_from("irt_grammar_choice", arr, len(choices))
        if self.grammar is not None:
            return self.grammar
        return None


# vLLM's older name for the same thing (SamplingParams.guided_decoding).
GuidedDecodingParams = StructuredOutputsParams


@dataclass
class SamplingParams:
    """What vLLM's SamplingParams holds, with its defaults (temperature 1, max_tokens 16)."""
    n: int = 1
    best_of: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    bad_words: Optional[List[str]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logits_processors: Optional[Any] = None
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Optional[int] = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    guided_decoding: Optional[StructuredOutputsParams] = None
    structured_outputs: Optional[StructuredOutputsParams] = None
    logit_bias: Optional[Dict[int, float]] = None
    allowed_token_ids: Optional[List[int]] = None
    extra_args: Optional[Dict[str, Any]] = None
    priority: int = 0  # the engine's: higher is scheduled first

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.seed is not None and not 0 <= int(self.seed) < 2**64:
            raise ValueError("seed must be in [0, 2^64), got %r" % (self.seed,))
        if self.guided_decoding is not None and self.structured_outputs is not None:
            raise ValueError("give guided_decoding or structured_outputs, not both")
        self._verify()

    @classmethod
    def from_optional(cls, **kw):
        return cls(**{k: v for k, v in kw.items() if v is not None})

    def clone(self):
        return SamplingParams(**{f.name: getattr(self, f.name) for f in fields(self)})

    def _verify(self):
        def bad(name, why):
            raise ValueError("%s %s, got %r" % (name, why, getattr(self, name)))

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", "must be at least 1")
        if self.best_of is not None and (not isinstance(self.best_of, int) or self.best_of < self.n):
            bad("best_of", "must be an integer >= n")
        if self.best_of is not None and self.best_of > self.n and \
                self.output_kind is not RequestOutputKind.CUMULATIVE:
            bad("best_of", "> n needs output_kind CUMULATIVE (the best are known at the end)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                bad(name, "must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 2.0:
            bad("repetition_penalty", "must be in (0, 2]")
        if self.temperature < 0.0:
            bad("temperature", "must be non-negative")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if self.top_k is None or self.top_k < -1:
            bad("top_k", "must be -1 or 0 (off) or at least 1")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be in [0, 1]")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", "must be at least 1")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            bad("min_tokens", "must be in [0, max_tokens]")
        if self.logprobs is not None and not 0 <= self.logprobs <= _lib.MAX_TOP_LOGPROBS:
            bad("logprobs", "must be in [0, %d]" % _lib.MAX_TOP_LOGPROBS)
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= _lib.MAX_TOP_LOGPROBS:
            bad("prompt_logprobs", "must be in [0, %d]" % _lib.MAX_TOP_LOGPROBS)
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", "must be non-empty strings")
        if len(self.stop_token_ids) > _lib.MAX_STOP_TOKEN_IDS:
            bad("stop_token_ids", "holds more than %d ids" % _lib.MAX_STOP_TOKEN_IDS)
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1 \
                and self.truncate_prompt_tokens != -1:
            bad("truncate_prompt_tokens", "must be at least 1 (or -1)")
        if self.logit_bias and len(self.logit_bias) > _lib.MAX_LOGIT_BIAS:
            bad("logit_bias", "holds more than %d tokens" % _lib.MAX_LOGIT_BIAS)
        if self.logit_bias and any(not -100 <= v <= 100 for v in self.logit_bias.values()):
            bad("logit_bias", "values must be in [-100, 100]")
        # Refused by name: what the engine does not do.
        if self.bad_words:
            bad("bad_words", "is not supported")
        if self.allowed_token_ids is not None:
            bad("allowed_token_ids", "is not supported (use logit_bias or structured outputs)")
        if self.logits_processors:
            bad("logits_processors", "is not supported (the engine samples in C)")
        if not self.skip_special_tokens:
            bad("skip_special_tokens", "false is not supported")

    @property
    def constraint(self):
        return self.structured_outputs or self.guided_decoding

    @property
    def all_stop_token_ids(self):
        return set(self.stop_token_ids)


__all__ = ["SamplingParams", "RequestOutputKind", "StructuredOutputsParams",
           "GuidedDecodingParams"]
