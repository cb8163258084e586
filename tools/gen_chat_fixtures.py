#!/usr/bin/env python3
"""Renders reference chat templates with Jinja2 (as HF transformers' apply_chat_template
does: trim_blocks, lstrip_blocks, bos/eos tokens, add_generation_prompt) over a few
conversations, and writes tests/fixtures/chat/chat_templates.json: the oracle for the
engine's C renderer (text/chat_template.c), which must detect each family from the
template source and produce the same text.

Also writes tests/fixtures/chat/tool_calls.json: conversations with tools, tool calls and
tool results rendered by Qwen2.5-7B-Instruct's real template (from llama.cpp's
models/templates, in the llama-cpp-python source distribution that tools/get-llama-vocabs
fetches), after vLLM's own preprocessing (a call's "arguments" string parsed to an object),
with transformers' tojson filter: the oracle for the server's tools prompt.

Gemma 3's template is not among llama.cpp's there: it is transformers' own, the one its
Gemma 3 converter writes into the released tokenizers (google/gemma-3-*-it), copied below.

Run: python3 tools/gen_chat_fixtures.py   (needs jinja2: pip install jinja2)
"""
import glob
import json
import os
import tarfile

import jinja2

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "chat", "chat_templates.json")
TOOLS_OUT = os.path.join(HERE, "..", "tests", "fixtures", "chat", "tool_calls.json")
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "infc")


def llama_cpp_template(name):
    """A template from llama.cpp's models/templates in the cached llama-cpp-python sdist."""
    sdists = sorted(glob.glob(os.path.join(CACHE, "llama_cpp_python-*.tar.gz")))
    if not sdists:
        raise SystemExit("no llama-cpp-python sdist in the cache: run tools/get-llama-vocabs")
    with tarfile.open(sdists[-1]) as tar:
        member = next(m for m in tar.getmembers()
                      if m.name.endswith("vendor/llama.cpp/models/templates/" + name))
        return tar.extractfile(member).read().decode("utf-8")


QWEN25 = llama_cpp_template("Qwen-Qwen2.5-7B-Instruct.jinja")
LLAMA31 = llama_cpp_template("meta-llama-Llama-3.1-8B-Instruct.jinja")
LLAMA32 = llama_cpp_template("meta-llama-Llama-3.2-3B-Instruct.jinja")
QWEN3 = llama_cpp_template("Qwen-Qwen3-0.6B.jinja")
# DeepSeek-R1-Distill-Qwen's template as llama.cpp keeps it: the model's own, plus an
# enable_thinking switch whose absence closes the thought; rendered with enable_thinking
# true it is the model's (which always opens "<think>\n"), with false llama.cpp's
R1 = llama_cpp_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
R1_BOS, R1_EOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
# What strftime_now gives in these renderings (transformers passes the day of rendering);
# the C test renders with the same fixed day.
FIXED_DAY = "01 Dec 2026"
QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

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

# Gemma 2's real template (gemma-2-2b-it): raises on a system message and on roles that do
# not alternate user/model.
GEMMA2 = llama_cpp_template("google-gemma-2-2b-it.jinja")

# Gemma 3's template, verbatim: _CHAT_TEMPLATE of huggingface/transformers
# src/transformers/models/gemma3/convert_gemma3_weights_orbax_to_hf.py (commit 58827fc9),
# which that converter saves as the tokenizer's chat_template: the one google/gemma-3-1b-it's
# tokenizer_config.json carries (not fetched from the Hub here; Google's LiteRT-LM keeps the
# same text as its Gemma 3 default). A non-raw string, as there: its '\n' are newlines. A
# leading system message's text and a blank line open the first turn (the system text not
# trimmed, the turn's own text trimmed); roles must then alternate user/model.
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
        "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")

