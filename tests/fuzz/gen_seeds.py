#!/usr/bin/env python3
"""gen_seeds: writes the fuzz targets' seed corpora, tests/fuzz/corpus/<target>/, from the
test fixtures (shrunk to fit) and from small synthetic files built here with the standard
library only. Each seed stays under 64 KiB and each corpus under 1 MiB.

Two corpora come from the project's own code, through fuzz targets built by
`tools/fuzz --build` (skipped with a note when BUILD_DIR/fuzz lacks them):
  plan      the base plan's metadata (fuzz_plan with FUZZ_PLAN_DUMP_META)
  tok_blob  every tokenizer_json seed that loads, serialized as plans store it
            (fuzz_tokenizer_json with FUZZ_DUMP_BLOB)

usage: tests/fuzz/gen_seeds.py [BUILD_DIR (build)]   (from the repository root)"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
MAX_SEED = 64 * 1024
MAX_CORPUS = 1024 * 1024


def fixture(*p):
    return os.path.join(FIX, *p)


def read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


class Corpus:
    def __init__(self, target):
        self.dir = os.path.join(OUT, target)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.total = 0

    def add(self, name, data):
        if isinstance(data, str):
            data = data.encode()
        if len(data) >= MAX_SEED:
            print("gen_seeds: %s/%s: %d bytes, over the seed limit; skipped"
                  % (os.path.basename(self.dir), name, len(data)))
            return
        if self.total + len(data) > MAX_CORPUS:
            print("gen_seeds: %s: corpus full; %s skipped" % (os.path.basename(self.dir), name))
            return
        with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)
        self.total += len(data)


def jdump(o):
    return json.dumps(o, ensure_ascii=False, separators=(",", ":"))


# --- grammar (tests/fuzz/fuzz_grammar.c: kind byte, source line, text) ---------------------

def gen_grammar():
    c = Corpus("grammar")
    c.add("gbnf-basic", b'\0root ::= "a" ("b" | [c-e]+)* x{2,3}\nx ::= "y"?\nabcccyy')
    c.add("schema-basic", b'\1{"type": "object", "properties": {"a": {"type": "integer", '
                          b'"minimum": -5}}}\n{"a": 7}')
    c.add("regex-basic", b'\2(ab|c)*\\d{2,4}[^x]?\nababc123')
    c.add("json-object", b'\3\n{"k": [1, 2.5e3, "x\\u00e9", true, null, {}]}')
    groups = json.loads(read(fixture("grammar", "cases.json")))["groups"]
    for i, g in enumerate(groups):
        if "gbnf" in g:
            kind, src = 0, g["gbnf"]
        elif "schema" in g:
            kind, src = 1, json.dumps(g["schema"])
        elif "regex" in g:
            kind, src = 2, g["regex"]
        else:
            kind, src = 3, ""
        if "\n" in src:  # the target reads one line of source
            continue
        texts = [t for t, ok in g["cases"] if ok] or [""]
        c.add("case-%02d" % i, bytes([kind]) + (src + "\n" + max(texts, key=len)).encode())


# --- gguf -------------------------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


def g_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def g_val(t, v):
    if t == STR:
        return g_str(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(g_val(et, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def tensor_bytes(ggml, n):
    if ggml == GGML_F32:
        return struct.pack("<%df" % n, *[((i * 37) % 17 - 8) / 16.0 for i in range(n)])
    if ggml in (GGML_F16, GGML_BF16):
        return struct.pack("<%dH" % n, *[0x3c00 if ggml == GGML_F16 else 0x3f80] * n)
    if ggml == GGML_Q8_0:  # blocks of 32: f16 scale + 32 int8
        return b"".join(struct.pack("<H", 0x2c00) + bytes((i * 7) % 256 for i in range(32))
                        for _ in range(n // 32))
    if ggml == GGML_Q4_0:  # f16 scale + 16 bytes of nibbles
        return b"".join(struct.pack("<H", 0x2c00) + bytes(range(16)) for _ in range(n // 32))
    raise ValueError(ggml)


def gguf(kvs, tensors=(), version=3, align=32):
    """kvs: [(key, type, value)]; tensors: [(name, ne (ne0 first), ggml type)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += g_str(k) + struct.pack("<I", t) + g_val(t, v)
    off, datas = 0, []
    for name, ne, ggml in tensors:
        n = 1
        for d in ne:
            n *= d
        out += g_str(name) + struct.pack("<I", len(ne))
        out += b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", ggml, off)
        data = tensor_bytes(ggml, n)
        datas.append(data)
        off += (len(data) + align - 1) // align * align
    out += b"\0" * ((align - len(out) % align) % align)
    for data in datas:
        out += data + b"\0" * ((align - len(data) % align) % align)
    return out


def bpe_vocab():
    """A byte-level vocabulary: the 256 GPT-2 byte symbols, a few merges, specials."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xa1, 0xad)) + list(range(0xae, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    toks = [chr(c) for c in cs]
    merges = ["\u0120 t", "h e", "\u0120t he", "l l", "e ll", "o \u0120", "1 2"]
    for m in merges:
        toks.append(m.replace(" ", ""))
    toks += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(toks) - 3) + [3, 3, 3]
    return toks, merges, types


def tok_gpt2(pre="llama-bpe", extra=()):
    toks, merges, types = bpe_vocab()
    return [("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, pre),
            ("tokenizer.ggml.tokens", ARR, (STR, toks)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.merges", ARR, (STR, merges)),
            ("tokenizer.ggml.bos_token_id", U32, len(toks) - 3),
            ("tokenizer.ggml.eos_token_id", U32, len(toks) - 1),
            ("tokenizer.chat_template", STR,
             "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
             "<|im_end|>\n{% endfor %}")] + list(extra)


def tok_spm():
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    words = ["\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "\u2581the", "t", "h", "e",
             "th", "he", "\u2581t", "\u2581th"]
    toks += words
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    return [("tokenizer.ggml.model", STR, "llama"), ("tokenizer.ggml.tokens", ARR, (STR, toks)),
            ("tokenizer.ggml.scores", ARR, (F32, scores)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
            ("tokenizer.ggml.unknown_token_id", U32, 0),
            ("tokenizer.ggml.add_bos_token", BOOL, 1), ("tokenizer.ggml.add_eos_token", BOOL, 0)]


def llama_gguf(arch="llama", hidden=8, heads=2, kv=1, ff=16, vocab=8, mat=GGML_F32,
               bias=False, qk_norm=False, tok=()):
    hd = hidden // heads
    a = arch + "."
    kvs = [("general.architecture", STR, arch), ("general.name", STR, "fuzz-" + arch),
           (a + "block_count", U32, 1), (a + "context_length", U32, 64),
           (a + "embedding_length", U32, hidden), (a + "feed_forward_length", U32, ff),
           (a + "attention.head_count", U32, heads), (a + "attention.head_count_kv", U32, kv),
           (a + "attention.layer_norm_rms_epsilon", F32, 1e-5),
           (a + "rope.freq_base", F32, 10000.0), (a + "rope.dimension_count", U32, hd),
           (a + "vocab_size", U32, vocab)] + list(tok)
    ts = [("token_embd.weight", [hidden, vocab], GGML_F32),
          ("output_norm.weight", [hidden], GGML_F32),
          ("output.weight", [hidden, vocab], mat if hidden % 32 == 0 else GGML_F32),
          ("blk.0.attn_norm.weight", [hidden], GGML_F32),
          ("blk.0.attn_q.weight", [hidden, heads * hd], mat),
          ("blk.0.attn_k.weight", [hidden, kv * hd], mat),
          ("blk.0.attn_v.weight", [hidden, kv * hd], mat),
          ("blk.0.attn_output.weight", [heads * hd, hidden], mat),
          ("blk.0.ffn_norm.weight", [hidden], GGML_F32),
          ("blk.0.ffn_gate.weight", [hidden, ff], mat),
          ("blk.0.ffn_up.weight", [hidden, ff], mat),
          ("blk.0.ffn_down.weight", [ff, hidden], mat)]
    if bias:
        ts += [("blk.0.attn_q.bias", [heads * hd], GGML_F32),
               ("blk.0.attn_k.bias", [kv * hd], GGML_F32),
               ("blk.0.attn_v.bias", [kv * hd], GGML_F32)]
    if qk_norm:
        ts += [("blk.0.attn_q_norm.weight", [hd], GGML_F32),
               ("blk.0.attn_k_norm.weight", [hd], GGML_F32)]
    return gguf(kvs, ts)


def gen_gguf():
    c = Corpus("gguf")
    ntok = len(bpe_vocab()[0])
    c.add("llama-f32-gpt2tok", llama_gguf(vocab=ntok, tok=tok_gpt2()))
    c.add("llama-q8_0", llama_gguf(hidden=32, ff=32, vocab=16, mat=GGML_Q8_0))
    c.add("llama-q4_0-spmtok", llama_gguf(hidden=32, ff=32, vocab=274, mat=GGML_Q4_0,
                                          tok=tok_spm()))
    c.add("qwen2-bias", llama_gguf("qwen2", bias=True, vocab=ntok, tok=tok_gpt2("qwen2")))
    c.add("qwen3-qknorm", llama_gguf("qwen3", qk_norm=True, mat=GGML_F16))
    c.add("tok-smollm", gguf([("general.architecture", STR, "llama")] + tok_gpt2("smollm")))
    c.add("tok-spm", gguf([("general.architecture", STR, "llama")] + tok_spm()))
    every = [("u8", U8, 200), ("i8", I8, -100), ("u16", U16, 60000), ("i16", I16, -30000),
             ("u32", U32, 4000000000), ("i32", I32, -2000000000), ("f32", F32, 1.5),
             ("bool", BOOL, 1), ("str", STR, "h\u00e9llo"), ("u64", U64, 1 << 40),
             ("i64", I64, -(1 << 40)), ("f64", F64, 2.25),
             ("arr.i32", ARR, (I32, [1, -2, 3])), ("arr.f64", ARR, (F64, [0.5, -1.0])),
             ("arr.str", ARR, (STR, ["a", "", "ccc"])), ("arr.bool", ARR, (BOOL, [0, 1])),
             ("arr.nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["x"]), (ARR, [(I64, [7])])])),
             ("general.alignment", U32, 64)]
    c.add("metadata-v3", gguf([("k." + k, t, v) if not k.startswith("general") else (k, t, v)
                               for k, t, v in every],
                              [("t.bf16", [4, 2], GGML_BF16), ("t.f32", [3], GGML_F32)],
                              align=64))
    c.add("metadata-v2", gguf([("k.u32", U32, 1), ("k.str", STR, "v2")],
                              [("t", [2, 2], GGML_F16)], version=2))


# --- safetensors ------------------------------------------------------------------------------

ST_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
           "U8": 1, "BOOL": 1}


def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape)]; data is a repeating pattern."""
    hdr, off, data = {}, 0, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape in tensors:
        n = ST_SIZE[dt]
        for d in shape:
            n *= d
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        data += bytes((i * 13 + 1) % 251 for i in range(n))
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def shrunk_fixture(path, dim=2):
    """The fixture's header (names, dtypes, ranks) with every dim cut to at most `dim`."""
    raw = read(path)
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    ts = [(k, v["dtype"], [min(d, dim) for d in v["shape"]]) for k, v in sorted(hdr.items())]
    return safetensors(ts, meta)


def gen_safetensors():
    c = Corpus("safetensors")
    for d in ["llama-gqa-f32", "llama-mha-f16", "qwen2-bias-bf16", "phi3-fused-f32",
              "gemma3-mm-f32", "qwen3-qknorm-bf16"]:
        c.add(d, shrunk_fixture(fixture(d, "model.safetensors")))
    c.add("dtypes", safetensors([("a", "F32", [2, 3]), ("b", "F16", [4]), ("c", "BF16", [1, 2, 2]),
                                 ("d", "I64", [2]), ("e", "I32", [3]), ("f", "I8", [5]),
                                 ("g", "U8", [1, 1, 1, 1, 1, 1, 1, 2]), ("h", "F32", []),
                                 ("i", "F32", [0, 4])], {"format": "pt", "k": "v"}))
    c.add("unsupported", safetensors([("x", "F64", [2]), ("y", "BOOL", [3])]))
    c.add("empty", safetensors([], {"format": "pt"}))


# --- hfconfig ----------------------------------------------------------------------------------

def gen_hfconfig():
    c = Corpus("hfconfig")
    for p in sorted(glob.glob(fixture("*", "config.json"))):
        c.add(os.path.basename(os.path.dirname(p)), read(p))
    base = json.loads(read(fixture("llama-gqa-f32", "config.json")))
    c.add("rope-linear", jdump(dict(base, rope_scaling={"type": "linear", "factor": 2.0})))
    c.add("rope-dynamic", jdump(dict(base, rope_scaling={"rope_type": "dynamic", "factor": 2.0})))
    c.add("head-dim", jdump(dict(base, head_dim=32, partial_rotary_factor=0.5,
                                 hidden_act="gelu_pytorch_tanh")))


# --- yaml --------------------------------------------------------------------------------------

def gen_yaml():
    c = Corpus("yaml")
    c.add("all-keys", """# every key build.yaml takes
dtype: f16
max_tokens: 256
max_seqs: 8
max_logits: 8
kv_block_size: 32
max_context: 1024
quant: int4:g64:asym:lm_head
act_dtype: int8
attn_dtype: bf16
target: cpu
arch: sm_80,sm_90
passes:
  fold: true
  fuse: false
  fuse_rope_attention: true
  fuse_qkv: false
  fuse_gate_up: true
  fuse_add_rms_norm: false
  repack: true
no_fuse: qkv,gate_up
""")
    c.add("cuda", "target: cuda\narch: sm_90\nmax_tokens: 2048\ndtype: bf16\nquant: q8_0\n")
    c.add("shapes", "shapes:\n  x: 1..64x3x224x224\n  mask: '2..8x16'\n  ids: 1x1..128\n")
    c.add("flow", "{dtype: auto, passes: {fold: false, fuse: true}, quant: 'w8a8', "
                  "quant_calib: \"/nonexistent/calib.json\", no_fuse: 'qkv,add_rms_norm'}\n")
    c.add("anchors", "passes: {fold: &t true, fuse: *t}\nmax_seqs: !!int 4\n---\ndtype: f32\n")
    c.add("quant-int8", "quant: int8:asym:g128\nact_dtype: f32\nmax_context: 0\n")
    c.add("bad", "dtype: [f32\nmax_tokens: -1\n  bad indent: x\n")


# --- tokenizer_json ------------------------------------------------------------------------------

def remap_ids(o, idmap):
    if isinstance(o, dict):
        return {k: ([idmap.get(i, i) for i in v] if k == "ids" and isinstance(v, list)
                    else remap_ids(v, idmap)) for k, v in o.items()}
    if isinstance(o, list):
        return [remap_ids(x, idmap) for x in o]
    return o


def shrink_tokenizer(j, keep=320):
    """The first `keep` ids of the vocabulary and the merges among them; added tokens past
    them renumbered right after."""
    j = json.loads(json.dumps(j))
    m = j["model"]
    vocab = {t: i for t, i in m["vocab"].items() if i < keep}
    merges = []
    for mg in m.get("merges", []):
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
    m["vocab"], m["merges"] = vocab, merges
    idmap, nxt = {}, keep
    for a in sorted(j.get("added_tokens", []), key=lambda a: a["id"]):
        if a["id"] >= keep:
            idmap[a["id"]] = nxt
            a["id"] = nxt
            nxt += 1
    j["post_processor"] = remap_ids(j.get("post_processor"), idmap)
    return j


def gen_tokenizer_json():
    c = Corpus("tokenizer_json")
    tdir = fixture("tokenizers")
    for name in sorted(os.listdir(tdir)):
        tj = os.path.join(tdir, name, "tokenizer.json")
        if not os.path.exists(tj):
            continue
        cfg = os.path.join(tdir, name, "tokenizer_config.json")
        cfg_b = b"\0" + read(cfg) if os.path.exists(cfg) else b""
        j = json.loads(read(tj))
        c.add("small-" + name, jdump(shrink_tokenizer(j)).encode() + cfg_b)
        if name in ("gpt2", "qwen2", "spm", "spm-gemma", "llama3"):
            c.add("full-" + name, read(tj) + cfg_b)
    c.add("minimal-bytelevel", jdump({
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3},
                  "merges": ["a b"]},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [{"id": 4, "content": "<eos>", "special": True, "lstrip": True,
                          "rstrip": False, "single_word": False, "normalized": False}]})
        + '\0{"eos_token": "<eos>", "add_bos_token": false, "chat_template": ['
          '{"name": "default", "template": "{{ messages }}"}]}')


