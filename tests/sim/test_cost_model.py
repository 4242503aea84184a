"""Roofline, memory plan and profiled cost model: sanity against known figures."""
import functools
import json
import random
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from paged.core.scheduler_output import SchedulerOutput
from sim import fit_profile, get_hardware, get_model, plan_kv_cache, roofline_cost_model, simulate
from sim.clock import TICKS_PER_S
from sim.profiled import ProfiledCostModel
from sim.window import envelope, span

from .strategies import sim_configs, workloads
from .test_fast_path import assert_identical


def step(cm, **kw) -> float:
    return cm.step_seconds(**kw)


def test_roofline_llama2_7b_a100():
    cm = roofline_cost_model("llama-2-7b", "a100-80gb")
    # decode of one short sequence: the weights (13.5 GB) at ~80% of 2 TB/s, plus the overhead
    one = step(cm, num_decode_tokens=1, decode_context_sum=100, num_seqs=1)
    assert 0.008 < one < 0.012
    # a 2048-token prefill is compute-bound: 27.6 TFLOP at 60% of 312 TFLOP/s
    pre = step(cm, num_prefill_tokens=2048, prefill_attention_pairs=2048 * 2049 // 2, num_seqs=1)
    assert 0.14 < pre < 0.18
    # decode cost grows with the context read
    assert step(cm, num_decode_tokens=64, decode_context_sum=64 * 2000, num_seqs=64) > 2 * one
    h100 = roofline_cost_model("llama-2-7b", "h100")
    assert step(h100, num_decode_tokens=1, decode_context_sum=100, num_seqs=1) < one


def test_tensor_parallel_and_kv_dtype():
    base = roofline_cost_model("llama-2-13b", "a100-80gb")
    tp2 = roofline_cost_model("llama-2-13b", "a100-80gb", tp=2)
    kw = dict(num_decode_tokens=32, decode_context_sum=32 * 1000, num_seqs=32)
    assert step(base, **kw) / 2 < step(tp2, **kw) < step(base, **kw)  # split work, plus all-reduce
    fp16, fp8, int4 = (roofline_cost_model("llama-2-7b", "a100-80gb", kv_cache_dtype=d)
                       for d in ("fp16", "fp8", "int4"))
    long = dict(num_decode_tokens=128, decode_context_sum=128 * 3000, num_seqs=128)
    assert step(fp8, **long) < step(fp16, **long)  # half the KV bytes read
    assert step(int4, **long) > step(fp8, **long) * 0.8  # dequantization eats much of int4's saving


def test_memory_plan():
    m, a100 = get_model("llama-2-7b"), get_hardware("a100-80gb")
    plan = plan_kv_cache(m, a100)
    assert m.kv_bytes_per_token() == 512 * 1024
    assert 7000 < plan.num_gpu_blocks < 8000  # ~0.9 * 80 GiB - 13.5 GB, in 8 MiB blocks
    assert plan_kv_cache(m, a100, kv_dtype="fp8").num_gpu_blocks == pytest.approx(2 * plan.num_gpu_blocks, abs=2)
    assert plan_kv_cache(m, a100, kv_dtype="int4").num_gpu_blocks > 3 * plan.num_gpu_blocks
    with pytest.raises(ValueError, match=r"short by \d+\.\d GB"):
        plan_kv_cache(get_model("llama-2-70b"), a100)
    assert plan_kv_cache(get_model("llama-2-70b"), a100, tp=2).num_gpu_blocks > 0
    assert plan_kv_cache(get_model("llama-3.1-8b"), get_hardware("h200")).num_gpu_blocks * 16 > 131072


def test_unknown_names_list_the_known():
    with pytest.raises(ValueError, match="llama-2-7b"):
        get_model("gpt-5")
    with pytest.raises(ValueError, match="a100-80gb"):
        get_hardware("tpu-v5")
    with pytest.raises(ValueError, match="fp16"):
        roofline_cost_model("llama-2-7b", "h100", kv_cache_dtype="fp4")


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-8b", "smollm2-135m", "llama-2-70b"])
def test_decode_lines_agree_with_step_ticks(model):
    cm = roofline_cost_model(model, "h100", tp=2 if "70b" in model else 1)
    rng = random.Random(0)
    for _ in range(50):
        B, ctx, k = rng.randint(1, 256), rng.randint(1, 10**6), rng.randint(1, 64)
        lines = cm.decode_lines(B, ctx)
        reqs = [None] * B
        total = 0
        for j in range(k):
            out = SchedulerOutput(reqs, [], [], num_decode_tokens=B, decode_context_sum=ctx + j * B)
            total += cm.step_ticks(out)
        assert span(envelope(lines), k) == total


def write_profile(path, coef, n=200, noise=0.02, seed=0, decode_bump_s=None, batches=128):
    """A profile of random steps timed by the line `coef`, plus `decode_bump_s[batch]` on decode-only steps."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        p = int(rng.integers(0, 2048)) if rng.random() < 0.5 else 0
        d = int(rng.integers(0 if p else 1, batches))
        ctx = d * int(rng.integers(16, 2048))
        pairs = p * (p + 1) // 2
        x = np.array([1, p, pairs, d, ctx, d + (1 if p else 0)], dtype=float)
        bump = (decode_bump_s or {}).get(d, 0.0) if not p else 0.0
        t = (float(x @ coef) + bump) * (1 + noise * rng.standard_normal())
        samples.append(dict(num_prefill_tokens=p, prefill_attention_pairs=pairs, num_decode_tokens=d,
                            decode_context_sum=ctx, num_seqs=int(x[5]), time_s=t))
    path.write_text(json.dumps({"format": "paged-step-profile/1", "model": "smollm2-135m", "device": "cpu",
                                "dtype": "float32", "block_size": 16, "num_threads": 2, "samples": samples}))


def test_profiled_model_recovers_coefficients(tmp_path):
    coef = np.array([2e-3, 5e-6, 1e-9, 2e-5, 3e-8, 1e-5])
    p = tmp_path / "prof.json"
    write_profile(p, coef)
    fit = fit_profile(p)
    assert fit.heldout_mape < 0.03  # the 2% noise
    got = np.array(list(fit.coefficients_s.values()))
    assert np.all(got >= 0)
    assert got[0] == pytest.approx(coef[0], rel=0.1) and got[1] == pytest.approx(coef[1], rel=0.1)
    assert "held-out error" in fit.cost_model.description
    # Nothing for the corrections to find but noise (a sample or two per size): the line is kept alone.
    assert fit.decode_corrections_s == fit.prefill_corrections_s == {}
    assert fit.heldout_mape == fit.line_heldout_mape and "did not help" in fit.cost_model.description


# What this CPU's matmuls do at a few rows (decode 41, 64, 80, 65 ms at batches 1-4): a line cannot follow it.
BUMPS = {1: -0.010, 2: 0.010, 3: 0.025}


def test_corrections_follow_what_the_line_cannot(tmp_path):
    coef = np.array([0.045, 2e-3, 1e-9, 3e-3, 5e-6, 0.0])
    p = tmp_path / "prof.json"
    write_profile(p, coef, n=300, decode_bump_s=BUMPS, batches=17)
    fit = fit_profile(p)
    assert fit.heldout_mape < min(0.03, 0.6 * fit.line_heldout_mape)  # the line alone misses the bumps
    for batch in range(1, 17):
        expected = coef @ [1, 0, 0, batch, 1000 * batch, batch] + BUMPS.get(batch, 0.0)
        got = fit.cost_model.step_seconds(num_decode_tokens=batch, decode_context_sum=1000 * batch, num_seqs=batch)
        assert got == pytest.approx(expected, rel=0.03), batch
    # beyond the largest measured batch the line's slope carries on, with the last correction held
    big = fit.cost_model.step_seconds(num_decode_tokens=64, decode_context_sum=6400, num_seqs=64)
    assert big == pytest.approx(coef @ [1, 0, 0, 64, 6400, 64], rel=0.05)


def test_a_correction_never_takes_a_step_below_one_tick():
    cm = ProfiledCostModel((0.01, 0, 0, 0.001, 0, 0), {1: -1.0, 4: 0.002}, {1: -1.0})
    assert cm.step_seconds(num_decode_tokens=1, num_seqs=1) == 1 / TICKS_PER_S
    assert cm.step_seconds(num_prefill_tokens=1, prefill_attention_pairs=1, num_seqs=1) == 1 / TICKS_PER_S
    assert cm.step_seconds(num_decode_tokens=4, num_seqs=4) == pytest.approx(0.016)
    assert cm.step_seconds(num_decode_tokens=2, num_seqs=2) > 0  # interpolated from 1 and 4, then held at 1 tick


def test_profiled_decode_lines_agree_with_step_ticks():
    cm = ProfiledCostModel((0.04, 2e-3, 1e-9, 3e-3, 5e-6, 1e-4), {1: -0.009, 2: 0.01, 3: 0.023, 8: -0.002}, {})
    rng = random.Random(0)
    for _ in range(200):
        B, ctx, k = rng.randint(1, 40), rng.randint(1, 10**5), rng.randint(1, 64)
        reqs = [None] * B
        total = sum(cm.step_ticks(SchedulerOutput(reqs, [], [], num_decode_tokens=B, decode_context_sum=ctx + j * B))
                    for j in range(k))
        assert span(envelope(cm.decode_lines(B, ctx)), k) == total


@settings(max_examples=settings().max_examples * 2)
@given(workloads(), sim_configs())
def test_fast_path_is_exact_with_corrections(workload, config):
    """The corrections depend on the number of sequences only, fixed within a window: still exact."""
    cm = ProfiledCostModel((0.004, 2e-5, 1e-9, 1e-3, 1e-7, 1e-4), {1: -0.003, 2: 0.002, 3: 0.005, 5: -0.001},
                           {1: 0.001, 2: 0.004, 4: -0.002})
    fast, step = (simulate(workload, replace(config, cost_model=cm, fast_path=f)) for f in (True, False))
    assert_identical(fast, step)


def test_bad_profiles(tmp_path):
    p = tmp_path / "prof.json"
    p.write_text(json.dumps({"format": "other/2", "samples": []}))
    with pytest.raises(ValueError, match="paged-step-profile/1"):
        fit_profile(p)
    write_profile(p, np.ones(6) * 1e-4, n=10)
    doc = json.loads(p.read_text())
    doc["samples"][3]["time_s"] = -1
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"samples\[3\]\.time_s=-1"):
        fit_profile(p)


@functools.cache
def bumped_fit():
    """A fit with corrections by batch size (fitted once: the property below only evaluates it)."""
    path = Path(tempfile.mkdtemp()) / "prof.json"
    write_profile(path, np.array([0.045, 2e-3, 1e-9, 3e-3, 5e-6, 0.0]), n=300, decode_bump_s=BUMPS, batches=17)
    return fit_profile(path)


@settings(max_examples=100, deadline=None)
@given(factor=st.floats(0.25, 4.0), p=st.integers(0, 512), d=st.integers(0, 40), ctx=st.integers(0, 4000))
def test_a_scaled_fit_is_every_step_times_the_factor(factor, p, d, ctx):
    """`ProfileFit.scaled`: the same model on a machine `factor` times slower, corrections included."""
    assume(p or d)
    fit = bumped_fit()
    assert fit.decode_corrections_s  # the corrections are scaled too
    shape = dict(num_prefill_tokens=p, prefill_attention_pairs=p * (p + 1) // 2, num_decode_tokens=d,
                 decode_context_sum=ctx * d, num_seqs=d + (1 if p else 0))
    base, scaled = fit.cost_model.step_seconds(**shape), fit.scaled(factor).step_seconds(**shape)
    # exact up to each coefficient's rounding to a tick (half a tick per unit of each feature, on either side)
    rounding = (2 + sum(shape.values())) * (1 + factor) / TICKS_PER_S
    assert scaled == pytest.approx(factor * base, rel=1e-12, abs=rounding)


def test_a_scaled_fit_refuses_a_factor_not_above_zero(tmp_path):
    path = tmp_path / "prof.json"
    write_profile(path, np.array([2e-3, 5e-6, 1e-9, 2e-5, 3e-8, 1e-5]))
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=r"factor=.*expected a number > 0"):
            fit_profile(path).scaled(bad)


def test_each_correction_table_is_kept_on_its_own_merit(tmp_path):
    """Decode steps with bumps a line cannot follow, and steps with a prefill chunk measured once or twice
    per size with 20% noise (a busy machine): the prefill table fits that noise and is dropped, the decode
    table is kept (judged together, the noisy table took the decode one down with it)."""
    rng = np.random.default_rng(3)
    coef = np.array([0.045, 2e-3, 1e-9, 3e-3, 5e-6, 0.0])
    samples = []
    for batch in range(1, 9):
        for ctx in (192, 288, 400, 512):
            x = np.array([1, 0, 0, batch, ctx * batch, batch], dtype=float)
            t = (float(x @ coef) + BUMPS.get(batch, 0.0)) * (1 + 0.01 * rng.standard_normal())
            samples.append(dict(num_prefill_tokens=0, prefill_attention_pairs=0, num_decode_tokens=batch,
                                decode_context_sum=ctx * batch, num_seqs=batch, time_s=t))
    for batch in range(0, 9):
        for chunk in (32, 128)[:1 + batch % 2]:
            pairs = chunk * (chunk + 1) // 2
            x = np.array([1, chunk, pairs, batch, 224 * batch, batch + 1], dtype=float)
            samples.append(dict(num_prefill_tokens=chunk, prefill_attention_pairs=pairs, num_decode_tokens=batch,
                                decode_context_sum=224 * batch, num_seqs=batch + 1,
                                time_s=float(x @ coef) * (1 + 0.2 * rng.standard_normal())))
    p = tmp_path / "prof.json"
    p.write_text(json.dumps({"format": "paged-step-profile/1", "model": "smollm2-135m", "device": "cpu",
                             "dtype": "float32", "block_size": 16, "num_threads": 1, "samples": samples}))
    fit = fit_profile(p)
    assert fit.decode_corrections_s and not fit.prefill_corrections_s
    assert "for decode steps" in fit.cost_model.description
    assert fit.heldout_mape < fit.line_heldout_mape
    for batch in (1, 2, 3, 4):
        expected = coef @ [1, 0, 0, batch, 300 * batch, batch] + BUMPS.get(batch, 0.0)
        got = fit.cost_model.step_seconds(num_decode_tokens=batch, decode_context_sum=300 * batch, num_seqs=batch)
        assert got == pytest.approx(expected, rel=0.05), batch
