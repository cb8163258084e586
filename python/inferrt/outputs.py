"""RequestOutput, CompletionOutput and Logprob: what vLLM's generate returns."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union


@dataclass
class Logprob:
    """A token's log-probability under the model's distribution (its raw logits), its rank
    among the vocabulary (1 is the likeliest; None when below the alternatives asked for)
    and its text."""
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: List[int] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[List[Dict[int, Logprob]]] = None
    finish_reason: Optional[str] = None  # "stop", "length", "abort"; None while running
    stop_reason: Union[int, str, None] = None  # the stop string or stop token id that ended it

    def finished(self):
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float = 0.0
    first_token_time: Optional[float] = None
    finished_time: Optional[float] = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    prompt_logprobs: Optional[List[Optional[Dict[int, Logprob]]]]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: Optional[RequestMetrics] = None
    num_cached_tokens: int = 0
