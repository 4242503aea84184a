"""The calibrated and measured (Vidur) GPU cost models, step_breakdown, and their bad inputs."""
import random
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paged.core.scheduler_output import SchedulerOutput
from sim import SimConfig, get_hardware, gpu_cost_model, load_workload, simulate, step_breakdown
from sim.calibrated import default_calibration, gemm_shapes, gemm_work, layer_op_seconds, layer_seconds
from sim.clock import TICKS_PER_S
from sim.models import get_model
from sim.vidur import find_profile, read_layer_profile
from sim.window import envelope, span

PROFILES = Path(__file__).resolve().parents[2] / "profiles" / "vidur"
A100_7B = PROFILES / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
VIDUR = f"vidur:{PROFILES}"


def batch(prefill=0, pairs=0, decode=0, ctx=0, prefill_requests=0):
    return SchedulerOutput([None] * decode, [None] * prefill_requests, [], num_prefill_tokens=prefill,
                           prefill_attention_pairs=pairs, num_decode_tokens=decode, decode_context_sum=ctx)


@pytest.mark.parametrize("spec,model,hw,tp", [("calibrated", "llama-2-7b", "a100-80gb", 1),
                                              ("calibrated", "llama-2-70b", "h100", 4),
                                              (VIDUR, "llama-3-8b", "a100-80gb", 2)])
def test_breakdown_total_is_the_simulators_step_time(spec, model, hw, tp):
    cm = gpu_cost_model(spec, model, hw, tp=tp)
    for p, d, ctx, reqs in [(512, 0, 0, 1), (0, 32, 32_000, 0), (300, 64, 90_000, 2), (0, 1, 10, 0)]:
        pairs = p * (p + 1) // 2
        parts = step_breakdown(model, hw, tp=tp, cost_model=spec, num_prefill_tokens=p, prefill_attention_pairs=pairs,
                               num_decode_tokens=d, decode_context_sum=ctx, num_seqs=d + reqs)
        ticks = cm.step_ticks(batch(p, pairs, d, ctx, reqs))
        assert round(parts["total"] * TICKS_PER_S) == ticks
        assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
        assert (parts["communication"] > 0) == (tp > 1)


def test_breakdown_defaults_a_fresh_prompt():
    parts = step_breakdown("llama-2-7b", "a100-80gb", tp=1, num_prefill_tokens=512)
    assert set(parts) >= {"non_attention", "attention", "lm_head", "communication", "overhead", "total"}
    # the LM head runs on the one sampled position, not on 512 rows: a small part of the step
    assert 0 < parts["lm_head"] < 0.02 * parts["non_attention"]
    assert parts["attention"] > 0 and parts["communication"] == 0
    # 32 layers of Llama-2-7B at 512 tokens measure 32 x 1.1 ms on an A100: the calibrated model is near
    assert parts["non_attention"] == pytest.approx(32 * read_layer_profile(A100_7B).at(1, 512), rel=0.1)


@pytest.mark.parametrize("spec", ["calibrated", VIDUR])
def test_decode_lines_agree_with_step_ticks(spec):
    cm = gpu_cost_model(spec, "llama-2-70b", "a100-80gb", tp=4, kv_cache_dtype="int8")
    rng = random.Random(0)
    for _ in range(40):
        B, ctx, k = rng.randint(1, 300), rng.randint(1, 10**6), rng.randint(1, 64)
        total = sum(cm.step_ticks(batch(decode=B, ctx=ctx + j * B)) for j in range(k))
        assert span(envelope(cm.decode_lines(B, ctx)), k) == total


def test_fast_path_is_exact_on_the_calibrated_model(azure_conv):
    w = load_workload(azure_conv, num_requests=200)
    fast, step = (simulate(w, SimConfig(cost_model="calibrated", fast_path=f)) for f in (True, False))
    assert fast.counters["num_windows"] > 0
    assert fast.summary()["simulated_time_s"] == step.summary()["simulated_time_s"]
    assert fast.requests.equals(step.requests)


