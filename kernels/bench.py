"""Benchmark the Triton paged-attention kernel against PyTorch's SDPA on pre-gathered K/V.

    python -m kernels.bench [--dtype bfloat16] [--quick] [--csv results.csv] [--kv-cache-dtype auto,int8,fp8,int4]
    python -m kernels.bench --smoke      # a tiny CPU run through Triton's interpreter: checks the script

Decode (batch 1-256, context 512-32k) and causal prefill, head dim 128, GQA 8:1 (32 query heads
over 4 KV heads), block size 16 with blocks scattered over the cache. For each shape it prints the
time of both, the memory bandwidth achieved (bytes that must be read or written / time) as a share
of the GPU's spec bandwidth, and TFLOP/s. SDPA gets its K/V already gathered into contiguous
tensors, so it is the speed of attention without paging, measured in the same process.
``--kv-cache-dtype`` runs the Triton kernel over quantized caches too (``kernels.quant``: int8,
fp8, int4, written by ``reshape_and_cache``; "auto" is the query's dtype); SDPA always reads the
unquantized K/V, and the bytes moved are each format's own, scales included.

How it times: CUDA events around one launch, with L2 flushed before each by writing a buffer
larger than L2. The flush also keeps the GPU busy while the CPU issues the launch, so Python's
launch overhead does not land inside the measured interval. The median of ``--reps`` runs is
reported.

Goals (issue 4): decode at or above 80% of spec bandwidth at batch >= 64, context >= 4k;
prefill at or above 60% of FlashAttention-3's published 616 TFLOP/s (causal, head dim 128, H100).
"""

import argparse
import csv
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import kernels
from kernels import quant

# Spec memory bandwidth in bytes/s; the first name found in the device name wins.
SPEC_BANDWIDTH = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12), ("A100", 2.039e12))
FA3_PREFILL_TFLOPS = 616.0
DECODE_GOAL = 0.80  # of spec bandwidth, at batch >= 64 and context >= 4k
PREFILL_GOAL = 0.60  # of FA3_PREFILL_TFLOPS


@dataclass(frozen=True)
class Case:
    kind: str  # "decode" or "prefill"
    batch: int
    context: int  # every sequence's length after the step
    num_heads: int = 32
    num_kv_heads: int = 4
    head_dim: int = 128
    block_size: int = 16

    @property
    def query_len(self) -> int:
        return 1 if self.kind == "decode" else self.context

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.context // self.block_size)


def decode_cases(quick: bool) -> list[Case]:
    batches = (1, 64) if quick else (1, 8, 64, 256)
    contexts = (4096, 32768) if quick else (512, 4096, 32768)
    return [Case("decode", batch, context) for batch in batches for context in contexts]


def prefill_cases(quick: bool) -> list[Case]:
    """16k query tokens in every case, the total FlashAttention-3 reports at."""
    shapes = ((1, 16384), (16, 1024)) if quick else ((1, 16384), (4, 4096), (16, 1024))
    return [Case("prefill", batch, context) for batch, context in shapes]


