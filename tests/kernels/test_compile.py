"""The kernels compile for real GPUs, checked without one.

The interpreter runs a kernel as Python and accepts code the Triton compiler rejects (types that
change across a loop, an unsupported op), so passing the other tests says nothing about a GPU.
Here each kernel's launch is recorded as the GPU path would make it (tensors on the "meta"
device take the GPU's launch configuration and hold no memory), then compiled ahead of time,
through ptxas, for Hopper (sm_90: H100, H200) and Ampere (sm_80: A100). It must fit the
architecture's shared memory and, run through ptxas once more with ``-v``, spill no registers
(spills to local memory would sink the memory-bound decode kernel).
"""

import os
import re
import subprocess
import tempfile

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import attention, cache_ops, jit

META = torch.device("meta")
TRITON_TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.int32: "i32",
    torch.int64: "i64",
}
LAUNCH_OPTIONS = ("num_warps", "num_stages")
ARCHS = {90: 227 * 1024, 80: 163 * 1024}  # compute capability -> shared memory per block
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def record_launches(monkeypatch, run) -> list:
    """Run ``run()`` with every kernel launch recorded instead of executed."""
    launches = []

    def on(kernel, device):
        return _Recorder(kernel, launches)

    monkeypatch.setattr(jit.Kernel, "on", on)
    run()
    return launches


class _Recorder:
    def __init__(self, kernel, launches):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.kernel.compiled, args, kwargs))