def test_tile_steps_and_what_tensor_parallelism_splits():
    cal = default_calibration()
    t = layer_seconds("llama-2-7b", "a100-80gb", 1, np.array([120, 128, 136, 2048, 4096]), cal)
    assert t[2] > 1.15 * t[1]  # past a 128-row tile: a step, not a slope (+45% measured)
    assert t[1] < 1.1 * t[0]
    assert t[4] == pytest.approx(2 * t[3], rel=0.1)  # large batches: linear in tokens
    one, eight = (layer_op_seconds("llama-2-70b", "h100", tp, np.array([1024]), cal) for tp in (1, 8))
    assert one["input_layernorm"] == eight["input_layernorm"] and one["add"] == eight["add"]  # not split
    assert one["mlp_act"] > 6 * eight["mlp_act"] and one["mlp_up_proj"] > 4 * eight["mlp_up_proj"]


def test_hopper_launches_row_tiles_in_clusters_of_two():
    """Llama-2-70B's gate/up on 8 H100s (7,168 x 8,192). At 512 tokens the least SM time is one wave's worth of
    128 x 256 tiles (4 x 28 of them). At 520, 9 rows of 64-row tiles launch as 10, and the least is 10 x 56 tiles
    of 64 x 128 in 5 waves of 132 SMs: 25% more, where the same GPU without clusters finds no more than at 512
    (measured: 91 us, then 182)."""
    h100 = get_hardware("h100")
    assert h100.cta_cluster == 2 and get_hardware("a100-80gb").cta_cluster == 1
    n, k = gemm_shapes(get_model("llama-2-70b"), 8)["mlp_up_proj"]
    clustered = gemm_work(np.array([512, 520]), n, k, h100)[1]
    unclustered = gemm_work(np.array([512, 520]), n, k, replace(h100, cta_cluster=1))[1]
    assert clustered[0] == unclustered[0] == unclustered[1]
    assert clustered[1] == pytest.approx(1.25 * clustered[0])


def test_a_gpu_without_profiles_gets_datasheet_constants():
    cal = default_calibration()
    assert "l4" not in cal.gemm
    g = cal.gemm_for(get_hardware("l4"))
    fitted = list(cal.gemm.values())
    assert min(f.compute_efficiency for f in fitted) <= g.compute_efficiency <= max(f.compute_efficiency
                                                                                   for f in fitted)
    assert "datasheet" in gpu_cost_model("calibrated", "llama-2-7b", "l4").description
    assert "fitted" in gpu_cost_model("calibrated", "llama-2-7b", "h100").description
    # an L4 streams weights at 300 GB/s, an H100 at 3.35 TB/s: decode is ~10x slower
    l4, h100 = (step_breakdown("llama-2-7b", hw, num_decode_tokens=1, decode_context_sum=10) for hw in ("l4", "h100"))
    assert 6 < l4["non_attention"] / h100["non_attention"] < 14


def test_measured_profile_is_exact_at_profiled_points_and_read_as_vidur_sums():
    p = read_layer_profile(A100_7B, "llama-2-7b")
    assert sorted(p.tokens) == [1, 2, 4, 8]
    # row 4096 tokens, TP 1: the medians of the nine operators but emb, ms -> s
    at = p.at(1, 4096)
    assert at == pytest.approx(sum(v[-1] for v in p.ops[1].values()))
    assert at == pytest.approx(1.911e-3 + 0.149e-3 + 0.611e-3 + 0.105e-3 + 0.104e-3 + 3.3655e-3 + 0.266e-3
                               + 1.604e-3 + 0.055e-3, rel=0.02)
    assert np.array_equal(p.at(1, p.tokens[1]), p.seconds[1])
    assert p.at(1, 8192) == pytest.approx(2 * at, rel=0.05)  # past the last: the last two's slope