# --- onnx (a protobuf encoder for the few messages a ModelProto needs) ---------------------------

def pb_varint(v):
    v &= (1 << 64) - 1
    out = b""
    while True:
        b = v & 0x7f
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def pb_key(field, wire):
    return pb_varint(field << 3 | wire)


def pb_int(field, v):
    return pb_key(field, 0) + pb_varint(v)


def pb_bytes(field, b):
    b = b.encode() if isinstance(b, str) else b
    return pb_key(field, 2) + pb_varint(len(b)) + b


def pb_float(field, f):
    return pb_key(field, 5) + struct.pack("<f", f)


FLOAT, INT64, BOOL_T, INT32 = 1, 7, 9, 6


def attr(name, v):
    """AttributeProto: int, float, string, ints or floats, by the value's Python type."""
    a = pb_bytes(1, name)
    if isinstance(v, float):
        return a + pb_float(2, v) + pb_int(20, 1)
    if isinstance(v, int):
        return a + pb_int(3, v) + pb_int(20, 2)
    if isinstance(v, str):
        return a + pb_bytes(4, v) + pb_int(20, 3)
    if v and isinstance(v[0], float):
        return a + b"".join(pb_float(7, x) for x in v) + pb_int(20, 6)
    return a + b"".join(pb_int(8, x) for x in v) + pb_int(20, 7)


