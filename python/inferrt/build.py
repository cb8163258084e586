"""inferrt.build: `infc build` from Python, with the same options, so a notebook goes from a
checkpoint (GGUF file, HF directory or model.onnx) to a plan.

    inferrt.build("SmolLM2.gguf", "smollm2.plan", dtype="f32", quant="int4:g32:asym")

Keyword options are infc's long flags with "_" for "-": a value is passed as the flag's
argument (a list or tuple repeats the flag: shape=["x=1..8x3"]), True passes the bare flag,
False or None leaves it out. config= is -c (a build.yaml). The compiler runs as its own
process: a bad checkpoint fails with infc's message as a BuildError, never in this one.
"""
import os
import shutil
import subprocess

from ._lib import EngineError

_FLAGS = {"output", "config", "dtype", "max_tokens", "max_seqs", "max_logits", "kv_block_size",
          "max_context", "no_fold", "no_fuse", "tokenizer", "target", "arch", "cache_dir",
          "decode_buckets", "quant", "quant_calib", "act_dtype", "attn_dtype", "no_repack", "shape",
          "quiet", "tp", "layers"}


class BuildError(EngineError):
    """infc refused the model or failed: its message, and .returncode."""

    def __init__(self, message, returncode):
        super().__init__("BUILD", message)
        self.returncode = returncode


def infc_path():
    """The infc executable: $INFERRT_INFC, the package's own, a source checkout's build/,
    then PATH."""
    env = os.environ.get("INFERRT_INFC")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "bin", "infc"), os.path.join(here, "..", "..", "build", "infc")):
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    found = shutil.which("infc")
    if found:
        return found
    raise FileNotFoundError("infc not found: install the package with `pip install ./python`, "
                            "build the tree, or set INFERRT_INFC")


def build(src, out, timeout=None, **options):
    """Compiles src to the plan file out; returns out. Raises BuildError with infc's message."""
    args = [infc_path(), "build", os.fspath(src), "-o", os.fspath(out)]
    for key, value in options.items():
        if key not in _FLAGS or key == "output":
            raise TypeError("build: unknown option %r (infc build's flags: %s)"
                            % (key, ", ".join(sorted(_FLAGS - {"output"}))))
        flag = "-c" if key == "config" else "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
            continue
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            args += [flag, os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
    proc = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip() or "infc build failed").splitlines()
        raise BuildError("; ".join(msg[-5:]), proc.returncode)
    return os.fspath(out)
