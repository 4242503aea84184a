"""The benchmark's accounting and plumbing (its timings need a GPU; its arithmetic does not)."""

import pytest
import torch

from kernels import bench


def test_decode_bytes_are_the_kv_cache_plus_query_and_output():
    case = bench.Case("decode", batch=2, context=32, num_heads=8, num_kv_heads=2, head_dim=4, block_size=16)
    kv = 2 * 2 * 32 * 2 * 4 * 2  # K and V, batch, context, kv heads, head dim, bytes
    query_and_out = 2 * 2 * 1 * 8 * 4 * 2
    assert bench.bytes_moved(case, torch.float16) == kv + query_and_out + 2 * 2 * 4


def test_quantized_kv_bytes_are_the_formats_own():
    """int4 at head dim 4: 2 bytes of values and one float32 scale (a group of 4) per head, for K and V."""
    case = bench.Case("decode", batch=2, context=32, num_heads=8, num_kv_heads=2, head_dim=4, block_size=16)
    query_and_out_and_table = 2 * 2 * 1 * 8 * 4 * 2 + 2 * 2 * 4
    assert bench.bytes_moved(case, torch.float16, "int4") == 2 * 32 * 2 * 2 * (2 + 4) + query_and_out_and_table
    assert bench.bytes_moved(case, torch.float16, "fp8") == 2 * 32 * 2 * 2 * 4 + query_and_out_and_table


def test_flops_count_the_causal_pairs():
    prefill = bench.Case("prefill", batch=1, context=4, num_heads=1, head_dim=1)
    assert bench.flops(prefill) == 4 * (1 + 2 + 3 + 4)
    decode = bench.Case("decode", batch=3, context=10, num_heads=2, head_dim=8)
    assert bench.flops(decode) == 4 * 3 * 2 * 8 * 10


def test_spec_bandwidth_by_name():
    assert bench.spec_bandwidth("NVIDIA H200") == 4.8e12
    assert bench.spec_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert bench.spec_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert bench.spec_bandwidth("Tesla T4") is None


def test_goals_apply_where_the_issue_sets_them():
    row = {"device": "cuda", "kind": "decode", "batch": 64, "context": 4096, "triton_pct_spec_bw": 81.0}
    assert bench.goal_met(row) is True
    assert bench.goal_met({**row, "triton_pct_spec_bw": 79.0}) is False
    assert bench.goal_met({**row, "batch": 8}) is None
    assert bench.goal_met({**row, "device": "cpu"}) is None
    prefill = {"device": "cuda", "kind": "prefill", "triton_tflops": 0.6 * 616 + 1}
    assert bench.goal_met(prefill) is True


def test_shape_grid_covers_the_issue():
    decode = bench.decode_cases(quick=False)
    assert {c.batch for c in decode} == {1, 8, 64, 256} and {c.context for c in decode} == {512, 4096, 32768}
    assert all(c.head_dim == 128 and c.num_heads == 8 * c.num_kv_heads for c in decode)


def test_needs_a_gpu_unless_smoke(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench.main([])


def test_smoke_run_over_quantized_caches():
    rows = bench.main(["--smoke", "--kv-cache-dtype", "fp8,int4"])
    assert [(row["kv_cache_dtype"], row["kind"]) for row in rows] == [
        ("fp8", "decode"), ("fp8", "prefill"), ("int4", "decode"), ("int4", "prefill")]
    assert all(row["triton_us"] > 0 for row in rows)


def test_unknown_kv_cache_dtype_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--smoke", "--kv-cache-dtype", "int3"])
    assert "'int3' is not one of auto, int8, fp8, int4" in capsys.readouterr().err


def test_smoke_run_prints_every_shape(tmp_path, capsys):
    rows = bench.main(["--smoke", "--csv", str(tmp_path / "bench.csv")])
    assert [row["kind"] for row in rows] == ["decode", "prefill"]
    assert all(row["triton_us"] > 0 and row["sdpa_us"] > 0 for row in rows)
    assert (tmp_path / "bench.csv").read_text().count("\n") == 3
    assert "prefill goal met in 0 of 0" in capsys.readouterr().out