def _type_of(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + TRITON_TYPES[value.dtype]
    if isinstance(value, float):
        return "fp32"
    return "i32" if -(2**31) <= value < 2**31 else "i64"


def compile_launch(fn, args, kwargs, arch):
    """Compile as a launch would: like Triton's JIT, treat integers equal to 1 as constants and
    mark 16-divisible integers and (allocator-aligned) pointers as such."""
    named = dict(zip(fn.arg_names, args, strict=False))
    constexprs = {name: value for name, value in kwargs.items() if name not in LAUNCH_OPTIONS}
    constexprs.update({name: 1 for name, value in named.items() if type(value) is int and value == 1})
    signature = {name: _type_of(value) for name, value in named.items()}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    attrs = {
        (fn.arg_names.index(name),): [["tt.divisibility", 16]]
        for name, value in named.items()
        if name not in constexprs and (isinstance(value, torch.Tensor) or (type(value) is int and value % 16 == 0))
    }
    options = {name: kwargs[name] for name in LAUNCH_OPTIONS if name in kwargs}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def empty(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device=META)


def attention_call(dtype, *, num_heads=32, num_kv_heads=4, head_dim=128, num_tokens=64, num_seqs=64,
                   cache_dtype=None, **kwargs):
    cache_dtype = cache_dtype or (torch.int8 if kwargs.get("k_scale") is not None else dtype)
    cache_dim = head_dim // 2 if cache_dtype == torch.uint8 else head_dim
    return lambda: attention.paged_attention(
        empty(num_tokens, num_heads, head_dim, dtype=dtype),
        empty(1024, 16, num_kv_heads, cache_dim, dtype=cache_dtype),
        empty(1024, 16, num_kv_heads, cache_dim, dtype=cache_dtype),
        empty(num_seqs, 64, dtype=torch.int32),
        empty(num_seqs, dtype=torch.int32),
        empty(num_seqs + 1, dtype=torch.int32),
        head_dim**-0.5,
        empty(num_tokens, num_heads, head_dim, dtype=dtype),
        **kwargs,
    )


CALLS = {
    "decode fp16 GQA 8:1": attention_call(torch.float16),
    "decode fp32": attention_call(torch.float32),
    "decode bf16 split-KV": attention_call(torch.bfloat16, num_seqs=4, num_tokens=4, num_splits=8),
    "prefill bf16": attention_call(torch.bfloat16, num_tokens=4096, num_seqs=2),
    "prefill fp32, head dim 80, GQA 3:1": attention_call(
        torch.float32, num_heads=6, num_kv_heads=2, head_dim=80, num_tokens=300, num_seqs=3
    ),
    "decode head dim 256": attention_call(torch.bfloat16, head_dim=256),
    "int8 cache": attention_call(
        torch.float16, k_scale=empty(1024, 16, 4, dtype=torch.float32), v_scale=empty(1024, 16, 4, dtype=torch.float32)
    ),
    "int4 cache decode": attention_call(
        torch.bfloat16, cache_dtype=torch.uint8, k_scale=empty(1024, 16, 4, 4, dtype=torch.float32),
        v_scale=empty(1024, 16, 4, 4, dtype=torch.float32),
    ),
    "int4 cache prefill": attention_call(
        torch.float16, num_tokens=4096, num_seqs=2, cache_dtype=torch.uint8,
        k_scale=empty(1024, 16, 4, 4, dtype=torch.float32), v_scale=empty(1024, 16, 4, 4, dtype=torch.float32),
    ),
    "reshape_and_cache into int4": lambda: cache_ops.reshape_and_cache(
        empty(64, 8, 128, dtype=torch.bfloat16),
        empty(64, 8, 128, dtype=torch.bfloat16),
        empty(100, 16, 8, 64, dtype=torch.uint8),
        empty(100, 16, 8, 64, dtype=torch.uint8),
        empty(64, dtype=torch.int32),
        empty(100, 16, 8, 4, dtype=torch.float32),
        empty(100, 16, 8, 4, dtype=torch.float32),
    ),
    "reshape_and_cache fp16": lambda: cache_ops.reshape_and_cache(
        empty(64, 8, 128),
        empty(64, 8, 128),
        empty(100, 16, 8, 128),
        empty(100, 16, 8, 128),
        empty(64, dtype=torch.int64),
    ),
    "reshape_and_cache into int8": lambda: cache_ops.reshape_and_cache(
        empty(64, 8, 128, dtype=torch.bfloat16),
        empty(64, 8, 128, dtype=torch.bfloat16),
        empty(100, 16, 8, 128, dtype=torch.int8),
        empty(100, 16, 8, 128, dtype=torch.int8),
        empty(64, dtype=torch.int32),
        empty(100, 16, 8, dtype=torch.float32),
        empty(100, 16, 8, dtype=torch.float32),
    ),
    "copy_blocks": lambda: cache_ops.copy_blocks(
        [empty(100, 16, 8, 128), empty(100, 16, 8, dtype=torch.float32)], empty(5, 2, dtype=torch.int64)
    ),
}


# fp8e4nv exists from sm_89 (Ada, Hopper) on: Triton refuses it for an A100, as vLLM's fp8 KV needs sm_89+ too.
FP8_CALLS = {
    "fp8 cache decode, per-head scale": attention_call(
        torch.bfloat16, cache_dtype=torch.float8_e4m3fn, k_scale=empty(4, dtype=torch.float32),
        v_scale=empty(4, dtype=torch.float32),
    ),
    "fp8 cache prefill, per-tensor scale": attention_call(
        torch.float16, num_tokens=4096, num_seqs=2, cache_dtype=torch.float8_e4m3fn,
        k_scale=empty(1, dtype=torch.float32), v_scale=empty(1, dtype=torch.float32),
    ),
    "reshape_and_cache into fp8": lambda: cache_ops.reshape_and_cache(
        empty(64, 8, 128, dtype=torch.bfloat16),
        empty(64, 8, 128, dtype=torch.bfloat16),
        empty(100, 16, 8, 128, dtype=torch.float8_e4m3fn),
        empty(100, 16, 8, 128, dtype=torch.float8_e4m3fn),
        empty(64, dtype=torch.int32),
        empty(8, dtype=torch.float32),
        empty(8, dtype=torch.float32),
    ),
}
CALLS_BY_ARCH = [(call, arch) for arch in ARCHS for call in CALLS] + [(call, 90) for call in FP8_CALLS]


def spilled_bytes(ptx: str) -> int:
    target = re.search(r"\.target\s+(\w+)", ptx).group(1)  # e.g. sm_90a
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        report = subprocess.run(
            [PTXAS, f"-arch={target}", "-v", source.name, "-o", os.devnull], capture_output=True, text=True, check=True
        ).stderr
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", report))


@pytest.mark.parametrize(("call", "arch"), CALLS_BY_ARCH)
def test_compiles(monkeypatch, call, arch):
    launches = record_launches(monkeypatch, {**CALLS, **FP8_CALLS}[call])
    assert launches
    for fn, args, kwargs in launches:
        compiled = compile_launch(fn, args, kwargs, arch)
        shared = compiled.metadata.shared
        assert shared <= ARCHS[arch], f"{fn.__name__} needs {shared} B of shared memory"
        if os.path.exists(PTXAS):
            assert spilled_bytes(compiled.asm["ptx"]) == 0, f"{fn.__name__} spills registers"