def node(op, ins, outs, domain="", **attrs):
    n = b"".join(pb_bytes(1, i) for i in ins) + b"".join(pb_bytes(2, o) for o in outs)
    n += pb_bytes(3, outs[0] + "_" + op) + pb_bytes(4, op)
    if domain:
        n += pb_bytes(7, domain)
    return n + b"".join(pb_bytes(5, attr(k, v)) for k, v in sorted(attrs.items()))


def tensor(name, dt, dims, vals):
    fmt = {FLOAT: "f", INT64: "q", INT32: "i", BOOL_T: "B"}[dt]
    t = b"".join(pb_int(1, d) for d in dims) + pb_int(2, dt) + pb_bytes(8, name)
    return t + pb_bytes(9, struct.pack("<%d%s" % (len(vals), fmt), *vals))


def value_info(name, dt, dims):
    shape = b"".join(pb_bytes(1, pb_int(1, d) if isinstance(d, int) else pb_bytes(2, d))
                     for d in dims)
    return pb_bytes(1, name) + pb_bytes(2, pb_bytes(1, pb_int(1, dt) + pb_bytes(2, shape)))


def model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    g = b"".join(pb_bytes(1, n) for n in nodes) + pb_bytes(2, "g")
    g += b"".join(pb_bytes(5, t) for t in inits)
    g += b"".join(pb_bytes(11, value_info(*i)) for i in inputs)
    g += b"".join(pb_bytes(12, value_info(*o)) for o in outputs)
    m = pb_int(1, 8) + pb_bytes(2, "gen_seeds") + pb_bytes(7, g)
    m += pb_bytes(8, pb_bytes(1, "") + pb_int(2, opset))
    for dom, v in extra_opsets:
        m += pb_bytes(8, pb_bytes(1, dom) + pb_int(2, v))
    return m