def bytes_moved(case: Case, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    """The least memory traffic of the step: every context token's K and V read once (in the
    cache's format, scales included), the query read and the output written once, and the block
    table read."""
    cache_dtype = dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    kv = case.batch * case.context * quant.cache_bytes_per_token(case.num_kv_heads, case.head_dim, cache_dtype)
    query_and_out = 2 * case.batch * case.query_len * case.num_heads * case.head_dim * dtype.itemsize
    block_table = case.batch * case.blocks_per_seq * torch.int32.itemsize
    return kv + query_and_out + block_table


def flops(case: Case) -> int:
    """2 flops per multiply-add of QK^T and of PV, counting only the (query, key) pairs the causal
    mask keeps, as FlashAttention's causal figures do."""
    cached = case.context - case.query_len
    pairs = case.query_len * cached + case.query_len * (case.query_len + 1) // 2
    return 4 * case.batch * case.num_heads * case.head_dim * pairs


def spec_bandwidth(device_name: str) -> float | None:
    for name, bandwidth in SPEC_BANDWIDTH:
        if name in device_name:
            return bandwidth
    return None


def build(case: Case, dtype: torch.dtype, device: torch.device, kv_cache_dtype: str = "auto"):
    """Paged inputs (blocks in random order), the scales of a quantized cache (a dict, empty for
    "auto"), and the unquantized K/V gathered for SDPA."""
    generator = torch.Generator(device).manual_seed(0)
    num_blocks = case.batch * case.blocks_per_seq
    cache_shape = (num_blocks, case.block_size, case.num_kv_heads, case.head_dim)
    key_cache = torch.randn(cache_shape, generator=generator, device=device, dtype=dtype)
    value_cache = torch.randn(cache_shape, generator=generator, device=device, dtype=dtype)
    block_table = torch.randperm(num_blocks, generator=generator, device=device)
    block_table = block_table.view(case.batch, case.blocks_per_seq).int()
    query = torch.randn(
        case.batch * case.query_len, case.num_heads, case.head_dim, generator=generator, device=device, dtype=dtype
    )
    paged = (
        query,
        key_cache,
        value_cache,
        block_table,
        torch.full((case.batch,), case.context, dtype=torch.int32, device=device),
        torch.arange(case.batch + 1, dtype=torch.int32, device=device) * case.query_len,
        case.head_dim**-0.5,
    )

    def gather(cache):  # -> [batch, kv_heads, context, head_dim]
        tokens = cache[block_table.long()].flatten(1, 2)[:, : case.context]
        return tokens.transpose(1, 2).contiguous()

    sdpa_query = query.view(case.batch, case.query_len, case.num_heads, case.head_dim).transpose(1, 2)
    sdpa = (sdpa_query, gather(key_cache), gather(value_cache))
    if kv_cache_dtype == "auto":
        return paged, {}, sdpa
    caches, scales = quantized_caches(key_cache, value_cache, kv_cache_dtype)
    return (paged[0], *caches, *paged[3:]), scales, sdpa


def quantized_caches(key_cache: torch.Tensor, value_cache: torch.Tensor, kv_cache_dtype: str):
    """``key_cache``/``value_cache`` written into caches of ``kv_cache_dtype`` (fp8: scale 1.0 per tensor)."""
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    device = key_cache.device
    storage = quant.CACHE_DTYPES[kv_cache_dtype]
    packed = storage == quant.INT4_DTYPE
    shape = (num_blocks, block_size, num_kv_heads, head_dim // 2 if packed else head_dim)
    caches = [torch.empty(shape, dtype=storage, device=device) for _ in range(2)]
    if storage == quant.FP8_DTYPE:
        scale_shape = (1,)
    elif packed:
        scale_shape = (*shape[:3], head_dim // quant.int4_group_size(head_dim))
    else:
        scale_shape = shape[:3]
    scales = {"k_scale": torch.ones(scale_shape, device=device), "v_scale": torch.ones(scale_shape, device=device)}
    slots = torch.arange(num_blocks * block_size, device=device)
    kernels.reshape_and_cache(key_cache.flatten(0, 1), value_cache.flatten(0, 1), *caches, slots, **scales)
    return caches, scales


def time_launch(fn, device: torch.device, reps: int) -> float:
    """Median seconds of ``fn()`` on ``device``: CUDA events with L2 flushed first; wall clock on CPU."""
    fn()  # compile, warm up
    times = []
    if device.type == "cuda":
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        flush = torch.empty(max(4 * l2_bytes, 256 << 20), dtype=torch.uint8, device=device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            flush.zero_()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            begin = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def run_case(case: Case, dtype: torch.dtype, device: torch.device, reps: int, bandwidth: float | None,
             kv_cache_dtype: str = "auto") -> dict:
    from kernels import attention

    paged, scales, (sdpa_query, keys, values) = build(case, dtype, device, kv_cache_dtype)
    out = torch.empty_like(paged[0])
    causal = case.query_len > 1
    seconds = {
        "triton": time_launch(lambda: attention.paged_attention(*paged, out, **scales), device, reps),
        "sdpa": time_launch(
            lambda: F.scaled_dot_product_attention(
                sdpa_query, keys, values, is_causal=causal, scale=paged[-1], enable_gqa=True
            ),
            device,
            reps,
        ),
    }
    row = {**asdict(case), "dtype": str(dtype).removeprefix("torch."), "kv_cache_dtype": kv_cache_dtype,
           "device": device.type}
    work = flops(case)
    for name, t in seconds.items():
        moved = bytes_moved(case, dtype, kv_cache_dtype if name == "triton" else "auto")
        row[f"{name}_us"] = t * 1e6
        row[f"{name}_tb_per_s"] = moved / t / 1e12
        row[f"{name}_pct_spec_bw"] = 100 * moved / t / bandwidth if bandwidth else float("nan")
        row[f"{name}_tflops"] = work / t / 1e12
    return row


def goal_met(row: dict) -> bool | None:
    """Whether the row meets its issue-4 goal; None where no goal applies (the goals are for GPUs)."""
    if row["device"] != "cuda":
        return None
    if row["kind"] == "decode":
        if row["batch"] < 64 or row["context"] < 4096:
            return None
        return row["triton_pct_spec_bw"] >= 100 * DECODE_GOAL
    return row["triton_tflops"] >= PREFILL_GOAL * FA3_PREFILL_TFLOPS


def format_row(row: dict) -> str:
    met = goal_met(row)
    goal = "" if met is None else ("goal met" if met else "GOAL MISSED")
    return (
        f"{row['kind']:8}{row['kv_cache_dtype']:>6}{row['batch']:>6}{row['context']:>8}"
        f"{row['triton_us']:>11.1f}{row['triton_tb_per_s']:>8.2f}{row['triton_pct_spec_bw']:>7.1f}"
        f"{row['triton_tflops']:>8.1f}"
        f"{row['sdpa_us']:>11.1f}{row['sdpa_tb_per_s']:>8.2f}{row['sdpa_pct_spec_bw']:>7.1f}"
        f"{row['sdpa_tflops']:>8.1f}  {goal}"
    )


HEADER = (
    f"{'kind':8}{'kv':>6}{'batch':>6}{'context':>8}"
    f"{'triton_us':>11}{'TB/s':>8}{'%spec':>7}{'TFLOP/s':>8}"
    f"{'sdpa_us':>11}{'TB/s':>8}{'%spec':>7}{'TFLOP/s':>8}"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="bfloat16")
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--reps", type=int, default=20, help="timed launches per shape (median reported)")
    parser.add_argument("--spec-bandwidth", type=float, help="spec memory bandwidth in TB/s (default: by GPU name)")
    parser.add_argument("--csv", help="also write the rows to this CSV file")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU via the Triton interpreter")
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="comma-separated KV cache formats for the Triton kernel: auto (the query's dtype), "
                             "int8, fp8, int4")
    args = parser.parse_args(argv)
    args.kv_cache_dtype = args.kv_cache_dtype.split(",")
    for name in args.kv_cache_dtype:
        if name not in ("auto", *quant.QUANTIZED_NAMES):
            parser.error(f"--kv-cache-dtype: {name!r} is not one of auto, {', '.join(quant.QUANTIZED_NAMES)}")
    return args


def smoke_cases() -> list[Case]:
    small = {"num_heads": 4, "num_kv_heads": 1, "head_dim": 32, "block_size": 8}
    return [Case("decode", 2, 40, **small), Case("prefill", 1, 24, **small)]


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.smoke:
        device, cases, reps, bandwidth = torch.device("cpu"), smoke_cases(), 2, None
    else:
        if not torch.cuda.is_available():
            sys.exit("kernels.bench needs a CUDA GPU and found none; `--smoke` checks the script on the CPU.")
        device, cases, reps = torch.device("cuda"), decode_cases(args.quick) + prefill_cases(args.quick), args.reps
        name = torch.cuda.get_device_name(device)
        bandwidth = spec_bandwidth(name)
        print(f"{name}; spec bandwidth from its name: {bandwidth and bandwidth / 1e12} TB/s")
    if args.spec_bandwidth:
        bandwidth = args.spec_bandwidth * 1e12
    dtype = getattr(torch, args.dtype)
    print(HEADER)
    rows = []
    for kv_cache_dtype in args.kv_cache_dtype:
        for case in cases:
            rows.append(run_case(case, dtype, device, reps, bandwidth, kv_cache_dtype))
            print(format_row(rows[-1]), flush=True)
    for kind in ("decode", "prefill"):
        judged = [goal_met(row) for row in rows if row["kind"] == kind and goal_met(row) is not None]
        print(f"{kind} goal met in {sum(judged)} of {len(judged)} shapes it applies to")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
