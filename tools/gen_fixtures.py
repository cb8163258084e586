#!/usr/bin/python3
"""Generate tiny random Llama-family checkpoints and oracle outputs.

The fixtures written under tests/fixtures/ are the external oracle that the
infc compiler / inferrt runtime are checked against.  CI never runs this
script (it has no torch); a developer runs it once and commits the output.

How to run (Debian bookworm, as root):

    apt-get install -y python3-torch python3-pip      # CPU torch 1.13.1
    /usr/bin/python3 -m pip install --break-system-packages \
        -r tools/requirements-fixtures.txt
    /usr/bin/python3 tools/gen_fixtures.py            # from the repo root

Use /usr/bin/python3 explicitly: Debian's torch is only importable from the
system interpreter, not from a pyenv / venv python found earlier on PATH.
The fixtures after llama-mha-f16 (Qwen3, rope_parameters with llama3 / yarn scaling,
Phi-3 with partial rotary, SmolLM3, Gemma 2, Gemma 3 and its multimodal checkpoint form)
need transformers 5 (torch >= 2): made in a scratch venv (`python3 -m venv V &&
V/bin/pip install torch transformers safetensors`, torch 2.15, transformers 5.24;
gemma2-softcap-f32, gemma3-local-f32 and gemma3-mm-f32 with transformers 5.25) with
`V/bin/python tools/gen_fixtures.py --only NAME`; that transformers writes
rope_parameters (per layer type for Gemma 3) and layer_types.
Do not pip-install torch (it pulls gigabytes of CUDA libraries).

For every fixture the script:
  1. builds the model from a small config and fills it with seeded random
     weights (std INIT_STD, RMSNorm weights ~ 1 + 0.1*N(0,1) -- 0.1*N(0,1)
     for Gemma, whose RMSNorm scales by 1 + weight --, random q/k/v biases
     for Qwen2; a spec's embed_std and final_norm_scale override the
     embeddings' std and the final norm's mean scale) so logits are well
     spread; a multimodal model's text weights are drawn first, as the causal
     LM's, its vision tower after them (LayerNorm weights ~ 1 + 0.1*N(0,1));
  2. saves it with save_pretrained(safe_serialization=True) in the fixture's
     dtype (float32 / bfloat16 / float16);
  3. reloads the saved checkpoint with torch_dtype=float32 and eager attention
     and computes every oracle output from that reloaded model in float32
     (the engine upcasts bf16/f16 weights exactly and computes in f32);
  4. records full-sequence logits for three seeded prompts (ids below a
     spec's prompt_vocab, if it has one) and a 32-token greedy continuation
     (KV-cache loop, EOS never stops it), then checks
     that a full forward over prompt+greedy reproduces the greedy tokens;
  5. retries with the next seed if the smallest top1-top2 logit gap over all
     greedy steps is below MIN_MARGIN.

Each fixture directory holds exactly config.json, model.safetensors and
oracle.json.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import safetensors
import torch
import transformers
from safetensors import safe_open
from transformers import (DynamicCache, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

try:  # Qwen3 (per-head q/k RMSNorm) needs transformers >= 4.51, hence torch >= 2
    from transformers import Qwen3Config, Qwen3ForCausalLM
except ImportError:
    Qwen3Config = Qwen3ForCausalLM = None
from transformers import Phi3Config, Phi3ForCausalLM, SmolLM3Config, SmolLM3ForCausalLM
from transformers import MistralConfig, MistralForCausalLM

try:  # Gemma 2 needs transformers >= 4.42
    from transformers import Gemma2Config, Gemma2ForCausalLM
except ImportError:
    Gemma2Config = Gemma2ForCausalLM = None
try:  # Gemma 3 (text-only, model_type gemma3_text) needs transformers >= 4.50
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
except ImportError:
    Gemma3TextConfig = Gemma3ForCausalLM = None
try:  # Gemma 3's multimodal form (model_type gemma3), as Gemma 3 4B/12B/27B ship
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
except ImportError:
    Gemma3Config = Gemma3ForConditionalGeneration = None

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "fixtures")

PROMPT_LENGTHS = (1, 7, 20)
NUM_GENERATE = 32
MIN_MARGIN = 1e-3
MAX_SEED_TRIES = 50
INIT_STD = 0.25          # HF default is 0.02: far too flat for greedy margins
NORM_STD = 0.1           # RMSNorm weights are 1 + NORM_STD * N(0, 1)
BIAS_STD = 0.1           # Qwen2 q/k/v biases are BIAS_STD * N(0, 1)
MAX_FIXTURE_BYTES = 1 << 20

ARCHES = {
    "LlamaForCausalLM": (LlamaConfig, LlamaForCausalLM),
    "MistralForCausalLM": (MistralConfig, MistralForCausalLM),
    "Qwen2ForCausalLM": (Qwen2Config, Qwen2ForCausalLM),
    "Qwen3ForCausalLM": (Qwen3Config, Qwen3ForCausalLM),
    "Phi3ForCausalLM": (Phi3Config, Phi3ForCausalLM),
    "SmolLM3ForCausalLM": (SmolLM3Config, SmolLM3ForCausalLM),
    "Gemma2ForCausalLM": (Gemma2Config, Gemma2ForCausalLM),
    "Gemma3ForCausalLM": (Gemma3TextConfig, Gemma3ForCausalLM),
    "Gemma3ForConditionalGeneration": (Gemma3Config, Gemma3ForConditionalGeneration),
}
# Gemma's RMSNorm scales by (1 + weight), not weight: its norm weights are drawn as
# NORM_STD * N(0, 1) so that the effective scale is ~1 (~final_norm_scale for the final
# norm), as for the other archs (the text model's norms and the multimodal projector's
# mm_soft_emb_norm, not the SigLIP vision tower's LayerNorms)
GEMMA_NORM_ARCHES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM",
                     "Gemma3ForConditionalGeneration")
# Multimodal wrappers (a spec config with a nested text_config): where the text model's
# parameters sit in the module (TEXT_PARAM_PREFIX; "model." for the causal LMs) and under
# which prefix save_pretrained writes its tensors (TEXT_CKPT_PREFIX; "" for the causal
# LMs: "model.layers.N...", "lm_head.weight"). transformers 5.25 saves
# Gemma3ForConditionalGeneration's text model as the published Gemma 3 checkpoints name it,
# language_model.model.* (its module is model.language_model.*), beside
# multi_modal_projector.* and vision_tower.* (the published ones:
# vision_tower.vision_model.*; the engine reads neither)
TEXT_PARAM_PREFIX = {"Gemma3ForConditionalGeneration": "model.language_model."}
TEXT_CKPT_PREFIX = {"Gemma3ForConditionalGeneration": "language_model."}
VISION_PARAM_PREFIX = "model.vision_tower."

DTYPE_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16",
                      torch.float16: "F16"}

# Gemma 3's text model (gemma3-local-f32's config, and gemma3-mm-f32's text_config)
GEMMA3_TEXT_CONFIG = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_hidden_layers=6,
    intermediate_size=96,
    vocab_size=256,
    hidden_activation="gelu_pytorch_tanh",
    query_pre_attn_scalar=24,
    sliding_window=8,
    layer_types=["sliding_attention"] * 5 + ["full_attention"],
    attn_logit_softcapping=None,
    final_logit_softcapping=None,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=256,
    rope_parameters=dict(
        full_attention=dict(rope_type="linear", rope_theta=1000000.0, factor=8.0),
        sliding_attention=dict(rope_type="default", rope_theta=10000.0)),
)

FIXTURES = [
    dict(
        name="llama-gqa-f32",
        arch="LlamaForCausalLM",
        dtype=torch.float32,
        base_seed=1000,
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=172,  # deliberately not a multiple of 8
            vocab_size=300,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            max_position_embeddings=256,
        ),
    ),
    dict(
        name="qwen2-bias-bf16",
        arch="Qwen2ForCausalLM",
        dtype=torch.bfloat16,
        base_seed=2000,
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            num_hidden_layers=2,
            intermediate_size=128,
            vocab_size=256,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=256,
        ),
    ),
    dict(
        name="llama-mha-f16",
        arch="LlamaForCausalLM",
        dtype=torch.float16,
        base_seed=3000,
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_hidden_layers=3,
            intermediate_size=128,
            vocab_size=256,
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=256,
        ),
    ),
    dict(
        # q/k RMSNorm per head before RoPE; head_dim 32 with 4 heads: the q width (128) is
        # not hidden_size (64), as in Qwen3-0.6B (1024 hidden, 16 x 128)
        name="qwen3-qknorm-bf16",
        arch="Qwen3ForCausalLM",
        dtype=torch.bfloat16,
        base_seed=4010,  # the first seed of 4000.. whose greedy margin is > 0.02
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_hidden_layers=2,
            intermediate_size=96,
            vocab_size=256,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            attention_bias=False,
            tie_word_embeddings=True,
            max_position_embeddings=256,
        ),
    ),
    dict(
        # Llama 3.1's rope scaling: with head_dim 16, theta 5e5 and an original context of
        # 64, dim pair 0 keeps its frequency, pair 1 is smoothed, pairs 2-7 are divided by 8
        name="llama3-rope-f32",
        arch="LlamaForCausalLM",
        dtype=torch.float32,
        base_seed=5001,  # 5000 had a greedy margin of 0.005
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=128,
            vocab_size=256,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            max_position_embeddings=256,
            rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                 low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=64),
        ),
    ),
    dict(
        # YaRN, as Qwen3's model card enables it for long contexts: head_dim 32, theta 1e6,
        # an original context of 64: pair 0 extrapolated, 1-2 on the ramp, 3-15 divided by
        # 4; cos/sin scaled by 1 + 0.1 ln 4
        name="qwen3-yarn-f32",
        arch="Qwen3ForCausalLM",
        dtype=torch.float32,
        base_seed=6004,  # 6000-6003 had greedy margins of 0.002-0.011
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_hidden_layers=2,
            intermediate_size=96,
            vocab_size=256,
            rms_norm_eps=1e-6,
            attention_bias=False,
            tie_word_embeddings=True,
            max_position_embeddings=256,
            rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                                 original_max_position_embeddings=64),
        ),
    ),
    dict(
        # Phi-3's fused qkv_proj and gate_up_proj, with Phi-4-mini's partial rotary (0.75 of
        # head_dim 16: the rope turns 12 dims)
        name="phi3-fused-f32",
        arch="Phi3ForCausalLM",
        dtype=torch.float32,
        base_seed=7004,  # the first seed of 7000.. with a greedy margin above 0.01
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            vocab_size=256,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            max_position_embeddings=256,
            original_max_position_embeddings=256,
            sliding_window=None,
            partial_rotary_factor=0.75,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                 partial_rotary_factor=0.75),
            pad_token_id=0,
        ),
    ),
    dict(
        # Phi-3.5 / Phi-4-mini's longrope over an original context of 16 (factor 256/16, so
        # cos/sin scaled by sqrt(2)): transformers takes the short factors for a sequence of
        # at most 16 positions, the long ones past that, and switches within a cached
        # decode, which no engine does (they choose by their context length): no greedy
        # oracle, and test_oracle checks each prompt against a plan on its side
        name="phi3-longrope-f32",
        arch="Phi3ForCausalLM",
        dtype=torch.float32,
        base_seed=8000,
        greedy=False,
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            vocab_size=256,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            max_position_embeddings=256,
            original_max_position_embeddings=16,
            sliding_window=None,
            partial_rotary_factor=0.75,
            rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                 partial_rotary_factor=0.75,
                                 original_max_position_embeddings=16,
                                 short_factor=[1.0, 1.1, 1.3, 1.7, 2.2, 3.0],
                                 long_factor=[1.0, 1.5, 3.0, 6.0, 12.0, 24.0]),
            pad_token_id=0,
        ),
    ),
    dict(
        # SmolLM3's NoPE layers: no rope in layer 4 (the interval 4 llama.cpp fixes for the
        # arch, so the GGUF form says the same)
        name="smollm3-nope-f32",
        arch="SmolLM3ForCausalLM",
        dtype=torch.float32,
        base_seed=9001,  # 9000 had a greedy margin of 0.0035
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=4,
            intermediate_size=96,
            vocab_size=256,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=256,
            no_rope_layer_interval=4,
            use_sliding_window=False,
            rope_parameters=dict(rope_type="default", rope_theta=5000000.0),
            pad_token_id=0,
        ),
    ),
    dict(
        # Gemma 2: embeddings scaled by sqrt(hidden_size), RMSNorm by (1 + w), sandwich
        # norms (pre/post attention and feed-forward), GeGLU with tanh GELU, attention scale
        # query_pre_attn_scalar**-0.5 (24, not head_dim 16), tanh softcaps on the attention
        # scores (5) and the final logits (10), sliding-window layers 0 and 2 (window 8:
        # the 20-token prompt and the greedy decode exceed it), full layers 1 and 3
        name="gemma2-softcap-f32",
        arch="Gemma2ForCausalLM",
        dtype=torch.float32,
        base_seed=10009,  # the first seed of 10000.. whose greedy margin is > 0.02
        # The input embeddings are multiplied by sqrt(hidden_size) = 8: drawn with INIT_STD
        # they dominate the residual and the tied head hands the input token back (every
        # greedy run repeats one token). A smaller embedding std keeps the continuations
        # varied; the final norm's (1 + w) ~ 8 restores the logits' spread
        embed_std=0.05,
        final_norm_scale=8.0,
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=4,
            intermediate_size=96,
            vocab_size=256,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=24,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=10.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            max_position_embeddings=256,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
    ),
    dict(
        # Gemma 3 (the text-only gemma3_text form of Gemma 3 1B): Gemma 2's layout without
        # softcaps, plus per-head q/k RMSNorm (1 + w); layers 0-4 sliding (window 8, rope
        # theta 1e4), layer 5 full (theta 1e6 with linear rope scaling 8, as Gemma 3
        # 4B/12B/27B): rope_parameters keyed by layer type
        name="gemma3-local-f32",
        arch="Gemma3ForCausalLM",
        dtype=torch.float32,
        base_seed=11001,  # the first seed of 11000.. whose greedy margin is > 0.02
        # as for gemma2-softcap-f32
        embed_std=0.05,
        final_norm_scale=8.0,
        config=GEMMA3_TEXT_CONFIG,
    ),
    dict(
        # Gemma 3 4B/12B/27B's checkpoint form: Gemma3ForConditionalGeneration (model_type
        # gemma3), whose text_config is gemma3-local-f32's config, beside a tiny SigLIP
        # vision tower (one layer, hidden 32, a 14x14 image in 2x2 patches of 7, no head,
        # as Gemma 3's) and the projector (mm_tokens_per_image 4: the 2x2 patches pooled
        # by 1). The oracle is the text-only forward of that class (input_ids, no
        # pixel_values). Gemma3Config's image / begin-of-image / end-of-image token ids
        # default to 262144 / 255999 / 256000, outside the 256-token vocab; they are set
        # to 253 / 254 / 255, inside it as in the published checkpoints (image token
        # 262144 of 262208), and the prompts are drawn from ids 0-252 so that they never
        # hold one. Without pixel_values transformers embeds any id as a text token
        # (nothing is scattered in, the mask stays causal); this seed's greedy
        # continuations hold none of 253-255 either
        name="gemma3-mm-f32",
        arch="Gemma3ForConditionalGeneration",
        dtype=torch.float32,
        # 12003 is the first seed of 12000.. whose greedy margin is > 0.02, but one of its
        # continuations settles into a two-token loop; 12007 is the next (margin 0.029)
        base_seed=12007,
        prompt_vocab=253,
        # as for gemma3-local-f32 (the text model's embeddings and final norm)
        embed_std=0.05,
        final_norm_scale=8.0,
        config=dict(
            text_config=GEMMA3_TEXT_CONFIG,
            vision_config=dict(
                model_type="siglip_vision_model",
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=14,
                patch_size=7,
                vision_use_head=False,
            ),
            mm_tokens_per_image=4,
            image_token_index=253,
            boi_token_index=254,
            eoi_token_index=255,
            tie_word_embeddings=True,
        ),
    ),
    dict(
        # Mistral 7B v0.1's sliding window in every layer (window 8: the 20-token prompt
        # and the greedy decode exceed it), which a context capped at the window cannot
        # express past its length
        name="mistral-swa-f32",
        arch="MistralForCausalLM",
        dtype=torch.float32,
        base_seed=13000,
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            vocab_size=256,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            max_position_embeddings=256,
            sliding_window=8,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            pad_token_id=0,
        ),
    ),
    dict(
        # Qwen2's use_sliding_window: layers from max_window_layers on attend a window
        # (8 here, over layers 1 and 2), the ones before it all positions
        name="qwen2-swa-f32",
        arch="Qwen2ForCausalLM",
        dtype=torch.float32,
        base_seed=14000,
        config=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=3,
            intermediate_size=96,
            vocab_size=256,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            max_position_embeddings=256,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=1,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            pad_token_id=0,
        ),
    ),
]


# --------------------------------------------------------------------------
# Model construction and checkpoint round trip
# --------------------------------------------------------------------------

def text_config(spec):
    """The text model's config: the spec's nested text_config, else its config."""
    return spec["config"].get("text_config", spec["config"])


def build_random_model(spec, seed):
    """Instantiate the model and overwrite every parameter with seeded noise."""
    config_cls, model_cls = ARCHES[spec["arch"]]
    kwargs = dict(spec["config"])
    if "text_config" in kwargs:  # the text model's config.json as a causal LM's
        kwargs["text_config"] = dict(kwargs["text_config"], initializer_range=INIT_STD)
    config = config_cls(initializer_range=INIT_STD, **kwargs)
    model = model_cls(config)
    prefix = TEXT_PARAM_PREFIX.get(spec["arch"], "model.")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # Sorted names give a fixed draw order; tied lm_head is the same
        # tensor as embed_tokens and is not listed separately. A multimodal
        # wrapper's text model (model.language_model.*) sorts before its projector
        # and vision tower: its draws are a causal LM's for the same seed.
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen)
            if name.startswith(VISION_PARAM_PREFIX):
                # SigLIP (never run by the oracle): LayerNorm weights ~ 1, biases
                # and the rest as for the text model
                if name.endswith(".bias"):
                    param.copy_(BIAS_STD * noise)
                elif "norm" in name.split(".")[-2]:
                    param.copy_(1.0 + NORM_STD * noise)
                else:
                    param.copy_(INIT_STD * noise)
            elif name.endswith("norm.weight"):
                # Gemma's RMSNorm scales by (1 + weight): draw the weight itself around
                # 0 (or around final_norm_scale - 1 for the final norm), not around 1
                scale = spec.get("final_norm_scale", 1.0) \
                    if name == prefix + "norm.weight" else 1.0
                offset = scale - 1.0 if spec["arch"] in GEMMA_NORM_ARCHES else scale
                param.copy_(offset + NORM_STD * noise)
            elif name.endswith(".bias"):
                param.copy_(BIAS_STD * noise)
            elif name == prefix + "embed_tokens.weight":
                param.copy_(spec.get("embed_std", INIT_STD) * noise)
            else:
                param.copy_(INIT_STD * noise)
    return model.eval()


def save_checkpoint(model, dtype, out_dir):
    """save_pretrained in the target dtype; keep only config + safetensors."""
    model.to(dtype).save_pretrained(out_dir, safe_serialization=True)
    for fname in os.listdir(out_dir):
        if fname not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(out_dir, fname))


def make_world_readable(out_dir):
    """Temp dirs/files are created 0700/0600; fixtures should be 0755/0644."""
    os.chmod(out_dir, 0o755)
    for fname in os.listdir(out_dir):
        os.chmod(os.path.join(out_dir, fname), 0o644)


def check_checkpoint(spec, ckpt_dir):
    """Tied models must not store lm_head; all tensors in the saved dtype."""
    path = os.path.join(ckpt_dir, "model.safetensors")
    want = SAFETENSORS_DTYPES[spec["dtype"]]
    with safe_open(path, framework="pt") as f:
        keys = list(f.keys())
        for key in keys:
            got = f.get_slice(key).get_dtype()
            assert got == want, f"{key}: dtype {got}, expected {want}"
    pre = TEXT_CKPT_PREFIX.get(spec["arch"], "")
    if pre:  # a multimodal wrapper: the text model, vision tower and projector
        assert all(k.startswith((pre + "model.", "vision_tower.", "multi_modal_projector."))
                   or k == pre + "lm_head.weight" for k in keys), \
            f"unexpected tensor names: {keys}"
        assert any(k.startswith("vision_tower.") for k in keys)
        assert pre + "model.embed_tokens.weight" in keys
    tied = text_config(spec)["tie_word_embeddings"]
    assert (pre + "lm_head.weight" in keys) == (not tied), \
        f"{pre}lm_head.weight presence wrong for tie_word_embeddings={tied}"
    assert not tied or not any(k.endswith("lm_head.weight") for k in keys)
    if spec["arch"] == "Qwen2ForCausalLM":
        assert "model.layers.0.self_attn.q_proj.bias" in keys
    if spec["arch"] == "Qwen3ForCausalLM":
        assert "model.layers.0.self_attn.q_norm.weight" in keys
        assert "model.layers.0.self_attn.q_proj.bias" not in keys
    if spec["arch"] in GEMMA_NORM_ARCHES:
        assert pre + "model.layers.0.pre_feedforward_layernorm.weight" in keys
        assert pre + "model.layers.0.post_feedforward_layernorm.weight" in keys
        assert (pre + "model.layers.0.self_attn.q_norm.weight" in keys) == \
            (spec["arch"] != "Gemma2ForCausalLM")
    return len(keys)


def reload_f32(spec, ckpt_dir):
    _, model_cls = ARCHES[spec["arch"]]
    model = model_cls.from_pretrained(ckpt_dir, torch_dtype=torch.float32,
                                      attn_implementation="eager")
    assert next(model.parameters()).dtype == torch.float32
    if "text_config" in spec["config"]:  # eager reaches the wrapped text model
        assert model.config.text_config._attn_implementation == "eager"
    return model.eval()


# --------------------------------------------------------------------------
# Oracle computation (float32, eager attention)
# --------------------------------------------------------------------------

def make_prompts(vocab_size, seed):
    gen = torch.Generator().manual_seed(seed + 1)
    return [torch.randint(0, vocab_size, (n,), generator=gen).tolist()
            for n in PROMPT_LENGTHS]


def full_logits(model, ids):
    """Logits [len(ids), vocab] from one forward over the whole sequence."""
    out = model(torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()


def top2_margin(logits):
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def greedy_with_cache(model, prompt):
    """Greedy decode NUM_GENERATE tokens with a KV cache (no EOS stop).

    Returns (tokens, min top1-top2 margin, per-step logits)."""
    cache = DynamicCache()
    out = model(torch.tensor([prompt]), past_key_values=cache, use_cache=True)
    tokens, steps, margin = [], [], float("inf")
    for _ in range(NUM_GENERATE):
        logits = out.logits[0, -1].float()
        steps.append(logits)
        margin = min(margin, top2_margin(logits))
        tok = int(torch.argmax(logits))
        tokens.append(tok)
        out = model(torch.tensor([[tok]]), past_key_values=out.past_key_values,
                    use_cache=True)
    return tokens, margin, steps


def check_greedy_consistency(model, prompt, tokens, cached_steps):
    """A full forward over prompt+greedy must reproduce the greedy tokens."""
    logits = full_logits(model, prompt + tokens)
    n = len(prompt)
    preds = torch.argmax(logits[n - 1:n - 1 + len(tokens)], dim=-1).tolist()
    assert preds == tokens, f"KV-cache vs full-forward greedy mismatch: " \
                            f"{tokens} vs {preds}"
    diff = max(float((logits[n - 1 + i] - step).abs().max())
               for i, step in enumerate(cached_steps))
    assert diff < 1e-3, f"cached vs full logits differ by {diff}"
    return diff


@torch.no_grad()
def compute_oracle(model, prompts, with_greedy=True):
    logits, greedy, margin, max_diff = [], [], float("inf"), 0.0
    for prompt in prompts:
        logits.append(full_logits(model, prompt))
        if not with_greedy:  # the margin of the prompt's last logits only
            margin = min(margin, top2_margin(logits[-1][-1]))
            continue
        tokens, m, steps = greedy_with_cache(model, prompt)
        max_diff = max(max_diff,
                       check_greedy_consistency(model, prompt, tokens, steps))
        greedy.append(tokens)
        margin = min(margin, m)
    return logits, greedy, margin, max_diff


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

def f32_round_trip(x):
    """Shortest-ish decimal that round-trips a float32 ('%.9g')."""
    return float("%.9g" % x)


def write_oracle(path, fields):
    """One top-level key per line; each value as compact JSON."""
    lines = ["  %s: %s" % (json.dumps(k), json.dumps(v, separators=(",", ":")))
             for k, v in fields.items()]
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


def generate_fixture(spec, out_root):
    # prompt_vocab: prompts draw ids below it (gemma3-mm-f32 keeps its image tokens out)
    vocab = spec.get("prompt_vocab", text_config(spec)["vocab_size"])
    for seed in range(spec["base_seed"], spec["base_seed"] + MAX_SEED_TRIES):
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(seed)
            model = build_random_model(spec, seed)
            save_checkpoint(model, spec["dtype"], tmp)
            num_tensors = check_checkpoint(spec, tmp)
            model = reload_f32(spec, tmp)
            prompts = make_prompts(vocab, seed)
            logits, greedy, margin, max_diff = compute_oracle(model, prompts,
                                                              spec.get("greedy", True))
            if margin < MIN_MARGIN:
                print(f"  {spec['name']}: seed {seed} margin {margin:.3g} "
                      f"< {MIN_MARGIN}, trying next seed")
                continue
            out_dir = os.path.join(out_root, spec["name"])
            if os.path.isdir(out_dir):
                shutil.rmtree(out_dir)
            shutil.copytree(tmp, out_dir)
            make_world_readable(out_dir)
        break
    else:
        sys.exit(f"{spec['name']}: no seed with margin >= {MIN_MARGIN}")

    write_oracle(os.path.join(out_dir, "oracle.json"), {
        "model": spec["name"],
        "architecture": spec["arch"],
        "saved_dtype": DTYPE_NAMES[spec["dtype"]],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "prompts": prompts,
        "greedy": greedy,
        "greedy_min_margin": margin,
        "logits": [[[f32_round_trip(x) for x in row] for row in seq.tolist()]
                   for seq in logits],
    })
    return dict(name=spec["name"], seed=seed, margin=margin,
                max_diff=max_diff, num_tensors=num_tensors, dir=out_dir,
                logit_absmax=max(float(l.abs().max()) for l in logits))


def print_summary(results):
    print("\n%-18s %5s %10s %9s %8s  files" %
          ("fixture", "seed", "margin", "|logit|", "total"))
    for r in results:
        sizes = {f: os.path.getsize(os.path.join(r["dir"], f))
                 for f in sorted(os.listdir(r["dir"]))}
        total = sum(sizes.values())
        files = ", ".join(f"{f} {s / 1024:.1f}K" for f, s in sizes.items())
        print("%-18s %5d %10.4f %9.2f %7.1fK  %s" %
              (r["name"], r["seed"], r["margin"], r["logit_absmax"],
               total / 1024, files))
        print("%-18s kv-cache vs full-forward max |dlogit| = %.2e, "
              "%d tensors" % ("", r["max_diff"], r["num_tensors"]))
        assert total < MAX_FIXTURE_BYTES, f"{r['name']} is {total} bytes"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="fixture root (default: tests/fixtures)")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="generate only this fixture (repeatable)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"safetensors {safetensors.__version__}")
    os.makedirs(args.out, exist_ok=True)
    results = []
    for spec in FIXTURES:
        if args.only and spec["name"] not in args.only:
            continue
        if ARCHES[spec["arch"]][0] is None:
            sys.exit(f"{spec['name']}: transformers {transformers.__version__} has no "
                     f"{spec['arch']}")
        print(f"generating {spec['name']} ...")
        results.append(generate_fixture(spec, args.out))
    print_summary(results)


if __name__ == "__main__":
    main()