def fl(n, scale=0.1):
    return [((i * 7) % 11 - 5) * scale for i in range(n)]


def gen_onnx():
    c = Corpus("onnx")
    for d in sorted(glob.glob(fixture("onnx-*", "model.onnx"))):
        if os.path.getsize(d) < MAX_SEED:
            c.add(os.path.basename(os.path.dirname(d)), read(d))
    X = ("x", FLOAT, [2, 3])
    unary = ["Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Floor",
             "Ceil", "Round", "Sign", "Erf", "Sin", "Cos", "Tan", "Atan", "Softplus", "Softsign",
             "Mish", "HardSwish", "Identity", "Sinh", "Cosh", "Asinh", "Asin", "Acos"]
    ns, prev = [], "x"
    for i, op in enumerate(unary):
        ns.append(node(op, [prev], ["u%d" % i]))
        prev = "u%d" % i
    ns += [node("LeakyRelu", [prev], ["l1"], alpha=0.1), node("Elu", ["l1"], ["l2"], alpha=1.0),
           node("Selu", ["l2"], ["l3"]), node("Celu", ["l3"], ["l4"]),
           node("HardSigmoid", ["l4"], ["l5"], alpha=0.2, beta=0.5),
           node("ThresholdedRelu", ["l5"], ["l6"], alpha=0.1),
           node("Shrink", ["l6"], ["l7"], lambd=0.5), node("Gelu", ["l7"], ["y"])]
    c.add("unary", model(ns, [X], [("y", FLOAT, [2, 3])], opset=20))
    ns = [node("Add", ["x", "b"], ["a"]), node("Sub", ["a", "x"], ["s"]),
          node("Mul", ["s", "b"], ["m"]), node("Div", ["m", "c"], ["d"]),
          node("Pow", ["d", "two"], ["p"]), node("Max", ["p", "x", "b"], ["mx"]),
          node("Min", ["mx", "x"], ["mn"]), node("Mean", ["mn", "x"], ["me"]),
          node("Sum", ["me", "x", "x"], ["su"]), node("PRelu", ["su", "b"], ["pr"]),
          node("Mod", ["pr", "c"], ["y"], fmod=1)]
    inits = [tensor("b", FLOAT, [3], fl(3)), tensor("c", FLOAT, [2, 1], [1.5, 2.0]),
             tensor("two", FLOAT, [], [2.0])]
    c.add("binary", model(ns, [X], [("y", FLOAT, [2, 3])], inits))
    ns = [node("Greater", ["x", "z"], ["g"]), node("Less", ["x", "z"], ["l"]),
          node("Equal", ["x", "x"], ["e"]), node("GreaterOrEqual", ["x", "z"], ["ge"]),
          node("LessOrEqual", ["x", "z"], ["le"]), node("And", ["g", "e"], ["an"]),
          node("Or", ["an", "l"], ["o"]), node("Xor", ["o", "ge"], ["xo"]),
          node("Not", ["xo"], ["n"]), node("Or", ["n", "le"], ["n2"]),
          node("Where", ["n2", "x", "z"], ["w"]), node("IsInf", ["w"], ["inf"]),
          node("Cast", ["inf"], ["ci"], to=FLOAT), node("Add", ["w", "ci"], ["y"])]
    c.add("logic", model(ns, [X], [("y", FLOAT, [2, 3])], [tensor("z", FLOAT, [], [0.0])]))
    ns = [node("Shape", ["x"], ["sh"]), node("Gather", ["sh", "i0"], ["d0"], axis=0),
          node("Unsqueeze", ["d0", "ax0"], ["d0u"]),
          node("Concat", ["d0u", "m1"], ["ns"], axis=0), node("Reshape", ["x", "ns"], ["r"]),
          node("Transpose", ["r"], ["t"], perm=[1, 0]),
          node("Slice", ["t", "st", "en", "ax0"], ["sl"]),
          node("Unsqueeze", ["sl", "ax0"], ["us"]), node("Squeeze", ["us", "ax0"], ["sq"]),
          node("Expand", ["sq", "es"], ["ex"]), node("Tile", ["ex", "reps"], ["ti"]),
          node("Flatten", ["ti"], ["fl"], axis=1),
          node("Split", ["fl", "spl"], ["p1", "p2"], axis=1),
          node("Concat", ["p2", "p1"], ["cc"], axis=1), node("Size", ["cc"], ["sz"]),
          node("Range", ["r0", "r1", "r2"], ["rg"]), node("ConstantOfShape", ["sh"], ["co"]),
          node("Cast", ["rg"], ["rgf"], to=FLOAT), node("Identity", ["cc"], ["y"])]
    inits = [tensor("i0", INT64, [], [0]), tensor("ax0", INT64, [1], [0]),
             tensor("m1", INT64, [1], [-1]), tensor("st", INT64, [1], [0]),
             tensor("en", INT64, [1], [2]), tensor("es", INT64, [2], [2, 2]),
             tensor("reps", INT64, [2], [1, 2]), tensor("spl", INT64, [2], [1, 3]),
             tensor("r0", INT64, [], [0]), tensor("r1", INT64, [], [6]),
             tensor("r2", INT64, [], [2])]
    c.add("shape", model(ns, [X], [("y", FLOAT, [2, 4])], inits, opset=13))
    ns = [node("MatMul", ["x", "w"], ["mm"]), node("Gemm", ["mm", "w2", "b"], ["ge"], transB=1,
                                                     alpha=1.0, beta=1.0),
          node("Softmax", ["ge"], ["sm"], axis=-1), node("LogSoftmax", ["sm"], ["ls"], axis=1),
          node("LayerNormalization", ["ls", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
          node("RMSNormalization", ["ln", "g"], ["rn"], axis=-1, epsilon=1e-5),
          node("ReduceSum", ["rn", "ax1"], ["rs"], keepdims=1),
          node("ReduceMean", ["rn", "ax1"], ["rme"], keepdims=1),
          node("ReduceMax", ["rn", "ax1"], ["rma"], keepdims=1),
          node("Add", ["rs", "rme"], ["a1"]), node("Sub", ["rn", "rma"], ["a2"]),
          node("Add", ["a2", "a1"], ["a3"]), node("CumSum", ["a3", "ax1s"], ["cs"]),
          node("Trilu", ["cs"], ["tr"], upper=0), node("Clip", ["tr", "lo", "hi"], ["cl"]),
          node("ArgMax", ["cl"], ["am"], axis=1, keepdims=1),
          node("Cast", ["am"], ["amf"], to=FLOAT), node("Add", ["cl", "amf"], ["a4"]),
          node("Pad", ["a4", "pads", "zero"], ["pd"], mode="constant"),
          node("Slice", ["pd", "s0", "s1", "ax1"], ["y"])]
    inits = [tensor("w", FLOAT, [3, 4], fl(12)), tensor("w2", FLOAT, [4, 4], fl(16, 0.05)),
             tensor("b", FLOAT, [4], fl(4)), tensor("g", FLOAT, [4], [1.0] * 4),
             tensor("ax1", INT64, [1], [1]), tensor("ax1s", INT64, [], [1]),
             tensor("lo", FLOAT, [], [-1.0]), tensor("hi", FLOAT, [], [1.0]),
             tensor("pads", INT64, [4], [0, 1, 0, 1]), tensor("zero", FLOAT, [], [0.0]),
             tensor("s0", INT64, [1], [1]), tensor("s1", INT64, [1], [5])]
    c.add("nn", model(ns, [X], [("y", FLOAT, [2, 4])], inits, opset=23))
    X4 = ("x", FLOAT, [1, 2, 4, 4])
    ns = [node("InstanceNormalization", ["x", "g2", "b2"], ["in"], epsilon=1e-5),
          node("BatchNormalization", ["in", "g2", "b2", "b2", "g2"], ["bn"], epsilon=1e-5),
          node("SpaceToDepth", ["bn"], ["sd"], blocksize=2),
          node("DepthToSpace", ["sd"], ["ds"], blocksize=2, mode="DCR"),
          node("GlobalAveragePool", ["ds"], ["gp"]), node("GlobalMaxPool", ["ds"], ["gm"]),
          node("Add", ["gp", "gm"], ["y"])]
    inits = [tensor("g2", FLOAT, [2], [1.0, 0.5]), tensor("b2", FLOAT, [2], [0.0, 0.1])]
    c.add("conv-ish", model(ns, [X4], [("y", FLOAT, [1, 2, 1, 1])], inits))
    # a symbolic dim (refused) and an input_ids -> logits graph too small to be a decoder
    c.add("symbolic", model([node("Relu", ["x"], ["y"])], [("x", FLOAT, ["batch", 3])],
                            [("y", FLOAT, ["batch", 3])]))
    ns = [node("Gather", ["emb", "input_ids"], ["h"], axis=0),
          node("MatMul", ["h", "head"], ["logits"])]
    inits = [tensor("emb", FLOAT, [8, 4], fl(32)), tensor("head", FLOAT, [4, 8], fl(32))]
    c.add("tiny-lm", model(ns, [("input_ids", INT64, [1, 3])], [("logits", FLOAT, [1, 3, 8])],
                           inits))


# --- chat_template (fuzz_chat_template.c: flags, source NUL, role NUL content NUL reasoning) ----

def chat_seed(flags, src, msgs):
    out = bytes([flags]) + src.encode()
    for m in msgs:
        out += b"\0" + m["role"].encode() + b"\0" + m.get("content", "").encode() + b"\0"
        out += m.get("reasoning_content", "").encode()
    return out


def gen_chat_template():
    c = Corpus("chat_template")
    t = json.loads(read(fixture("chat", "chat_templates.json")))
    convs = t["conversations"]
    for i, (name, tm) in enumerate(sorted(t["templates"].items())):
        c.add("src-" + name, chat_seed(1 | (i % 4) << 1, tm["source"], convs[i % len(convs)]))
    names = ["chatml", "qwen3", "deepseek-r1", "llama3", "llama3.1", "mistral", "llama2",
             "gemma", "phi3"]
    think = [{"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
             {"role": "user", "content": "and 3+3?"},
             {"role": "assistant", "content": "6", "reasoning_content": "add again"},
             {"role": "ipython", "content": "{\"r\": 1}"}]
    for i, n in enumerate(names):
        c.add("name-" + n, chat_seed(8 | (i % 8) | (16 if n == "llama3.1" else 0), n,
                                     convs[(i + 3) % len(convs)] + think[:2 + i % 4]))


# --- http_params / batch_line ---------------------------------------------------------------------

def tool_cases():
    u = json.loads(read(fixture("chat", "tool_calls.json")))
    return u["cases"]


def http_bodies():
    """(endpoint byte, body) pairs: completions 0, chat 1, tokenize 2, detokenize 3."""
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    out = [
        (0, {"model": "fuzz", "prompt": "Hello there", "max_tokens": 16, "temperature": 0.7,
             "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n", "END"],
             "n": 2, "logprobs": 3, "echo": True, "presence_penalty": 0.5,
             "frequency_penalty": 0.2, "repetition_penalty": 1.1, "logit_bias": {"5": -100, "7": 2},
             "user": "u", "best_of": 2}),
        (0, {"prompt": [1, 2, 3, 4], "max_tokens": 0, "echo": True, "stream": True,
             "stream_options": {"include_usage": True}, "ignore_eos": True, "min_tokens": 1,
             "stop_token_ids": [2, 3], "include_stop_str_in_output": True,
             "skip_special_tokens": True}),
        (0, {"prompt": "one two three four", "truncate_prompt_tokens": 2, "max_tokens": 3}),
        (0, {"prompt": "a", "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {
                "n": {"type": "integer"}, "s": {"type": "string", "maxLength": 4}},
                "required": ["n"]}}}}),
        (0, {"prompt": "a", "guided_regex": "[a-z]{1,3}\\d+"}),
        (0, {"prompt": "a", "guided_choice": ["yes", "no"]}),
        (0, {"prompt": "a", "grammar": "root ::= \"x\" [0-9]*"}),
        (0, {"prompt": "a", "guided_json": {"type": "array", "items": {"enum": [1, "a", None]}}}),
        (0, {"prompt": "x", "response_format": {"type": "json_object"}, "max_tokens": 4096}),
        (1, {"model": "fuzz", "messages": msgs, "max_completion_tokens": 8, "logprobs": True,
             "top_logprobs": 2, "chat_template_kwargs": {"enable_thinking": False}}),
        (1, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                        {"type": "text", "text": "b"}]}],
             "response_format": {"type": "text"}}),
        (2, {"prompt": "Hello <|im_end|> world"}),
        (2, {"messages": msgs}),
        (3, {"tokens": [1, 2, 3, 200, 1999]}),
    ]
    for i, case in enumerate(tool_cases()):
        body = {"messages": case["messages"], "tools": case["tools"]}
        if i % 3 == 1:
            body["tool_choice"] = "required"
            body["parallel_tool_calls"] = False
        elif i % 3 == 2 and case["tools"]:
            body["tool_choice"] = {"type": "function",
                                   "function": {"name": case["tools"][0]["function"]["name"]}}
        out.append((1, body))
    return out


