"""The plan's tokenizer with the methods scripts call on HF tokenizers (what vLLM's
LLM.get_tokenizer returns): encode, decode, apply_chat_template, __call__."""
import ctypes
from ctypes import byref, c_int32, c_size_t, c_void_p, POINTER

from . import _lib


def _content_text(content):
    """A message's content: a string, or OpenAI's list of parts (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                out.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError("message content part %r is not supported (text only)" % kind)
        return "".join(out)
    raise ValueError("message content must be a string or a list of text parts")


class Tokenizer:
    """Borrows a tokenizer handle; `owner` keeps whatever owns it alive."""

    def __init__(self, handle, owner=None, chat_template=None):
        self._lib = _lib.load()
        self._h = handle
        self._owner = owner
        self._template = chat_template.encode() if chat_template else None
        self.vocab_size = int(self._lib.irt_tokenizer_vocab_size(handle))
        info = getattr(owner, "info", None)
        self.bos_token_id = int(info.bos_token_id) if info and info.bos_token_id >= 0 else None
        self.eos_token_id = int(info.eos_token_id) if info and info.eos_token_id >= 0 else None

    @classmethod
    def from_file(cls, path):
        """A tokenizer of its own: a plan, a .gguf or an HF tokenizer.json."""
        lib = _lib.load()
        h, err = c_void_p(), _lib.irt_error()
        p = str(path)
        if p.endswith(".gguf"):
            st = lib.irt_tokenizer_open_gguf(p.encode(), byref(h), byref(err))
        elif p.endswith(".json"):
            st = lib.irt_tokenizer_open_json(p.encode(), None, byref(h), byref(err))
        else:
            st = lib.irt_tokenizer_open_plan(p.encode(), byref(h), byref(err))
        _lib.check(st, err)
        tok = cls(h.value)
        tok._own = True
        return tok

    def __del__(self):
        if getattr(self, "_own", False) and self._h:
            self._lib.irt_tokenizer_destroy(self._h)
            self._h = None

    def __len__(self):
        return self.vocab_size

    def encode(self, text, add_special_tokens=True, parse_special=True):
        """Token ids of text (BOS added as the tokenizer says when add_special_tokens)."""
        if not isinstance(text, str):
            raise TypeError("encode: text must be a str")
        b = text.encode("utf-8", "surrogatepass")
        ids, n, err = POINTER(c_int32)(), c_size_t(), _lib.irt_error()
        st = self._lib.irt_tokenize_alloc(self._h, b, len(b), add_special_tokens, parse_special,
                                          byref(ids), byref(n), byref(err))
        _lib.check(st, err)
        return _lib.take_ids(self._lib, ids, n.value)

    def __call__(self, text, add_special_tokens=True, **_):
        if isinstance(text, (list, tuple)):
            return {"input_ids": [self.encode(t, add_special_tokens) for t in text]}
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, token_ids, skip_special_tokens=True):
        ids = [int(t) for t in token_ids]
        for t in ids:
            if not 0 <= t < self.vocab_size:
                raise ValueError("decode: token id %d is outside the vocabulary (0..%d)"
                                 % (t, self.vocab_size - 1))
        arr = (c_int32 * len(ids))(*ids)
        out, n, err = c_void_p(), c_size_t(), _lib.irt_error()
        st = self._lib.irt_detokenize_alloc(self._h, arr, len(ids), skip_special_tokens,
                                            byref(out), byref(n), byref(err))
        _lib.check(st, err)
        return _lib.take_string(self._lib, out, n.value)

    def batch_decode(self, seqs, skip_special_tokens=True):
        return [self.decode(s, skip_special_tokens) for s in seqs]

    def convert_ids_to_tokens(self, ids):
        one = isinstance(ids, int)
        out = [self.decode([i], skip_special_tokens=False) for i in ([ids] if one else ids)]
        return out[0] if one else out

    def is_end_of_generation(self, token_id):
        return bool(self._lib.irt_token_is_eog(self._h, int(token_id)))

    def chat_family(self, chat_template=None):
        """The chat template family the plan renders conversations with."""
        info, err = _lib.irt_chat_info(), _lib.irt_error()
        tpl = chat_template.encode() if chat_template else self._template
        _lib.check(self._lib.irt_chat_get_info(self._h, tpl, byref(info), byref(err)), err)
        return info.family.decode()

    def chat_ids(self, conversation, add_generation_prompt=True, chat_template=None,
                 enable_thinking=None, allow_special_in_content=False):
        """(ids, text) of a conversation rendered with the plan's chat template."""
        msgs = []
        for i, m in enumerate(conversation):
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError("message %d must be a dict with a role" % i)
            reasoning = m.get("reasoning_content") or m.get("reasoning")
            msgs.append((str(m["role"]).encode(), _content_text(m.get("content")).encode(),
                         reasoning.encode() if reasoning else None))
        arr = (_lib.irt_chat_message * len(msgs))(*[_lib.irt_chat_message(*t) for t in msgs])
        opts = _lib.irt_chat_opts(False, enable_thinking is False)
        tpl = chat_template.encode() if chat_template else self._template
        ids, n, text, err = POINTER(c_int32)(), c_size_t(), c_void_p(), _lib.irt_error()
        st = self._lib.irt_chat_tokenize(self._h, tpl, arr, len(msgs), add_generation_prompt,
                                         byref(opts), allow_special_in_content, byref(ids),
                                         byref(n), byref(text), byref(err))
        _lib.check(st, err)
        ids_list = _lib.take_ids(self._lib, ids, n.value)
        s = ctypes.string_at(text.value).decode("utf-8", "replace") if text.value else ""
        if text.value:
            self._lib.irt_free(text.value)
        return ids_list, s

    def apply_chat_template(self, conversation, tools=None, chat_template=None,
                            add_generation_prompt=False, continue_final_message=False,
                            tokenize=True, return_dict=False, chat_template_kwargs=None,
                            **kwargs):
        """HF's apply_chat_template: the ids (tokenize=True) or the text of a conversation.
        enable_thinking (a keyword or in chat_template_kwargs) reaches thinking templates."""
        if tools:
            raise ValueError("apply_chat_template: tools are not supported here (the server "
                             "renders tool calls)")
        if continue_final_message:
            raise ValueError("apply_chat_template: continue_final_message is not supported")
        kw = dict(chat_template_kwargs or {})
        kw.update(kwargs)
        ids, text = self.chat_ids(conversation, add_generation_prompt, chat_template,
                                  kw.get("enable_thinking"))
        if not tokenize:
            return text
        return {"input_ids": ids} if return_dict else ids
