"""inferrt: the inferrt engine from Python, in vLLM's shape.

    from inferrt import LLM, SamplingParams
    llm = LLM("model.plan")
    outputs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, top_p=0.95))

LLM (offline batches), AsyncLLM (asyncio streaming), SamplingParams, StructuredOutputsParams
/ GuidedDecodingParams (JSON Schema, regex, choice, grammar), and build() (`infc build`).
"""
from ._lib import Busy, EngineError, InvalidArgument, Unsupported
from .async_llm import AsyncLLM
from .build import BuildError, build
from .llm import LLM
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .sampling_params import (GuidedDecodingParams, RequestOutputKind, SamplingParams,
                              StructuredOutputsParams)
from .tokenizer import Tokenizer


def _version():
    try:
        from ._lib import load
        return load().irt_version().decode()
    except ImportError:
        return "unknown"


__version__ = "0.1.0"

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutputKind", "StructuredOutputsParams",
           "GuidedDecodingParams", "RequestOutput", "CompletionOutput", "Logprob",
           "RequestMetrics", "Tokenizer", "build", "BuildError", "EngineError",
           "InvalidArgument", "Unsupported", "Busy"]