def gen_http_params():
    c = Corpus("http_params")
    families = {"qwen2.5": 1, "qwen3": 2, "llama3.1": 5}  # index into the target's table
    tools = {id(case["messages"]): case["template"] for case in tool_cases()}
    for i, (ep, body) in enumerate(http_bodies()):
        fam = families.get(tools.get(id(body.get("messages"))), (i * 3) % 11)
        flags = ep | fam << 2 | (0x80 if i % 5 == 4 else 0)
        c.add("%02d-%s" % (i, ["cmpl", "chat", "tokenize", "detokenize"][ep]),
              bytes([flags]) + jdump(body).encode())
    c.add("no-tokenizer", bytes([0x40]) + b'{"prompt": [5, 6], "max_tokens": 2}')
    c.add("bad-json", bytes([1]) + b'{"messages": [{"role": "user", "content": "x"}')


def gen_batch_line():
    c = Corpus("batch_line")
    lines = []
    for i, (ep, body) in enumerate(http_bodies()):
        if ep > 1:
            continue
        lines.append(jdump({"custom_id": "req-%d" % i, "method": "POST",
                            "url": "/v1/chat/completions" if ep else "/v1/completions",
                            "body": body}))
    for i in range(0, len(lines), 4):
        c.add("lines-%02d" % i, "\n".join(lines[i:i + 4]) + "\n")
    c.add("errors", "\n".join([
        '{"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}',
        '{"custom_id": "b", "method": "POST", "url": "/v1/embeddings", "body": {}}',
        '{"custom_id": "", "method": "POST", "url": "/v1/completions", "body": {}}',
        '{"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": []}',
        'not json', '   \t', '{"custom_id": "d", "method": "POST", "url": "/v1/completions", '
        '"body": {"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}}}']) + "\n")


