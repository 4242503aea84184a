"""Chained block hashes for prefix caching: h_i = H(h_{i-1}, tokens of block i, extra keys).

The chain makes a block's hash name its whole prefix, so equal hashes mean equal KV. BLAKE2b
keeps hashes stable across processes and runs (Python's `hash` is salted for str and bytes),
so a simulation with a prefix cache is reproducible bit for bit.

Traces such as Mooncake's carry no tokens, only one hash id per `hash_id_block_size` tokens
(equal ids = identical prefix blocks). Those ids are chained once per id, and a cache block
of `block_size` tokens is named by the chained id that covers its last token plus its index: with 16-token blocks,
each 512-token id stands for 32 consecutive blocks.
"""
from __future__ import annotations

from array import array

from .request import Request

_ROOT = b"\x00" * 16


_blake2b = None  # hashlib.blake2b, once `_load_blake2b` has imported it


def _h(*parts: bytes) -> bytes:
    return (_blake2b or _load_blake2b())(b"".join(parts), digest_size=16).digest()


def _load_blake2b():
    """hashlib, imported at the first hash rather than with the core: a run that never hashes (a
    length-only trace, as the Azure ones) then never loads OpenSSL's hashes (~12M instructions,
    a few ms, at every start)."""
    global _blake2b
    import hashlib

    _blake2b = hashlib.blake2b
    return _blake2b


def hash_token_block(parent: bytes | None, token_ids, extra_keys: tuple = ()) -> bytes:
    """Hash of one full block of token ids, chained to the hash of the block before it."""
    extra = repr(extra_keys).encode() if extra_keys else b""
    return _h(parent or _ROOT, array("q", token_ids).tobytes(), extra)


def token_block_hashes(token_ids, block_size: int, num_blocks: int, start: int = 0, parent: bytes | None = None,
                       extra_keys: tuple = ()) -> list[bytes]:
    """The chained hashes of full blocks start..num_blocks-1 of `token_ids`, block `start` chained
    to `parent` (the hash of the block before it). What the engine's pool registers a prompt's
    blocks under, and what a router computes from a token-id prompt to find them."""
    out, prev = [], parent
    for i in range(start, num_blocks):
        prev = hash_token_block(prev, token_ids[i * block_size:(i + 1) * block_size], extra_keys)
        out.append(prev)
    return out


def hash_id_chain(hash_ids, extra_keys: tuple = ()) -> list[bytes]:
    """Chain trace-level hash ids: entry j names ids 0..j together."""
    extra = repr(extra_keys).encode() if extra_keys else b""
    out, prev = [], _ROOT
    for hid in hash_ids:
        prev = _h(prev, int(hid).to_bytes(8, "little", signed=True), extra)
        out.append(prev)
    return out


def extend_block_hashes(request: Request, block_size: int, num_blocks: int) -> list:
    """Make `request.block_hashes` hold at least `num_blocks` hashes where the content is known.

    Only full blocks get a hash. Requests with neither token ids nor hash ids get none: their
    blocks can never be shared, which is what a length-only trace means. Hash ids name the prompt,
    or the prompt and the output where `Request.hash_ids_cover_output` says so; past what they
    name, a request's blocks are its own (`own_block_hashes`).
    """
    hashes = request.block_hashes
    have = len(hashes)
    if have >= num_blocks:
        return hashes
    if request.prompt_token_ids is not None:
        tokens = request.prompt_token_ids
        if num_blocks * block_size > len(tokens):
            tokens = request.all_token_ids()
        num_blocks = min(num_blocks, len(tokens) // block_size)
        hashes.extend(token_block_hashes(tokens, block_size, num_blocks, have, hashes[-1] if hashes else None,
                                         request.extra_keys))
    elif request.prefix_hash_ids is not None:
        id_size = request.hash_id_block_size
        num_blocks = min(num_blocks, request.num_tokens // block_size)
        covered = len(request.prefix_hash_ids) * id_size
        if not request.hash_ids_cover_output:
            covered = min(covered, request.num_prompt_tokens)
        named = min(num_blocks, covered // block_size)
        if have < named:
            hashes.extend(id_block_hashes(request.prefix_hash_ids, id_size, block_size, named, have,
                                          request.extra_keys))
        if len(hashes) < num_blocks:
            hashes.extend(own_block_hashes(request, len(hashes), num_blocks, hashes[-1] if hashes else None))
    return hashes


def own_block_hashes(request: Request, start: int, num_blocks: int, parent: bytes | None) -> list[bytes]:
    """Hashes of full blocks start..num_blocks-1 of a request named by trace hash ids, past what its ids
    name: the tokens there (the rest of its prompt, its output) are its own, so each block's hash
    chains the request's id. An engine caches every full block, these too: they take room in the
    prefix cache and age in it like any other, so that a shared prefix is evicted as early as in
    the engine, but only the request itself (re-admitted after a preemption by recompute) hits
    them. (Left unhashed, they went back to the free blocks handed out first, and the shared
    prefixes outlived the engine's: the simulator's hit rate came out 0.02-0.05 high in
    `experiments/deploy_check.py`.)"""
    out, prev = [], parent
    own = request.request_id.encode()
    for i in range(start, num_blocks):
        prev = _h(prev or _ROOT, own, i.to_bytes(4, "little"))
        out.append(prev)
    return out


def id_block_hashes(hash_ids, hash_id_block_size: int, block_size: int, num_blocks: int, start: int = 0,
                    extra_keys: tuple = ()) -> list[bytes]:
    """The hashes of cache blocks start..num_blocks-1 of a prompt named by trace hash ids (the
    caller keeps num_blocks within what the ids cover). The chained id covering a block's last
    token names every token up to it; the block's index tells the blocks under one id apart."""
    chain = hash_id_chain(hash_ids[:((num_blocks * block_size - 1) // hash_id_block_size) + 1], extra_keys)
    return [chain[((i + 1) * block_size - 1) // hash_id_block_size] + i.to_bytes(4, "little")
            for i in range(start, num_blocks)]
