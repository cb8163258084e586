#!/usr/bin/python3
"""Generate the tokenizer fixtures: small BPE tokenizers trained with HF `tokenizers`
on tests/fixtures/tokenizers/corpus.txt, and the ids HF gives for the corpus.

    /usr/bin/python3 tools/gen_tokenizer_fixtures.py [--llama-cpp-models DIR] [--only NAME ...]

Needs `tokenizers` (pinned in tools/requirements-fixtures.txt: install that into the
system interpreter as tools/gen_fixtures.py explains). CI never runs this; a developer
runs it and commits the output. Rerunning gives the same files. (Checked with 0.19.1 when
spm-gemma was added; tokenizers 0.23.3 trains the same models and gives the same ids but
saves merges as [a, b] pairs instead of "a b".)

With --llama-cpp-models DIR (the models/ folder of llama.cpp, e.g. from the sdist of
llama-cpp-python: vendor/llama.cpp/models) it also converts the real GPT-2 vocabulary
from ggml-vocab-gpt-2.gguf into a tokenizer.json (needs gguf-py: DIR/../gguf-py or
`pip install gguf`) and adds llama.cpp's test strings (ggml-vocab-gpt-2.gguf.inp), and
writes llama-spm-gguf/vocab.json: the Llama 2 vocabulary as GGUF stores it (scores, no
merges) with llama.cpp's test vectors for it.

--only NAME (repeatable) writes just those fixtures (the models are still all trained, as
later ones derive from earlier ones), so that one new fixture can be added without
rewriting the others' files.

Each fixture directory holds tokenizer.json, optionally tokenizer_config.json, and
expected.json:
  lines     ids of each corpus line (split after every '\\n'), encode(line) as HF's
            Tokenizer.encode does by default (add_special_tokens=True, special tokens in
            the text matched)
  whole     ids of the whole corpus
  decode    {line index: HF decode(ids, skip_special_tokens=True)} where it differs from
            the line (NFC normalization, the SPM leading space, ...)
  extra     [{text, ids, ids_plain (add_special_tokens=False), ids_noparse (special
            tokens in the text encoded as text: encode_special_tokens=True)}], and for
            fixtures written with decode_extra (spm-gemma): decode (HF decode(ids,
            skip_special_tokens=True)) and decode_all (skip_special_tokens=False)
"""
import argparse
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers as pre
from tokenizers import processors, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizers")

RE_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
RE_LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
             r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
RE_QWEN2 = RE_LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

EXTRA = [
    "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] What is 2+2? [/INST] 4</s>",
    "text<|endoftext|>more text <|endoftext|> end",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>",
    "a <mask> b  <mask>  c<mask>d",
    "x[[SEP]]y [[SEP]] z",
    "a <R>  b<R>\nc <R>\t\u3000 d<R>",
    "zz zzz azz zz. _zz zz_ (zz)",
    "<unk> and <s> and </s> in text",
    "Hello world",
    " Hello world",
    "  leading spaces",
    "",
    " ",
    "\n",
    "a",
    "\u2581already\u2581has\u2581meta",
    "Hello<|im_end|>",
    "<|im_start|><|im_start|>",
]

# Gemma chat turns (the layout of Gemma's chat template) and its other added tokens
EXTRA_GEMMA = [
    "<bos><start_of_turn>user\nWrite a haiku about rain.<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>model\nRain on the roof,  soft drums\u2014\nthe gutter hums along.<end_of_turn>",
    "<start_of_turn>user\n\u00bfQu\u00e9 tal? \u65e5\u672c\u8a9e \U0001F600<end_of_turn><eos>",
    "a<end_of_turn>b <start_of_turn> c  <end_of_turn>\n\n",
    "<unused0> <unused1>x<mask>[@BOS@]<pad>",
    "<start_of_turn><start_of_turn><end_of_turn>",
    "  two leading, two trailing  ",
    "tab\tand\u2581meta\u2581space",
]