def test_a_file_of_several_models_gives_each_model_its_rows(tmp_path):
    """Vidur's older per-GPU mlp.csv holds every model's rows in one file: each model takes its own, even
    where another model's rows leave an operator empty (phi-2 has no post-attention norm)."""
    import csv
    import io

    llama3 = PROFILES / "a100" / "meta-llama" / "Meta-Llama-3-8B" / "mlp.csv"
    lines2, lines3 = A100_7B.read_text().splitlines(), llama3.read_text().splitlines()
    assert lines2[0] == lines3[0]
    phi2 = list(csv.DictReader(io.StringIO("\n".join(lines2[:20]))))
    for r in phi2:
        r.update({c: "" for c in r if c.startswith("time_stats.post_attention_layernorm.")})
        r.update(n_head="32", n_kv_head="32", n_embd="2560", n_expanded_embd="10240")
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(phi2[0]), lineterminator="\n")
    w.writerows(phi2)
    both = tmp_path / "mlp.csv"
    both.write_text("\n".join([lines2[0], out.getvalue().rstrip("\n"), *lines3[1:], *lines2[1:]]) + "\n")
    for model, alone in (("llama-2-7b", A100_7B), ("llama-3-8b", llama3)):
        got, want = read_layer_profile(both, model), read_layer_profile(alone, model)
        assert got.tokens.keys() == want.tokens.keys()
        for tp in want.tokens:
            assert np.array_equal(got.tokens[tp], want.tokens[tp]) and np.array_equal(got.seconds[tp], want.seconds[tp])
    with pytest.raises(ValueError, match=r"rows of 3 shapes .*\(32, 8, 4096, 14336\), \(32, 32, 2560, 10240\), "
                                         r"\(32, 32, 4096, 11008\)\]"):
        read_layer_profile(both)
    for tokens in (1, 300, 4096):
        mixed = step_breakdown("llama-3-8b", "a100-80gb", cost_model=f"vidur:{tmp_path}", num_prefill_tokens=tokens)
        own = step_breakdown("llama-3-8b", "a100-80gb", cost_model=f"vidur:{llama3.parent}", num_prefill_tokens=tokens)
        assert mixed == own


def test_bad_profiles(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*no such folder"):
        gpu_cost_model(f"vidur:{tmp_path / 'nowhere'}", "llama-2-7b", "a100-80gb")
    with pytest.raises(FileNotFoundError, match=r"'llama-2-13b'.*meta-llama/llama-2-13b-hf.*'a100'"):
        find_profile(PROFILES, "llama-2-13b", "a100-80gb")
    with pytest.raises(ValueError, match=r"num_tensor_parallel_workers=3.*\[1, 2, 4, 8\]"):
        gpu_cost_model(f"vidur:{A100_7B.parent}", "llama-2-7b", "a100-80gb", tp=3)
    with pytest.raises(ValueError, match=r"\(32, 8, 4096, 14336\).*llama-2-7b's \(32, 32, 4096, 11008\)"):
        read_layer_profile(PROFILES / "a100" / "meta-llama" / "Meta-Llama-3-8B" / "mlp.csv", "llama-2-7b")
    bad = tmp_path / "mlp.csv"
    lines = A100_7B.read_text().splitlines()
    bad.write_text("\n".join([lines[0].replace("time_stats.add.median", "add_median"), *lines[1:]]))
    with pytest.raises(ValueError, match=r"missing column\(s\) \['time_stats.add.median'\]: expected Vidur's mlp.csv"):
        read_layer_profile(bad)
    row = lines[1].split(",")
    row[lines[0].split(",").index("time_stats.add.median")] = "fast"
    bad.write_text("\n".join([lines[0], ",".join(row), *lines[2:]]))
    with pytest.raises(ValueError, match="'fast'.*expected numbers"):
        read_layer_profile(bad)
    with pytest.raises(ValueError, match=r"cost model 'vidur'.*expected 'calibrated' or 'vidur:DIR'"):
        gpu_cost_model("vidur", "llama-2-7b", "a100-80gb")
    with pytest.raises(ValueError, match=r"unknown hardware 'tpu-v5'.*a100-80gb"):
        step_breakdown("llama-2-7b", "tpu-v5", num_decode_tokens=1)
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5'.*llama-2-7b"):
        step_breakdown("gpt-5", "h100", num_decode_tokens=1)


def test_cli_breakdown_and_run_on_measured_profiles(tmp_path, azure_conv, capsys):
    from sim.cli import main

    assert main(["breakdown", "--model", "llama-2-70b", "--hardware", "h100", "--tp", "4", "--plot",
                 str(tmp_path / "b.png")]) == 0
    out = capsys.readouterr().out
    assert "non_attention" in out and "prefill 2048" in out and (tmp_path / "b.png").stat().st_size > 0
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "100", "--cost-model", VIDUR,
                 "--json", str(tmp_path / "s.json")]) == 0
    assert f'"cost_model": "{VIDUR}"' in (tmp_path / "s.json").read_text()
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "5", "--cost-model", "vidur:/nowhere"]) == 2
    assert "'/nowhere': no such folder" in capsys.readouterr().err


