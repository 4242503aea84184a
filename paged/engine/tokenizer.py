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
    def __init__(self, backend: Backend, bos_token_id: int | None = None) -> None:
        """`bos_token_id`: prepended by `encode` when the backend's own post-processor does not add it."""
        self.backend = backend
        self.bos_token_id = bos_token_id

    def encode(self, text: str) -> list[int]:
        ids = self.backend.encode(text).ids
        bos = self.bos_token_id
        return [bos, *ids] if bos is not None and ids[:1] != [bos] else ids

    def decode(self, token_ids: list[int]) -> str:
        return self.backend.decode(token_ids, skip_special_tokens=True)

    @classmethod
    def from_folder(cls, folder: Path) -> Tokenizer:
        """A Hugging Face folder: tokenizer.json, and tokenizer_config.json's `add_bos_token` if any."""
        backend = Backend.from_file(str(folder / "tokenizer.json"))
        bos = None
        config = folder / "tokenizer_config.json"
        if config.exists():
            cfg = json.loads(config.read_text())
            token = cfg.get("bos_token")
            token = token.get("content") if isinstance(token, dict) else token
            if cfg.get("add_bos_token") and token is not None:
                bos = backend.token_to_id(token)
        return cls(backend, bos)

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
        return cls(backend, bos)


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
