#!/usr/bin/python3
"""Generate the text fixture: a tiny random Llama whose vocabulary is the trained
byte-level BPE tokenizer of tests/fixtures/tokenizers/gpt2, with HF transformers'
text-in/text-out results as the oracle for `inferrt generate --prompt/--chat`.

Run (like tools/gen_fixtures.py; Debian python3-torch + pinned transformers):
    /usr/bin/python3 tools/gen_text_fixture.py
Writes tests/fixtures/llama-text/{config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, oracle.json}.
"""
import json
import os
import shutil

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOK_DIR = os.path.join(ROOT, "tests", "fixtures", "tokenizers", "gpt2")
OUT = os.path.join(ROOT, "tests", "fixtures", "llama-text")
N_NEW = 24
PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,",
           "def main():\n    print(\"hello\")"]
CHATS = [[{"role": "user", "content": "Hello! Who are you?"}],
         [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Name a color."}]]


def build(tok, seed):
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, initializer_range=0.3)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return model


def greedy(model, ids):
    """Greedy continuation (EOS does not stop it) and the smallest top1-top2 gap."""
    ids = list(ids)
    out, margin = [], float("inf")
    with torch.no_grad():
        for _ in range(N_NEW):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
            out.append(ids[-1])
    return out, margin


def main():
    tok = PreTrainedTokenizerFast.from_pretrained(TOK_DIR)
    for seed in range(4000, 4100):
        model = build(tok, seed)
        model.to(torch.bfloat16).save_pretrained(OUT, safe_serialization=True)
        model = LlamaForCausalLM.from_pretrained(OUT, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
        cases, worst = [], float("inf")
        for text in PROMPTS:
            ids = tok(text).input_ids
            gen, m = greedy(model, ids)
            worst = min(worst, m)
            cases.append({"prompt": text, "prompt_ids": ids, "generated_ids": gen,
                          "text": tok.decode(gen, skip_special_tokens=True)})
        for msgs in CHATS:
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            gen, m = greedy(model, ids)
            worst = min(worst, m)
            cases.append({"chat": msgs, "prompt_ids": ids, "generated_ids": gen,
                          "text": tok.decode(gen, skip_special_tokens=True)})
        if worst >= 1e-3:
            break
    for f in ("generation_config.json",):
        if os.path.exists(os.path.join(OUT, f)):
            os.remove(os.path.join(OUT, f))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK_DIR, f), os.path.join(OUT, f))
    with open(os.path.join(OUT, "oracle.json"), "w", encoding="utf-8") as f:
        json.dump({"seed": seed, "transformers_version": transformers.__version__,
                   "torch_version": torch.__version__, "greedy_min_margin": worst,
                   "cases": cases}, f, ensure_ascii=False, indent=1)
    print(f"seed {seed}, margin {worst:.4f}, {len(cases)} cases")


if __name__ == "__main__":
    main()
