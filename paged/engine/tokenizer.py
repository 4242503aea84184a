"""Text <-> token ids for the engine: a `tokenizers.Tokenizer` plus the BOS rule, and incremental
detokenization for streaming and stop strings.

Why not transformers' AutoTokenizer: the engine depends on `tokenizers` only, and a GGUF file
carries its vocabulary and merges, not a tokenizer.json, so the tokenizer is rebuilt from them.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from .chat_template import render_chat

# llama.cpp's pre-tokenizer names (`tokenizer.ggml.pre`) that a byte-level BPE can reproduce here.
# "smollm" (and StarCoder's family) splits every digit on its own before the GPT-2 regex.
_GGUF_PRE_TOKENIZERS = {
    "default": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False)]),
}
_GGUF_SPECIAL_TYPES = (3, 4)  # llama.cpp token types CONTROL and USER_DEFINED: matched whole, never split


class Tokenizer:
    def __init__(self, backend: Backend, bos_token_id: int | None = None, chat_template: str | None = None,
                 bos_token: str | None = None, eos_token: str | None = None) -> None:
        """`bos_token_id`: prepended by `encode` when the backend's own post-processor does not add it.
        `chat_template` (Jinja) and the `bos_token`/`eos_token` strings it may use: see chat_template.py."""
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; without `add_special_tokens` (a rendered chat template carries its
        own), neither the BOS rule nor the backend's post-processor adds anything."""
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self.bos_token_id
        return [bos, *ids] if add_special_tokens and bos is not None and ids[:1] != [bos] else ids

    def decode(self, token_ids: list[int]) -> str:
        return self.backend.decode(token_ids, skip_special_tokens=True)

    def chat_prompt(self, messages, chat_template: str | None = None, add_generation_prompt: bool = True,
                    **template_kwargs) -> dict:
        """The prompt for chat `messages`: the model's template (or `chat_template`) rendered, then
        tokenized without added special tokens (the template writes its own). A TokensPrompt with
        its text; the server and a router with `--tokenizer` both make chat prompts here."""
        text = render_chat(chat_template or self.chat_template, messages, bos_token=self.bos_token,
                           eos_token=self.eos_token, add_generation_prompt=add_generation_prompt, **template_kwargs)
        ids = self.encode(text, add_special_tokens=False)
        if not ids:
            raise ValueError("the chat template rendered these messages as an empty prompt")
        return {"prompt": text, "prompt_token_ids": ids}

    @classmethod
    def from_folder(cls, folder: Path) -> Tokenizer:
        """A Hugging Face folder: tokenizer.json; tokenizer_config.json's `add_bos_token`, special
        tokens and `chat_template` (a string, or a list of named ones: "default" is taken), or a
        `chat_template.jinja` file, which newer transformers write instead."""
        backend = Backend.from_file(str(folder / "tokenizer.json"))
        bos_id = None
        cfg = {}
        config = folder / "tokenizer_config.json"
        if config.exists():
            try:
                cfg = json.loads(config.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{config}: not valid JSON ({e})") from e
        bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
        if cfg.get("add_bos_token") and bos is not None:
            bos_id = backend.token_to_id(bos)
        template = cfg.get("chat_template")
        if isinstance(template, list):
            template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.exists():
            template = jinja_file.read_text()
        return cls(backend, bos_id, template if isinstance(template, str) else None, bos, eos)

    @classmethod
    def from_gguf(cls, fields: dict) -> Tokenizer:
        """From GGUF metadata (`tokenizer.ggml.*`, values already read): byte-level BPE only."""
        kind, pre = fields.get("tokenizer.ggml.model"), fields.get("tokenizer.ggml.pre", "default")
        if kind != "gpt2" or pre not in _GGUF_PRE_TOKENIZERS:
            raise ValueError(f"GGUF tokenizer model={kind!r} pre={pre!r} is not supported (byte-level BPE with "
                             f"pre in {sorted(_GGUF_PRE_TOKENIZERS)} is); pass tokenizer=<a Hugging Face folder>")
        tokens = fields["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
        backend = Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        backend.pre_tokenizer = _GGUF_PRE_TOKENIZERS[pre]()
        backend.decoder = decoders.ByteLevel()
        types = fields.get("tokenizer.ggml.token_type", ())
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i, t in enumerate(types) if t in _GGUF_SPECIAL_TYPES])
        bos = fields.get("tokenizer.ggml.bos_token_id") if fields.get("tokenizer.ggml.add_bos_token") else None
        bos_text, eos_text = (tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None
                              for i in (fields.get("tokenizer.ggml.bos_token_id"),
                                        fields.get("tokenizer.ggml.eos_token_id")))
        return cls(backend, bos, fields.get("tokenizer.chat_template"), bos_text, eos_text)


def _token_text(token) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken object."""
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) else None


class IncrementalDetokenizer:
    """The text of a growing output, delta by delta.

    Decoding token by token is wrong in two ways: a character may span several byte-level tokens
    (its first ones decode to U+FFFD), and some tokenizers drop a token's leading space at the
    start of a decode. So each delta is the decode of a short window minus the decode of the same
    window without the new tokens, and it is held back while it ends in an incomplete character.
    The window starts on the prompt's last tokens, so the first output token decodes in context.
    """

    __slots__ = ("tokenizer", "token_ids", "prefix_offset", "read_offset", "text")

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.token_ids = list(prompt_token_ids[-5:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.text = ""

    def add(self, new_token_ids: list[int]) -> str:
        """Take the next tokens; return the text they complete (maybe empty)."""
        ids = self.token_ids
        ids.extend(new_token_ids)
        decode = self.tokenizer.decode
        prefix = decode(ids[self.prefix_offset:self.read_offset])
        full = decode(ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        self.text += delta
        return delta
