"""inferrt.ray: offline batch jobs over a Ray cluster (Ray Data), data parallel.

Each Ray actor owns one engine over the plan and turns batches of rows into rows with the
generated text, the way vLLM users scale `LLM.generate` with Ray Data:

    import ray
    from inferrt import SamplingParams
    from inferrt.ray import build_processor

    ray.init()                                           # or ray.init(address="auto")
    ds = ray.data.read_json("prompts.jsonl")             # rows {"id": ..., "prompt": ...}
    process = build_processor("model.plan", SamplingParams(temperature=0, max_tokens=64),
                              concurrency=4, batch_size=32)
    process(ds).write_json("results/")                   # rows + generated_text, ...

A row's prompt is a string (or a list of token ids) in `prompt_column`; `messages` rows
(`chat=True`) are conversations for LLM.chat. An actor that dies (its node lost, its process
killed) is restarted by Ray and its batch retried, so every row comes out once.

Tensor parallelism inside an actor (`tensor_parallel_size=N`, a plan built with
`infc build --tp N`): the actor runs `mpirun -n N inferrt serve` on its node and sends its
rows to it over HTTP (the OpenAI completions API), the ranks being that node's processes.
"""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from .build import infc_path
from .sampling_params import SamplingParams


def _cli_path():
    env = os.environ.get("INFERRT_CLI")
    if env:
        return env
    infc = infc_path()
    return os.path.join(os.path.dirname(infc), "inferrt")


class _ServeTP:
    """`mpirun -n N inferrt serve plan` on a free port of this node, and requests to it."""

    def __init__(self, model, tp, threads, kv_tokens, timeout=300):
        mpirun = shutil.which("mpirun")
        if not mpirun:
            raise RuntimeError("tensor_parallel_size > 1 needs mpirun (Open MPI) on the node")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        cmd = [mpirun, "-n", str(tp), _cli_path(), "serve", model, "--host", "127.0.0.1",
               "--port", str(self.port), "--model-name", "m", "--threads", str(threads or 1)]
        if kv_tokens:
            cmd += ["--kv-tokens", str(kv_tokens)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("mpirun inferrt serve ended: %s" %
                                   self.proc.stderr.read().decode(errors="replace")[-500:])
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError("mpirun inferrt serve did not start in %d s" % timeout)

    def complete(self, prompt, params):
        body = {"model": "m", "prompt": prompt, "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "n": params.n}
        if params.top_k and params.top_k > 0:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop) if not isinstance(params.stop, str) else [params.stop]
        if params.ignore_eos:
            body["ignore_eos"] = True
        req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % self.port,
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as r:
            out = json.loads(r.read())
        c = out["choices"][0]
        return c["text"], c.get("finish_reason"), out.get("usage", {}).get("completion_tokens", 0)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LLMPredictor:
    """A callable class for `Dataset.map_batches`: one engine per actor, each batch's rows
    generated together (the engine's continuous batching). Adds `output_column` (the text),
    `finish_reason` and `num_generated_tokens` to every row."""

    def __init__(self, model, sampling_params=None, prompt_column="prompt",
                 output_column="generated_text", chat=False, tensor_parallel_size=1,
                 **llm_kwargs):
        self.params = sampling_params or SamplingParams()
        self.prompt_column = prompt_column
        self.output_column = output_column
        self.chat = chat
        self.llm = self.serve = None
        if tensor_parallel_size > 1:
            if chat:
                raise ValueError("chat rows with tensor_parallel_size > 1 are not supported")
            self.serve = _ServeTP(model, tensor_parallel_size, llm_kwargs.get("threads"),
                                  llm_kwargs.get("kv_tokens"))
        else:
            from .llm import LLM
            self.llm = LLM(model, **llm_kwargs)

    def __call__(self, batch):
        col = batch[self.prompt_column]
        prompts = [p.tolist() if hasattr(p, "tolist") else p for p in col]
        if self.serve is not None:
            with ThreadPoolExecutor(max_workers=min(32, max(1, len(prompts)))) as ex:
                res = list(ex.map(lambda p: self.serve.complete(p, self.params), prompts))
            texts = [r[0] for r in res]
            reasons = [r[1] for r in res]
            counts = [r[2] for r in res]
        else:
            if self.chat:
                outs = self.llm.chat(prompts, self.params, use_tqdm=False)
            else:
                outs = self.llm.generate(prompts, self.params, use_tqdm=False)
            texts = [o.outputs[0].text for o in outs]
            reasons = [o.outputs[0].finish_reason for o in outs]
            counts = [len(o.outputs[0].token_ids) for o in outs]
        out = dict(batch)
        out[self.output_column] = texts
        out["finish_reason"] = reasons
        out["num_generated_tokens"] = counts
        return out

    def __del__(self):
        if self.serve is not None:
            self.serve.close()
        if self.llm is not None:
            self.llm.close()


def build_processor(model, sampling_params=None, concurrency=1, batch_size=64, num_cpus=1,
                    prompt_column="prompt", output_column="generated_text", chat=False,
                    tensor_parallel_size=1, **llm_kwargs):
    """A function Dataset -> Dataset: the rows through `concurrency` actors, each owning an
    engine (num_cpus each: give an actor the cores its engine's threads use)."""
    kwargs = dict(model=model, sampling_params=sampling_params, prompt_column=prompt_column,
                  output_column=output_column, chat=chat,
                  tensor_parallel_size=tensor_parallel_size, **llm_kwargs)

    def process(ds):
        return ds.map_batches(LLMPredictor, fn_constructor_kwargs=kwargs, concurrency=concurrency,
                              batch_size=batch_size, num_cpus=num_cpus, batch_format="numpy")

    return process


def run_jsonl(model, input_path, output_dir, sampling_params=None, **kwargs):
    """The documented job: rows of a JSONL file (each with a `prompt`) through the engines,
    written as JSON files under output_dir (Ray Data's write_json)."""
    import ray

    ds = ray.data.read_json(input_path)
    build_processor(model, sampling_params, **kwargs)(ds).write_json(output_dir)


__all__ = ["LLMPredictor", "build_processor", "run_jsonl"]