# --- plan and tok_blob: through the fuzz targets -----------------------------------------------

def gen_from_targets(build):
    fz = os.path.join(build, "fuzz")
    plan_bin = os.path.join(fz, "fuzz_plan")
    tok_bin = os.path.join(fz, "fuzz_tokenizer_json")
    if os.path.exists(plan_bin):
        c = Corpus("plan")
        with tempfile.TemporaryDirectory() as tmp:
            meta, empty = os.path.join(tmp, "meta"), os.path.join(tmp, "empty")
            open(empty, "wb").close()
            subprocess.run([plan_bin, empty], check=True, capture_output=True,
                           env=dict(os.environ, FUZZ_PLAN_DUMP_META=meta))
            c.add("llama-text-meta", read(meta))
            c.add("llama-text-meta-notok", read(meta + ".notok"))
    else:
        print("gen_seeds: no %s (tools/fuzz --build): plan seeds left as they are" % plan_bin)
    gguf_bin = os.path.join(fz, "fuzz_gguf")
    if os.path.exists(tok_bin) and os.path.exists(gguf_bin):
        c = Corpus("tok_blob")
        with tempfile.TemporaryDirectory() as tmp:
            for b, t in [(tok_bin, "tokenizer_json"), (gguf_bin, "gguf")]:
                seeds = sorted(glob.glob(os.path.join(OUT, t, "*")))  # files: nothing written back
                subprocess.run([b] + seeds, check=True, capture_output=True,
                               env=dict(os.environ, FUZZ_DUMP_BLOB=tmp))
            for f in sorted(os.listdir(tmp), key=lambda f: os.path.getsize(os.path.join(tmp, f))):
                c.add(f, read(os.path.join(tmp, f)))
    else:
        print("gen_seeds: no %s or %s (tools/fuzz --build): tok_blob seeds left as they are"
              % (tok_bin, gguf_bin))


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    for gen in [gen_grammar, gen_gguf, gen_safetensors, gen_hfconfig, gen_yaml,
                gen_tokenizer_json, gen_onnx, gen_chat_template, gen_http_params,
                gen_batch_line]:
        gen()
    gen_from_targets(build)
    for t in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, t))
        size = sum(os.path.getsize(os.path.join(OUT, t, f)) for f in files)
        print("gen_seeds: %-15s %3d seeds, %7d bytes" % (t, len(files), size))


if __name__ == "__main__":
    main()