def corpus():
    with open(os.path.join(FIX, "corpus.txt"), encoding="utf-8", newline="") as f:
        text = f.read()
    lines = [l + "\n" for l in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    return text, lines


def train(tok, text, vocab_size, specials, **kw):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  show_progress=False, **kw)
    tok.train_from_iterator([text], trainer=trainer)
    return tok


def byte_level(name, split, text, vocab_size, specials, ignore_merges=False, nfc=False,
               digits=False, prefix=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    steps = []
    if digits:
        steps.append(pre.Digits(individual_digits=True))
    if split:
        steps.append(pre.Split(Regex(split), behavior="isolated"))
        steps.append(pre.ByteLevel(add_prefix_space=False, use_regex=False))
    else:
        steps.append(pre.ByteLevel(add_prefix_space=prefix, use_regex=True))
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre.Sequence(steps)
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    train(tok, text, vocab_size, specials, initial_alphabet=pre.ByteLevel.alphabet())
    return tok


def merge_pairs(j):
    """The merges of a tokenizer.json as pairs: tokenizers before 0.20 save "a b", later [a, b]."""
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in j["model"]["merges"]]


def spm(text, vocab_size):
    """Llama 2 style: trained with Metaspace words, saved with the Prepend/Replace normalizer
    and byte fallback; <unk> <s> </s> then <0x00>..<0xFF> first, as in Llama's vocab."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    # the 180 most frequent characters (ties by code point: limit_alphabet alone breaks ties
    # in hash order), so that rarer ones take the byte fallback
    counts = {}
    for c in text.replace(" ", "\u2581"):
        counts[c] = counts.get(c, 0) + 1
    alphabet = sorted(counts, key=lambda c: (-counts[c], ord(c)))[:180]
    train(tok, text, vocab_size, ["<unk>", "<s>", "</s>"], initial_alphabet=alphabet,
          limit_alphabet=len(alphabet))
    j = json.loads(tok.to_str())
    old = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in old:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs(j), unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def spm_metaspace(base, scheme, split):
    """The same model as HF saves it for transformers' legacy=False (Metaspace pre-tokenizer)."""
    j = json.loads(base.to_str())
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": scheme, "split": split}
    return Tokenizer.from_str(json.dumps(j))


def spm_gemma(base):
    """The same model rebuilt as transformers' GemmaConverter (convert_slow_tokenizer.py) and
    Gemma's tokenizer.json have it: normalizer Replace(" ", U+2581) and no dummy prefix,
    pre-tokenizer Split(" ", merged_with_previous) (a no-op after that normalizer; newer
    transformers write null), decoder Replace/ByteFallback/Fuse without Strip, <bos> added by
    a TemplateProcessing. Gemma's vocabulary order: <pad> <eos> <bos> <unk>, then <mask>,
    [@BOS@] and <unusedN> (added tokens not marked special), <start_of_turn> <end_of_turn>
    (special), the byte pieces, the rest."""
    j = json.loads(base.to_str())
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    plain = ["<mask>", "[@BOS@]", "<unused0>", "<unused1>"]
    turns = ["<start_of_turn>", "<end_of_turn>"]
    vocab = {}
    for piece in specials + plain + turns + ["<0x%02X>" % b for b in range(256)]:
        vocab[piece] = len(vocab)
    for piece, _ in sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab and piece not in ("<s>", "</s>"):
            vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs(j), unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in specials])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in plain])
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in turns])
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos>:0 $A:0", pair="<bos>:0 $A:0 <bos>:1 $B:1", special_tokens=[("<bos>", 2)])
    return tok


def same_without_pre(tok, texts):
    """Checks the Split pre-tokenizer is a no-op (as transformers #43062 says): pre_tokenizer
    null gives the same ids, so the fixture stands for both forms of Gemma's tokenizer.json."""
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = None
    other = Tokenizer.from_str(json.dumps(j))
    bad = [s for s in texts if other.encode(s).ids != tok.encode(s).ids]
    assert not bad, "spm-gemma: pre_tokenizer null differs on %r" % bad[:3]


