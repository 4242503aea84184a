"""Swapped KV blocks kept LZ4-compressed in host memory: compressed on the way out, restored on the way back.

Why per block: the core swaps a request's blocks to host blocks it picked, and back to whichever
device blocks are free, one block id at a time; a block is the unit both ways, so it is the
unit compressed (one LZ4 frame: that block's K and V in every layer, then its per-token scales,
if the format has them). A host block is read exactly once after it is written (the core frees
it on swap-in), so its frame is dropped then and `stored_bytes` is what the pool holds now.

A block never takes more than its raw bytes: where LZ4 would expand it (incompressible bytes,
such as noise-like float16 values: a frame's headers add ~0.01%), it is kept as it is. So the
pool never holds more than `num_cpu_blocks` raw blocks' bytes, the `swap_space` it was given.
Compression does not give the pool more blocks: the core takes a host block for a swap-out
before the block's bytes are compressed (it counts blocks, never bytes, and cannot be told "no"
afterwards), and how far a block compresses depends on its content (the measured profile:
0.99-1.0 of a full block, 0.9 with partly empty last blocks; ~1.0 for noise). A pool sized at
swap_space / (ratio x block) would break its budget whenever the blocks compressed worse than the
ratio it was sized with. What compression saves is host memory (`stored_bytes` < the blocks'
raw bytes), not blocks; the simulator models it the same way (`sim.compressed_swap`).

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


def _join(tensors: list[torch.Tensor], shuffle: bool) -> bytes:
    return np.concatenate([_as_bytes(t, shuffle) for t in tensors]).tobytes()


def compress(tensors: list[torch.Tensor], codec: str) -> bytes:
    """One LZ4 frame holding ``tensors`` (CPU) one after the other."""
    if codec not in CODECS:
        raise ValueError(f"swap compression codec {codec!r}: expected one of {list(CODECS)}")
    return lz4.frame.compress(_join(tensors, codec == "lz4-shuffle"))


def decompress(frame: bytes, like: list[torch.Tensor], codec: str) -> list[torch.Tensor]:
    """Inverse of :func:`compress`: tensors shaped and typed like ``like``, in order."""
    raw = np.frombuffer(lz4.frame.decompress(frame, return_bytearray=True), dtype=np.uint8)  # writable
    return _split(raw, like, codec == "lz4-shuffle")


def _split(raw: np.ndarray, like: list[torch.Tensor], shuffle: bool) -> list[torch.Tensor]:
    """Bytes one tensor after the other -> tensors shaped and typed like ``like``."""
    out, start = [], 0
    for t in like:
        end = start + t.numel() * t.element_size()
        out.append(_from_bytes(raw[start:end], t, shuffle))
        start = end
    if start != raw.size:
        raise ValueError(f"a swapped block decompressed to {raw.size} bytes, expected {start}")
    return out


class CompressedHostPool:
    """Host block id -> that block's LZ4 frame, or its raw bytes where the frame would be larger."""

    def __init__(self, codec: str) -> None:
        if codec not in CODECS:
            raise ValueError(f"swap compression codec {codec!r}: expected one of {list(CODECS)}")
        self.codec = codec
        self.frames: dict[int, tuple[bool, bytes]] = {}  # (compressed, data)
        self.stored_bytes = 0  # compressed bytes held now
        self.raw_bytes_out = 0  # uncompressed bytes of every block swapped out so far
        self.compressed_bytes_out = 0  # their compressed size

    def put(self, host_block: int, tensors: list[torch.Tensor]) -> None:
        """Store one block (``tensors``: its K/V of every layer, its scales) under ``host_block``."""
        frame = compress(tensors, self.codec)
        raw_bytes = sum(t.numel() * t.element_size() for t in tensors)
        stored = (True, frame) if len(frame) < raw_bytes else (False, _join(tensors, shuffle=False))
        self.stored_bytes += len(stored[1]) - len(self.frames.get(host_block, (True, b""))[1])
        self.frames[host_block] = stored
        self.raw_bytes_out += raw_bytes
        self.compressed_bytes_out += len(stored[1])

    def take(self, host_block: int, like: list[torch.Tensor]) -> list[torch.Tensor]:
        """The block stored under ``host_block``, shaped like ``like``; the host block is empty after."""
        compressed, data = self.frames.pop(host_block)
        self.stored_bytes -= len(data)
        if compressed:
            return decompress(data, like, self.codec)
        return _split(np.frombuffer(bytearray(data), dtype=np.uint8), like, shuffle=False)