TEMPLATES = [
    ("smollm2", "chatml", SMOLLM2, "<|im_start|>", "<|im_end|>", True),
    ("qwen2", "chatml", QWEN2, "<|endoftext|>", "<|im_end|>", True),
    ("qwen2.5", "chatml", QWEN25, "<|endoftext|>", "<|im_end|>", True),
    ("chatml-plain", "chatml", CHATML_PLAIN, "<s>", "</s>", True),
    ("llama3", "llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>", True),
    ("llama3.1", "llama3.1", LLAMA31, "<|begin_of_text|>", "<|eot_id|>", True),
    ("llama3.2", "llama3.1", LLAMA32, "<|begin_of_text|>", "<|eot_id|>", True),
    ("mistral", "mistral", MISTRAL, "<s>", "</s>", True),
    ("llama2", "llama2", LLAMA2, "<s>", "</s>", True),
    ("gemma", "gemma", GEMMA, "<bos>", "<eos>", False),
    ("gemma2", "gemma", GEMMA2, "<bos>", "<eos>", False),
    ("gemma3", "gemma", GEMMA3, "<bos>", "<eos>", True),
    ("phi3", "phi3", PHI3, "<s>", "<|endoftext|>", True),
    ("qwen3", "qwen3", QWEN3, "<|endoftext|>", "<|im_end|>", True),
    ("deepseek-r1", "deepseek-r1", R1, R1_BOS, R1_EOS, True),
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
    # thinking models' turns (Qwen3's template reworks them; the others render them as is):
    # a past turn's thoughts dropped, the last turn's kept in canonical form
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "<think>\nAdd them.\n\n</think>\n\n4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "system", "content": "Think briefly."},
     {"role": "user", "content": "Name a prime."},
     {"role": "assistant", "content": "\n<think>\nTwo is prime.</think>\n2"}],
    # thoughts given apart (reasoning_content, as clients send back what the server split)
    [{"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "\n\nHello!", "reasoning_content": "\nGreet back.\n"},
     {"role": "user", "content": "Bye"},
     {"role": "assistant", "content": "Goodbye.", "reasoning_content": ""}],
    # a tool result is not a query: the turn before it keeps its thoughts
    [{"role": "user", "content": "Weather?"},
     {"role": "assistant", "content": "<think>\nAsk the tool.\n</think>\n\nChecking."},
     {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"},
     {"role": "assistant", "content": "No thoughts here."},
     {"role": "user", "content": "<tool_response>\nwarm\n</tool_response>"}],
]

# Rendered by the gemma family's templates alone: a system message's text untrimmed before a
# trimmed turn, an empty one (a bare blank line), one with no turn to open (dropped), and a
# later one (a "system" turn of its own, where the roles still alternate)
GEMMA_CONVERSATIONS = [
    [{"role": "system", "content": "  Be brief.\n"},
     {"role": "user", "content": "\n Hi "},
     {"role": "assistant", "content": " Hello. "},
     {"role": "user", "content": "Bye"}],
    [{"role": "system", "content": ""},
     {"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Only a system prompt."}],
    [{"role": "user", "content": "Hi"},
     {"role": "system", "content": " Mind the time. "},
     {"role": "user", "content": "What time is it?"}],
]


def raise_exception(message):
    """transformers' raise_exception global (a template's own error)."""
    raise jinja2.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson filter (apply_chat_template), not Jinja's HTML-escaping one."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def render(source, bos, eos, messages, gen, tools=None, enable_thinking=None):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    kw = {"tools": tools} if tools is not None else {}
    if enable_thinking is not None:  # a chat_template_kwargs entry, as vLLM passes it
        kw["enable_thinking"] = enable_thinking
    return env.from_string(source).render(messages=messages, bos_token=bos, eos_token=eos,
                                          add_generation_prompt=gen,
                                          strftime_now=lambda fmt: FIXED_DAY, **kw)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Heure locale d'une ville — en français",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "utc": {
        "type": "boolean"}, "offset": {"type": "number"}, "tags": {
        "type": "array", "items": {"type": "string"}}}, "required": ["city"]}}}
NOPARAMS = {"type": "function", "function": {"name": "ping"}}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


