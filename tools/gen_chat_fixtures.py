#!/usr/bin/env python3
"""Renders reference chat templates with Jinja2 (as HF transformers' apply_chat_template
does: trim_blocks, lstrip_blocks, bos/eos tokens, add_generation_prompt) over a few
conversations, and writes tests/fixtures/chat/chat_templates.json: the oracle for the
engine's C renderer (runtime/chat_template.c), which must detect each family from the
template source and produce the same text.

Run: python3 tools/gen_chat_fixtures.py   (needs jinja2: pip install jinja2)
"""
import json
import os

import jinja2

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "chat", "chat_templates.json")

# SmolLM2-135M-Instruct's template, verbatim from its GGUF (tokenizer.chat_template).
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
           "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")

QWEN2 = SMOLLM2.replace("You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                        "You are a helpful assistant.")

CHATML_PLAIN = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
          "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
          "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Mistral-Instruct v0.1 format; a leading system message is joined to the first user turn.
MISTRAL = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]"
           "['content'] + '\n\n' %}{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}"
           "{% set msgs = messages %}{% endif %}{% for message in msgs %}{% if message['role'] == "
           "'user' %}{{ '[INST] ' + (sys if loop.first else '') + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
           "{% endfor %}")

LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = "
          "messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
          "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
          "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
          "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

GEMMA = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}"
         "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
         "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
         "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
        "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")

TEMPLATES = [
    ("smollm2", "chatml", SMOLLM2, "<|im_start|>", "<|im_end|>", True),
    ("qwen2", "chatml", QWEN2, "<|endoftext|>", "<|im_end|>", True),
    ("chatml-plain", "chatml", CHATML_PLAIN, "<s>", "</s>", True),
    ("llama3", "llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>", True),
    ("mistral", "mistral", MISTRAL, "<s>", "</s>", True),
    ("llama2", "llama2", LLAMA2, "<s>", "</s>", True),
    ("gemma", "gemma", GEMMA, "<bos>", "<eos>", False),
    ("phi3", "phi3", PHI3, "<s>", "<|endoftext|>", True),
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name three primes."}],
    [{"role": "user", "content": "  Hi there!\n"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Write a haiku about the sea 🌊, s'il vous plaît."}],
    [{"role": "system", "content": "Answer in German."},
     {"role": "user", "content": "Good morning"},
     {"role": "assistant", "content": " Guten Morgen "},
     {"role": "user", "content": "Thanks\n\n"}],
]


def render(source, bos, eos, messages, gen):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env.from_string(source).render(messages=messages, bos_token=bos, eos_token=eos,
                                          add_generation_prompt=gen)


def main():
    cases = []
    for name, kind, source, bos, eos, system_ok in TEMPLATES:
        for ci, conv in enumerate(CONVERSATIONS):
            if not system_ok and conv[0]["role"] == "system":
                continue
            for gen in (True, False):
                cases.append({"template": name, "kind": kind, "conversation": ci,
                              "add_generation_prompt": gen,
                              "expected": render(source, bos, eos, conv, gen)})
    data = {"generator": "tools/gen_chat_fixtures.py", "jinja2_version": jinja2.__version__,
            "templates": {t[0]: {"kind": t[1], "source": t[2], "bos": t[3], "eos": t[4]}
                          for t in TEMPLATES},
            "conversations": CONVERSATIONS, "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