def gguf_gpt2(models_dir):
    sys.path.insert(0, os.path.join(models_dir, "..", "gguf-py"))
    import gguf  # noqa: E402

    r = gguf.GGUFReader(os.path.join(models_dir, "ggml-vocab-gpt-2.gguf"))

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in r.fields["tokenizer.ggml.token_type"].data]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if ty == 3])
    with open(os.path.join(models_dir, "ggml-vocab-gpt-2.gguf.inp"), encoding="utf-8") as f:
        inputs = f.read().split("\n__ggml_vocab_test__\n")
    inputs[-1] = inputs[-1].rstrip("\n")
    with open(os.path.join(models_dir, "ggml-vocab-gpt-2.gguf.out"), encoding="utf-8") as f:
        outs = [[int(x) for x in l.split()] for l in f.read().split("\n")[: len(inputs)]]
    bad = sum(tok.encode(s).ids != o for s, o in zip(inputs, outs))
    print("gpt2-real: %d of %d llama.cpp vectors differ from HF" % (bad, len(inputs)))
    return tok, inputs


def gguf_spm(models_dir):
    """The Llama 2 vocabulary of ggml-vocab-llama-spm.gguf as GGUF holds it (tokens, scores,
    types; no merges) with llama.cpp's test vectors, for tok_create's merges-from-scores
    path. The .out ids come from HF's Llama tokenizer (add_special_tokens=False)."""
    sys.path.insert(0, os.path.join(models_dir, "..", "gguf-py"))
    import gguf  # noqa: E402

    r = gguf.GGUFReader(os.path.join(models_dir, "ggml-vocab-llama-spm.gguf"))

    def field(key, conv):
        f = r.fields[key]
        return [conv(f.parts[i]) for i in f.data]

    tokens = field("tokenizer.ggml.tokens", lambda p: bytes(p).decode("utf-8"))
    scores = [int(s) if s == int(s) else s
              for s in field("tokenizer.ggml.scores", lambda p: float(p[0]))]
    types = field("tokenizer.ggml.token_type", lambda p: int(p[0]))
    base = os.path.join(models_dir, "ggml-vocab-llama-spm.gguf")
    with open(base + ".inp", encoding="utf-8") as f:
        inputs = f.read().split("\n__ggml_vocab_test__\n")
    inputs[-1] = inputs[-1].rstrip("\n")
    with open(base + ".out", encoding="utf-8") as f:
        outs = [[int(x) for x in l.split()] for l in f.read().split("\n")[: len(inputs)]]
    d = os.path.join(FIX, "llama-spm-gguf")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({"tokens": tokens, "scores": scores, "types": types, "bos": 1, "eos": 2,
                   "unk": 0, "tests": [{"text": s, "ids": o} for s, o in zip(inputs, outs)]},
                  f, ensure_ascii=False, separators=(",", ":"))
    print("%-16s vocab %6d  vocab.json %7d B  %d llama.cpp vectors" %
          ("llama-spm-gguf", len(tokens), os.path.getsize(os.path.join(d, "vocab.json")),
           len(inputs)))


def add_extras(tok, gpt2_like):
    """Added tokens that exercise the matcher: lstrip, rstrip, single_word, normalized."""
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>",
                            AddedToken("<mask>", lstrip=True, rstrip=False, special=True,
                                       normalized=False)])
    tok.add_tokens([AddedToken("[[SEP]]", normalized=True),
                    AddedToken("zz", single_word=True, normalized=False),
                    AddedToken("<R>", rstrip=True, normalized=False)])
    return tok