TOOL_CONVERSATIONS = [
    ([WEATHER], [{"role": "system", "content": "You are terse."},
                 {"role": "user", "content": "Weather in Paris?"}]),
    ([WEATHER, TIME, NOPARAMS], [{"role": "user", "content": "Weather and time in Oslo?"}]),
    ([WEATHER, TIME], [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Weather and time in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("call_1", "get_weather", {"city": "Oslo", "days": 2}),
            call("call_2", "get_time", {"city": "Oslo", "utc": False, "offset": 1.5,
                                        "tags": ["a\"b", "ø\n"]})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": -3}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "09:41"},
        {"role": "assistant", "content": "It is -3 and 09:41."},
        {"role": "user", "content": "And Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            call("call_3", "get_weather", {"city": "Rome"})]},
        {"role": "tool", "tool_call_id": "call_3", "content": "{\"temp\": 21}"},
        {"role": "user", "content": "Thanks"}]),
]


# Qwen3 (the Hermes form, no default system prompt): thoughts before a call, and thoughts
# given apart (reasoning_content) on a turn before the last query.
QWEN3_TOOL_CONVERSATIONS = TOOL_CONVERSATIONS + [
    ([WEATHER], [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "<think>\nCall the tool.\n</think>\n\n", "tool_calls": [
            call("call_1", "get_weather", {"city": "Rome"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]),
    ([WEATHER], [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call it.", "tool_calls": [
            call("call_1", "get_weather", {"city": "Rome"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "21 degrees.", "reasoning_content": "Read it."},
        {"role": "user", "content": "Thanks"}]),
]


def vllm_messages(messages):
    """vLLM parses each call's arguments string to an object before the template sees it."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        if m.get("content") is None:
            m["content"] = ""
    return out


# Llama 3.1's template takes one call per assistant message.
LLAMA_TOOL_CONVERSATIONS = [
    ([WEATHER], [{"role": "user", "content": "  Weather in Paris?\n"}]),
    ([WEATHER, TIME, NOPARAMS], [
        {"role": "system", "content": "Use the tools. "},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "ignored", "tool_calls": [
            call("call_1", "get_weather", {"city": "Oslo", "days": 2})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": -3, \"note\": \"ø\"}"},
        {"role": "assistant", "content": "It is -3."},
        {"role": "user", "content": "And the time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("call_2", "get_time", {"city": "Oslo", "tags": []})]},
        {"role": "tool", "tool_call_id": "call_2", "content": "09:41"}]),
]


def tool_cases():
    """Each conversation as Qwen2.5 renders it, and as it renders it with no default system
    prompt (what a template without one, such as the test server's plain ChatML, gives);
    as Qwen3's template renders them and its thinking ones; then as Llama 3.1's template
    renders its conversations."""
    cases = []
    for tools, msgs in TOOL_CONVERSATIONS:
        for default in (QWEN25_SYSTEM, ""):
            src = QWEN25.replace(QWEN25_SYSTEM, default)
            cases.append({"template": "qwen2.5", "default_system": default, "tools": tools,
                          "messages": msgs,
                          "expected": render(src, "", "<|im_end|>", vllm_messages(msgs), True,
                                             tools)})
    for tools, msgs in QWEN3_TOOL_CONVERSATIONS:
        cases.append({"template": "qwen3", "default_system": "", "tools": tools,
                      "messages": msgs,
                      "expected": render(QWEN3, "", "<|im_end|>", vllm_messages(msgs), True,
                                         tools)})
    for tools, msgs in LLAMA_TOOL_CONVERSATIONS:
        cases.append({"template": "llama3.1", "default_system": "", "tools": tools,
                      "messages": msgs,
                      "expected": render(LLAMA31, "<|begin_of_text|>", "<|eot_id|>",
                                         vllm_messages(msgs), True, tools)})
    return cases


def main():
    cases = []
    conversations = CONVERSATIONS + GEMMA_CONVERSATIONS
    for name, kind, source, bos, eos, system_ok in TEMPLATES:
        for ci, conv in enumerate(conversations):
            if not system_ok and conv[0]["role"] == "system":
                continue
            if ci >= len(CONVERSATIONS) and kind != "gemma":
                continue
            think = True if kind == "deepseek-r1" else None
            for gen in (True, False):
                cases.append({"template": name, "kind": kind, "conversation": ci,
                              "add_generation_prompt": gen,
                              "expected": render(source, bos, eos, conv, gen,
                                                 enable_thinking=think)})
            if kind in ("qwen3", "deepseek-r1"):  # enable_thinking false: an empty thought
                cases.append({"template": name, "kind": kind, "conversation": ci,
                              "add_generation_prompt": True, "enable_thinking": False,
                              "expected": render(source, bos, eos, conv, True,
                                                 enable_thinking=False)})
    data = {"generator": "tools/gen_chat_fixtures.py", "jinja2_version": jinja2.__version__,
            "strftime_now": FIXED_DAY,
            "templates": {t[0]: {"kind": t[1], "source": t[2], "bos": t[3], "eos": t[4]}
                          for t in TEMPLATES},
            "conversations": conversations, "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT)}")
    tcases = tool_cases()
    with open(TOOLS_OUT, "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/gen_chat_fixtures.py", "template":
                   "Qwen-Qwen2.5-7B-Instruct.jinja, Qwen-Qwen3-0.6B.jinja, "
                   "meta-llama-Llama-3.1-8B-Instruct.jinja (llama.cpp models/templates)",
                   "jinja2_version": jinja2.__version__, "cases": tcases}, f, ensure_ascii=False,
                  indent=1)
    print(f"wrote {len(tcases)} cases to {os.path.relpath(TOOLS_OUT)}")


if __name__ == "__main__":
    main()
