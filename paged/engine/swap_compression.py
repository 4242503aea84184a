"""Swapped KV blocks kept LZ4-compressed in host memory: compressed on the way out, restored on the way back.

Why per block: the core swaps a request's blocks to host blocks it picked, and back to whichever
device blocks are free, one block id at a time; a block is the unit both ways, so it is the
unit compressed (one LZ4 frame: that block's K and V in every layer, then its per-token scales,
if the format has them). A host block is read exactly once after it is written (the core frees
it on swap-in), so its frame is dropped then and `stored_bytes` is what the pool holds now.

Codecs: "lz4" compresses the bytes as they lie; "lz4-shuffle" first groups each value's bytes by
significance (all first bytes, then all second bytes, ...: Blosc's shuffle), so that the
slowly varying high bytes of float16/float32 values (sign, exponent) sit together where LZ4 can
find repeats. For one-byte formats (int8, fp8, int4) the shuffle changes nothing. Both are
lossless: a block comes back bit for bit (tests/engine/test_swap_compression.py).

The codec is the `lz4` package's frame format (`lz4.frame`), not a hand-written one.
"""
from __future__ import annotations

import lz4.frame
import numpy as np
import torch

CODECS = ("lz4", "lz4-shuffle")


def _as_bytes(tensor: torch.Tensor, shuffle: bool) -> np.ndarray:
    """A contiguous CPU tensor's bytes, uint8; with ``shuffle``, byte planes by significance."""
    raw = tensor.contiguous().view(torch.uint8).numpy().reshape(-1)
    itemsize = tensor.element_size()
    if not shuffle or itemsize == 1:
        return raw
    return raw.reshape(-1, itemsize).T.reshape(-1)


def _from_bytes(raw: np.ndarray, like: torch.Tensor, shuffle: bool) -> torch.Tensor:
    """Inverse of :func:`_as_bytes`: a tensor shaped and typed like ``like``."""
    itemsize = like.element_size()
    if shuffle and itemsize > 1:
        raw = raw.reshape(itemsize, -1).T.reshape(-1)
    return torch.from_numpy(np.ascontiguousarray(raw)).view(like.dtype).view(like.shape)


def compress(tensors: list[torch.Tensor], codec: str) -> bytes:
    """One LZ4 frame holding ``tensors`` (CPU) one after the other."""
    if codec not in CODECS:
        raise ValueError(f"swap compression codec {codec!r}: expected one of {list(CODECS)}")
    shuffle = codec == "lz4-shuffle"
    return lz4.frame.compress(np.concatenate([_as_bytes(t, shuffle) for t in tensors]).tobytes())


def decompress(frame: bytes, like: list[torch.Tensor], codec: str) -> list[torch.Tensor]:
    """Inverse of :func:`compress`: tensors shaped and typed like ``like``, in order."""
    shuffle = codec == "lz4-shuffle"
    raw = np.frombuffer(lz4.frame.decompress(frame, return_bytearray=True), dtype=np.uint8)  # writable
    out, start = [], 0
    for t in like:
        end = start + t.numel() * t.element_size()
        out.append(_from_bytes(raw[start:end], t, shuffle))
        start = end
    if start != raw.size:
        raise ValueError(f"a swapped block decompressed to {raw.size} bytes, expected {start}")
    return out


class CompressedHostPool:
    """Host block id -> the LZ4 frame of that block."""

    def __init__(self, codec: str) -> None:
        if codec not in CODECS:
            raise ValueError(f"swap compression codec {codec!r}: expected one of {list(CODECS)}")
        self.codec = codec
        self.frames: dict[int, bytes] = {}
        self.stored_bytes = 0  # compressed bytes held now
        self.raw_bytes_out = 0  # uncompressed bytes of every block swapped out so far
        self.compressed_bytes_out = 0  # their compressed size

    def put(self, host_block: int, tensors: list[torch.Tensor]) -> None:
        """Store one block (``tensors``: its K/V of every layer, its scales) under ``host_block``."""
        frame = compress(tensors, self.codec)
        self.stored_bytes += len(frame) - len(self.frames.get(host_block, b""))
        self.frames[host_block] = frame
        self.raw_bytes_out += sum(t.numel() * t.element_size() for t in tensors)
        self.compressed_bytes_out += len(frame)

    def take(self, host_block: int, like: list[torch.Tensor]) -> list[torch.Tensor]:
        """The block stored under ``host_block``, shaped like ``like``; the host block is empty after."""
        frame = self.frames.pop(host_block)
        self.stored_bytes -= len(frame)
        return decompress(frame, like, self.codec)