def expected(tok, text, lines, extra, decode_extra=False):
    out = {"lines": [tok.encode(l).ids for l in lines], "whole": tok.encode(text).ids}
    dec = {}
    for i, (l, ids) in enumerate(zip(lines, out["lines"])):
        s = tok.decode(ids, skip_special_tokens=True)
        if s != l:
            dec[str(i)] = s
    out["decode"] = dec
    ex = []
    for s in extra:
        e = {"text": s, "ids": tok.encode(s).ids,
             "ids_plain": tok.encode(s, add_special_tokens=False).ids}
        tok.encode_special_tokens = True
        e["ids_noparse"] = tok.encode(s).ids
        tok.encode_special_tokens = False
        if decode_extra:
            e["decode"] = tok.decode(e["ids"], skip_special_tokens=True)
            e["decode_all"] = tok.decode(e["ids"], skip_special_tokens=False)
        ex.append(e)
    out["extra"] = ex
    return out


ONLY = None  # the fixture names of --only, or None for all


def write(name, tok, text, lines, extra, config=None, decode_extra=False):
    if ONLY is not None and name not in ONLY:
        return
    d = os.path.join(FIX, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    if config is not None:
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
    exp = expected(tok, text, lines, extra, decode_extra)
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(exp, f, ensure_ascii=False, separators=(",", ":"))
    size = os.path.getsize(os.path.join(d, "tokenizer.json"))
    print("%-16s vocab %6d  tokenizer.json %7d B  %d ids for the corpus" %
          (name, tok.get_vocab_size(), size, len(exp["whole"])))


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp-models", help="llama.cpp models/ folder (for gpt2-real)")
    ap.add_argument("--only", action="append", metavar="NAME", help="write only this fixture")
    args = ap.parse_args()
    global ONLY
    ONLY = set(args.only) if args.only else None
    text, lines = corpus()

    t = add_extras(byte_level("gpt2", None, text, 2000, ["<|endoftext|>"]), True)
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    write("gpt2", t, text, lines, EXTRA,
          {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "chat_template": CHATML})

    t = byte_level("gpt2-prefix", None, text, 1200, ["<|endoftext|>"], prefix=True)
    add_extras(t, True)
    write("gpt2-prefix", t, text, lines, EXTRA)

    sp = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
          "<|eot_id|>"] + ["<|reserved_special_token_%d|>" % i for i in range(4)]
    t = byte_level("llama3", RE_LLAMA3, text, 3000, sp, ignore_merges=True)
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", 0)])])
    write("llama3", t, text, lines, EXTRA,
          {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
           "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"})

    t = byte_level("qwen2", RE_QWEN2, text, 2000, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                   nfc=True)
    t.add_tokens([AddedToken("[[SEP]]", normalized=True)])
    write("qwen2", t, text, lines, EXTRA,
          {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
           "chat_template": [{"name": "default", "template": CHATML},
                             {"name": "tool_use", "template": "tools"}]})

    t = byte_level("smollm", None, text, 1500, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                   digits=True)
    write("smollm", t, text, lines, EXTRA, {"eos_token": "<|im_end|>", "chat_template": CHATML})

    base = spm(text, 1500)
    base.add_tokens([AddedToken("[[SEP]]", normalized=True)])
    write("spm", base, text, lines, EXTRA,
          {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
           "eos_token": "</s>", "unk_token": "<unk>", "legacy": True})
    write("spm-first", spm_metaspace(base, "first", False), text, lines, EXTRA)
    write("spm-split", spm_metaspace(base, "always", True), text, lines, EXTRA)
    t = spm_gemma(base)
    same_without_pre(t, lines + [text] + EXTRA + EXTRA_GEMMA)
    write("spm-gemma", t, text, lines, EXTRA + EXTRA_GEMMA,
          {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>",
           "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}, decode_extra=True)

    if args.llama_cpp_models and (ONLY is None or "gpt2-real" in ONLY):
        t, inputs = gguf_gpt2(args.llama_cpp_models)
        write("gpt2-real", t, text, lines, EXTRA + inputs,
              {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})
    if args.llama_cpp_models and (ONLY is None or "llama-spm-gguf" in ONLY):
        gguf_spm(args.llama_cpp_models)


if __name__ == "__main__":
    main()