def write_attention_csv(path, coef_ms, tp=1, shape=(4096, 32, 32), noise=0.01):
    """Vidur's attention.csv layout, rows timed (ms, one layer) by the line `coef_ms` over
    (1, prefill tokens, pairs, decode tokens, context sum), plus a kv_cache_save column."""
    rng = np.random.default_rng(0)
    head = ("n_embd,n_q_head,n_kv_head,block_size,num_tensor_parallel_workers,max_model_len,batch_size,"
            "prefill_chunk_size,kv_cache_size,is_prefill,attention_backend,time_stats.attn_prefill.median,"
            "time_stats.attn_decode.median,time_stats.attn_kv_cache_save.median")
    lines = [head]
    for _ in range(300):
        prefill, kv = rng.random() < 0.5, int(rng.integers(0, 4096))
        b, chunk = (1, int(rng.integers(16, 2048))) if prefill else (int(rng.integers(1, 256)), 0)
        x = [1, chunk, chunk * kv + chunk * (chunk + 1) // 2, 0, 0] if prefill else [1, 0, 0, b, b * kv]
        ms = float(np.dot(coef_ms, x)) * (1 + noise * rng.standard_normal())
        save = 0.001
        times = f"{ms - save},," if prefill else f",{ms - save},"
        lines.append(f"{shape[0]},{shape[1]},{shape[2]},16,{tp},4096,{b},{chunk},{kv},{prefill},FLASH,{times}{save}")
    path.write_text("\n".join(lines) + "\n")


def test_measured_attention_beside_mlp_csv(tmp_path):
    coef_ms = np.array([0.01, 1e-5, 2e-8, 3e-4, 4e-6])
    shutil.copy(A100_7B, tmp_path / "mlp.csv")
    write_attention_csv(tmp_path / "attention.csv", coef_ms)
    cm = gpu_cost_model(f"vidur:{tmp_path}", "llama-2-7b", "a100-80gb")
    assert "attention measured" in cm.description
    for kw, x in [(dict(num_decode_tokens=64, decode_context_sum=64 * 1000), [1, 0, 0, 64, 64000]),
                  (dict(num_prefill_tokens=1024), [1, 1024, 1024 * 1025 // 2, 0, 0])]:
        got = step_breakdown("llama-2-7b", "a100-80gb", cost_model=cm, **kw)["attention"]
        assert got == pytest.approx(32 * coef_ms @ x / 1000, rel=0.03)
    calibrated = step_breakdown("llama-2-7b", "a100-80gb", num_decode_tokens=64, decode_context_sum=64000)
    assert calibrated["attention"] != pytest.approx(got, rel=0.03)
    rng = random.Random(1)
    for _ in range(20):  # still one line in the context sum: the fast path's closed form holds
        B, ctx, k = rng.randint(1, 100), rng.randint(1, 10**5), rng.randint(1, 32)
        total = sum(cm.step_ticks(batch(decode=B, ctx=ctx + j * B)) for j in range(k))
        assert span(envelope(cm.decode_lines(B, ctx)), k) == total


def test_bad_attention_csv(tmp_path):
    shutil.copy(A100_7B, tmp_path / "mlp.csv")
    write_attention_csv(tmp_path / "attention.csv", np.ones(5) * 1e-4, shape=(8192, 64, 8))
    with pytest.raises(ValueError, match=r"0 rows of shape .* \(4096, 32, 32, 1\): expected at least 5"):
        gpu_cost_model(f"vidur:{tmp_path}", "llama-2-7b", "a100-80gb")
    lines = (tmp_path / "attention.csv").read_text().splitlines()
    (tmp_path / "attention.csv").write_text("\n".join([lines[0].replace("kv_cache_size", "kv"), *lines[1:]]))
    with pytest.raises(ValueError, match=r"missing column\(s\) \['kv_cache_size'\]: expected Vidur's attention.csv"):
        gpu_cost_model(f"vidur:{tmp_path}", "llama-2-7b", "a100-80gb")
