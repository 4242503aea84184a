"""The experiments run end to end on a small slice (`--quick`) and write what they promise.

A slice is too small to test the article's numbers, so these tests check the plumbing (CSV
columns, figures, verdicts) and the direction of each effect, which any slice must show:
paging keeps more of its KV memory busy with tokens than static batching, sharing a prefix
never costs blocks, a bigger cache never hits less, a 4-bit cache holds more tokens, and
priority serves valuable requests sooner than FCFS.
"""
import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = [pytest.mark.filterwarnings("error::sim.plots.SmallTextWarning"),
              pytest.mark.filterwarnings("error::sim.plots.OverlappingTextWarning")]
EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def load(name: str):
    """Import an experiment as `python experiments/NAME.py` would: its folder on the path."""
    if str(EXPERIMENTS) not in sys.path:
        sys.path.insert(0, str(EXPERIMENTS))
    return importlib.import_module(name)


def run_quick(name: str, out: Path) -> pd.DataFrame:
    assert load(name).main(["--quick", "--out", str(out)]) == 0
    check_figure(out / f"{name}.png")
    check_verdicts((out / "verdicts.txt").read_text())
    return pd.read_csv(out / f"{name}.csv")


def check_figure(path: Path) -> None:
    """A real figure, about a column wide at the style's resolution: printed a column wide, its
    7.5-point tick labels stay at 7 points or more. (`sim.plots.save` checks every text's size
    too, and whether texts overlap: this module turns its warnings into errors.)"""
    from PIL import Image

    from sim.plots import COLUMN_WIDTH_IN, MIN_PRINTED_PT, STYLE

    assert path.stat().st_size > 10_000
    widest_in = COLUMN_WIDTH_IN * STYLE["xtick.labelsize"] / MIN_PRINTED_PT
    assert Image.open(path).size[0] <= widest_in * STYLE["savefig.dpi"]


def check_verdicts(text: str) -> None:
    """Each verdict opens with a one-line headline, then the claim it answers, then the details."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("[")]
    assert heads and heads[0] == 0
    for i in heads:
        outcome, headline = lines[i][1:].split("] ", 1)
        assert outcome in ("HOLDS", "PARTLY HOLDS", "DOES NOT HOLD") and 0 < len(headline) <= 100
        assert lines[i + 1].startswith("    claim: ") and lines[i + 2].startswith("    ")


def test_static_vs_paged(tmp_path):
    sweep = run_quick("static_vs_paged", tmp_path)
    assert {"system", "offered_qps", "throughput_req_s", "kv_tokens_perc", "kv_usage_perc", "kv_held_holding_tokens",
            "ttft_s_p50", "e2e_s_p99"} <= set(sweep.columns)
    sat = sweep[np.isinf(sweep.offered_qps)].set_index("system")
    paged, static = sat.loc["paged"], sat.loc["static (max_model_len)"]
    assert paged.kv_tokens_perc > static.kv_tokens_perc
    assert paged.kv_held_holding_tokens > 0.9 > static.kv_held_holding_tokens
    # the reservation changes what is held, not the tokens or the schedule
    oracle = sat.loc["static (max_tokens)"]
    assert static.kv_usage_perc > oracle.kv_usage_perc
    assert static.kv_tokens_perc == pytest.approx(oracle.kv_tokens_perc)
    assert static.throughput_req_s == pytest.approx(oracle.throughput_req_s)
    assert paged.throughput_req_s > static.throughput_req_s
    assert ((sweep.kv_tokens_perc >= 0) & (sweep.kv_tokens_perc <= sweep.kv_usage_perc + 1e-9)).all()
    cap = pd.read_csv(tmp_path / "static_vs_paged_capacity.csv")
    assert cap[cap.system == "paged"].throughput_req_s.min() > cap[cap.system != "paged"].throughput_req_s.max()


def markers_on_the_frame(fig) -> list[str]:
    """The series whose markers, edge included, reach past their panel's frame, where the axis
    line cuts them (static's squares at 28% sat on the bottom of a held-memory panel from 24%)."""
    fig.canvas.draw()
    out = []
    for ax in fig.axes:
        box = ax.get_window_extent()
        for line in ax.get_lines():
            if line.get_marker() in ("None", "none", ""):
                continue
            r = (line.get_markersize() + line.get_markeredgewidth()) / 2 * fig.dpi / 72
            y = ax.transData.transform(np.column_stack(line.get_data()))[:, 1]
            if ((y - r < box.y0) | (y + r > box.y1)).any():
                out.append(f"{ax.get_title()}: {line.get_label()}")
    return out


def test_static_vs_paged_labels_every_batch_size_of_its_capacity_panel(tmp_path):
    """The full run's eight sizes (static 8-32, paged 8-256) under bars 0.15 in apart printed "816 32
    64256"; the bars now run across, each size its own line down the side, none of them dropped.
    And no marker sits on a panel's frame."""
    import matplotlib.pyplot as plt

    from sim.plots import save

    exp = load("static_vs_paged")
    metrics = ("kv_tokens_perc", "kv_usage_perc", "kv_held_holding_tokens", "throughput_req_s", "ttft_s_p50",
               "ttft_s_p99", "e2e_s_p50", "e2e_s_p99")
    held = {"paged": 0.97, "static (max_model_len)": 0.28, "static (max_tokens)": 0.8}  # the full run's
    sweep = pd.DataFrame([{"system": system, "offered_qps": q, **dict.fromkeys(metrics, 0.5),
                           "kv_held_holding_tokens": held[system] + 0.01 * (q > 1),
                           "kv_tokens_perc": 0.1 * q if system == "paged" else 0.05}
                          for system, _, _ in exp.SYSTEMS for q in (0.25, 0.5, 1, 2, 4, 8)])
    sizes = [("static (max_model_len)", b) for b in (8, 16, 32)] + [("paged", m) for m in (8, 16, 32, 64, 256)]
    cap = pd.DataFrame([{"system": system, "max_batch_size": b, "throughput_req_s": 1.0} for system, b in sizes])
    fig = exp.plot(sweep, cap)
    save(fig, tmp_path / "f.png")
    panel = fig.axes[5]
    shown = [t.get_text() for axis in (panel.xaxis, panel.yaxis) for t in axis.get_ticklabels() if t.get_visible()]
    assert [s for s in shown if s in {"8", "16", "32", "64", "256"}] == [str(b) for _, b in sizes]
    assert not markers_on_the_frame(fig)
    plt.close(fig)

def test_batch_latency(tmp_path):
    table = run_quick("batch_latency", tmp_path)
    assert {"system", "max_batch_size", "offered_qps", "ttft_s_p10", "ttft_s_p50", "ttft_s_p90", "tpot_s_p50",
            "e2e_s_std"} <= set(table.columns)
    assert (table.ttft_s_p10 <= table.ttft_s_p50).all() and (table.ttft_s_p50 <= table.ttft_s_p90).all()
    static, paged = (table[(table.system == s) & (table.max_batch_size == 8)].iloc[0] for s in ("static", "paged"))
    assert paged.ttft_s_p50 < static.ttft_s_p50
    assert paged.ttft_s_p90 - paged.ttft_s_p10 < static.ttft_s_p90 - static.ttft_s_p10


def test_prefix_sharing(tmp_path):
    table = run_quick("prefix_sharing", tmp_path)
    assert {"prefix_tokens", "prefix_caching", "peak_kv_blocks", "peak_kv_gib", "kv_saved", "max_concurrent"} <= set(
        table.columns)
    assert (table.num_preemptions == 0).all() and (table.max_concurrent == 100).all()
    by = table.pivot(index="prefix_tokens", columns="prefix_caching", values="peak_kv_blocks")
    assert (by[True] <= by[False]).all()
    assert by.loc[0, True] == by.loc[0, False]
    assert (by[True][by.index > 0] < by[False][by.index > 0]).all()
    saved = table[table.prefix_caching].set_index("prefix_tokens").kv_saved
    assert saved.is_monotonic_increasing
    fig = load("prefix_sharing").plot(table)
    fig.canvas.draw()
    handles = fig.legends[0].legend_handles  # one entry per look: none two names for the same line
    looks = {(h.get_color(), str(h._unscaled_dash_pattern), h.get_marker()) for h in handles}
    assert len(looks) == len(handles)


def test_prefix_hit_rate(tmp_path):
    table = run_quick("prefix_hit_rate", tmp_path)
    assert {"num_gpu_blocks", "cache_gib", "prefix_cache_hit_rate", "ttft_s_p50"} <= set(table.columns)
    assert table.num_gpu_blocks.is_monotonic_increasing
    hit = table.prefix_cache_hit_rate.to_numpy()
    assert ((hit >= 0) & (hit <= 1)).all()
    assert (np.diff(hit) >= 0).all() and hit[-1] > hit[0]


def test_static_baseline_reserving_max_model_len_holds_more_memory():
    common = load("common")
    from sim import SimConfig, simulate

    workload = common.azure_conv(20)
    peaks = {reserve: simulate(workload, SimConfig(static_batching=True, static_reserve=reserve)).summary()[
        "kv_usage_max"] for reserve in ("max_tokens", "max_model_len")}
    assert peaks["max_model_len"] > peaks["max_tokens"]


def test_kv_compression(tmp_path):
    table = run_quick("kv_compression", tmp_path)
    assert {"kv_cache_dtype", "offered_qps", "kv_capacity_tokens", "output_tokens_per_s", "tpot_s_p50"} <= set(
        table.columns)
    sat = table[np.isinf(table.offered_qps)].set_index("kv_cache_dtype")
    assert sat.loc["int4", "kv_capacity_tokens"] > 3 * sat.loc["fp16", "kv_capacity_tokens"]
    assert sat.loc["int4", "output_tokens_per_s"] >= sat.loc["fp16", "output_tokens_per_s"]


def test_kv_memory_70b(tmp_path):
    """The memory arithmetic is exact on any slice: fp16 is the article's 280 GB by construction, the formats'
    bytes order the rest, LZ4 moves no GPU byte; a swap through a one-core codec is slower than a plain one."""
    table = run_quick("kv_memory_70b", tmp_path)
    mem = table[table.kind == "memory"].set_index("kv_cache_dtype")
    assert mem.loc["fp16", "gpu_total_gb"] == pytest.approx(280.0)
    assert mem.loc["int4", "gpu_total_gb"] < mem.loc["fp8", "gpu_total_gb"] < mem.loc["int8", "gpu_total_gb"] < 280
    assert ((mem.lz4_ratio > 0.5) & (mem.lz4_ratio <= 1.01)).all()
    assert (mem.host_swap_gb_lz4 <= mem.host_swap_gb * 1.01).all()
    swap = table[(table.kind == "swap") & (table.kv_cache_dtype == "fp16")].set_index("swap_case")
    assert swap.loc["swap + lz4, 1 core", "swap_ms_per_block"] > swap.loc["swap", "swap_ms_per_block"] > 0
    assert swap.loc["swap + lz4, 8 cores", "swap_ms_per_block"] < swap.loc["swap + lz4, 1 core", "swap_ms_per_block"]
    serving = table[table.kind == "serving"]
    assert set(serving.kv_cache_dtype) == {"fp16", "int4"} and (serving.output_tokens_per_s > 0).all()
    verdicts = (tmp_path / "verdicts.txt").read_text()
    assert "LZ4 saves 0 GB" in verdicts and "LZ4 on KV bytes pays" in verdicts


def test_priority(tmp_path):
    table = run_quick("priority", tmp_path)
    assert {"offered_qps", "policy", "class", "ttft_s_p90", "slo_attainment", "num_preemptions"} <= set(table.columns)
    assert ((table.slo_attainment >= 0) & (table.slo_attainment <= 1)).all()
    premium = table[table["class"] == "premium"].set_index("policy")
    assert premium.loc["priority + preemption", "slo_attainment"] > premium.loc["fcfs", "slo_attainment"]


def test_batching_knobs(tmp_path):
    timeouts = run_quick("batching_knobs", tmp_path)
    assert {"workload", "batch_timeout_s", "batch_size_mean", "req_per_busy_s", "ttft_s_p50", "e2e_s_p99"} \
        <= set(timeouts.columns)
    for _, d in timeouts.groupby("workload"):  # waiting longer never makes batches emptier
        d = d.sort_values("batch_timeout_s")
        # within 1%: on 200 requests, step times that are not a line in the batch (the calibrated
        # model's tile steps) move which arrivals share a batch by a request or so
        assert d.batch_size_mean.iloc[-1] >= 0.99 * d.batch_size_mean.iloc[0]
    sizes = pd.read_csv(tmp_path / "batching_knobs_max_batch.csv").set_index(["system", "max_batch_size"])
    # two slots queue what thirty-two serve at once
    assert sizes.loc[("paged", 2), "e2e_s_p99"] > sizes.loc[("paged", 32), "e2e_s_p99"]
    assert ((sizes.busy_fraction > 0) & (sizes.busy_fraction <= 1)).all()


def test_health(tmp_path):
    table = run_quick("health", tmp_path)
    assert {"deployment", "load_of_saturation", "kv_usage", "ttft_s_p99", "output_tokens_per_s_per_gpu",
            "failure_rate", "queue_depth", "effective_batch_size", "fragmentation", "healthy"} <= set(table.columns)
    assert table.deployment.nunique() == 3
    for _, d in table.groupby("deployment"):  # more load holds more KV and waits longer
        light, heavy = d.sort_values("load_of_saturation").iloc[[0, -1]].itertuples()
        assert heavy.kv_usage > light.kv_usage and heavy.ttft_s_p99 >= light.ttft_s_p99
        assert heavy.output_tokens_per_s_per_gpu > light.output_tokens_per_s_per_gpu
    assert (table.healthy == (table.kv_ok & table.latency_ok & table.tokens_ok & table.failures_ok)).all()
    fig = load("health").plot(table)
    for ax in fig.axes:  # in greyscale a line's dashes are what tell it apart: no two alike in a panel
        dashes = [str(line._unscaled_dash_pattern) for line in ax.get_lines()]  # get_linestyle() says "--" for all
        assert len(set(dashes)) == len(dashes)


def test_cache_aware_routing(tmp_path, capsys):
    """Every trace x router has a row; the ratio is the hit rate over the yardstick; reading the
    replicas' caches never catches less reuse than blind round robin on any trace. Each run says
    when it starts (the full experiment runs for minutes)."""
    table = run_quick("cache_aware_routing", tmp_path)
    assert capsys.readouterr().err.count(" requests: ") == len(table)
    assert {"trace", "router", "hit_rate", "yardstick", "ratio", "ttft_s_p50", "ttft_s_p99"} <= set(table.columns)
    assert len(table) == 3 * 5 and set(table.router) == {"round_robin", "least_outstanding", "prefix_aware",
                                                           "kv_aware", "kv_aware (events read every 0.25 s)"}
    assert np.allclose(table.ratio, table.hit_rate / table.yardstick)
    by = table.pivot(index="trace", columns="router", values="hit_rate")
    assert (by.kv_aware >= by.round_robin).all()
    assert (table.num_finished == table.num_requests).all()


def test_an_out_folder_that_cannot_be_made_is_a_usage_error(tmp_path, capsys):
    """A file where --out names a folder: one line and exit status 2, not a FileExistsError traceback."""
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit) as e:
        load("common").parse_args("priority", "", ["--out", str(tmp_path / "f")])
    assert e.value.code == 2
    assert f"--out {tmp_path / 'f'}: cannot make this folder (File exists); expected a folder path" in \
        capsys.readouterr().err


def test_chat_past_saturation(tmp_path):
    """Every seed x replica setting x router has a row, on the same workload per seed; the ratio is the hit
    rate over the yardstick; reading the replicas' caches catches more reuse than balancing load alone."""
    exp = load("chat_past_saturation")
    table = run_quick("chat_past_saturation", tmp_path)
    assert len(table) == 2 * 3 * 3 and set(table.setting) == {"fcfs", exp.QUEUE_AWARE, "lpm"}
    assert set(table.router) == {"kv_aware", "kv_aware (events read every 0.25 s)", "least_outstanding"}
    assert (table.groupby("seed").yardstick.nunique() == 1).all()
    assert np.allclose(table.ratio, table.hit_rate / table.yardstick)
    by = table.pivot_table(index=["seed", "setting"], columns="router", values="hit_rate")
    assert (by.kv_aware > by.least_outstanding).all()
    assert (table.num_finished == table.num_requests).all()
    assert (tmp_path / "chat_past_saturation.png").exists()


def test_chat_past_saturation_verdict_names_the_seeds_whose_tail_is_worse():
    """A tail worse than least_outstanding's on one seed of two is reported on that seed, not on every one."""
    exp = load("chat_past_saturation")
    rows = [{"seed": seed, "setting": setting, "router": router, "ratio": 0.9, "ttft_s_p99": p99}
            for setting in exp.SETTINGS for seed in (1, 2)
            for router, p99 in (("kv_aware", 10.0 + (seed == 2 and setting == "fcfs")), (exp.POLLED, 10.0),
                                ("least_outstanding", 10.5))]
    fcfs, _, lpm = exp.verdicts(pd.DataFrame(rows))
    assert fcfs.outcome == "partly holds" and fcfs.headline.endswith("worse than least_outstanding on seed 2")
    assert lpm.outcome == "holds" and lpm.headline.endswith("no worse than least_outstanding on every seed")


def test_chat_past_saturation_series_read_apart_in_greyscale():
    """Its nine series told the routers apart by colour alone (every marker a circle), and its 85% line
    was dotted like the queue-eviction series: each series now has its own line style and marker."""
    import matplotlib.pyplot as plt

    exp = load("chat_past_saturation")
    rows = [{"seed": seed, "setting": setting, "router": router, "ratio": 0.9, "ttft_s_p99": 1.0}
            for setting in exp.SETTINGS for seed in (1, 2) for router in exp.ROUTERS]
    fig = exp.plot(pd.DataFrame(rows))
    lines = fig.axes[0].get_lines()
    looks = {(str(ln.get_linestyle()), ln.get_marker()) for ln in lines}
    assert len(lines) == len(looks) == len(exp.SETTINGS) * len(exp.ROUTERS) + 1  # and the 85% line
    plt.close(fig)

def test_routing_probes(tmp_path, capsys):
    """One row per probe, a probe of each kind (Mooncake on 2 and on 4 A100s, the 8k-token system prompt, the
    bursts, the long conversations), both routers run on each with every request finished; hit rates and
    yardsticks are shares of the prompt tokens, the ratios their quotient; the flag names exactly what kv_aware
    missed; --json holds the CSV's rows. Each run says when it starts (the full script runs for minutes)."""
    exp = load("routing_probes")
    assert exp.main(["--quick", "--out", str(tmp_path), "--json", str(tmp_path / "rows.json")]) == 0
    assert capsys.readouterr().err.count(" requests: ") == 2 * 5
    check_verdicts((tmp_path / "verdicts.txt").read_text())
    rows = pd.DataFrame(json.loads((tmp_path / "rows.json").read_text()))
    table = pd.read_csv(tmp_path / "routing_probes.csv", keep_default_na=False)
    assert list(rows.probe) == list(table.probe) and np.allclose(rows.kv_aware_ratio, table.kv_aware_ratio)
    assert [p.split(" seed")[0].split(" from")[0] for p in rows.probe] == [
        "mooncake x2.5 2xA100", "mooncake x5 4xA100", "agentic 8k prompt 8xH200", "agentic bursts 8xH200",
        "long conversations 8xH200 6000 blocks"]
    assert ((rows.yardstick > 0) & (rows.yardstick < 1)).all()
    for router in exp.ROUTERS:
        hit, p99 = rows[f"{router}_hit_rate"], rows[f"{router}_ttft_s_p99"]
        assert ((hit >= 0) & (hit < 1)).all() and np.allclose(rows[f"{router}_ratio"], hit / rows.yardstick)
        assert ((p99 > 0) & (p99 < 60)).all()
        assert (rows[f"{router}_num_finished"] == rows.num_requests).all()
    assert (rows.kv_aware_hit_rate >= rows.least_outstanding_hit_rate).all()
    under = rows.kv_aware_ratio < exp.GOAL
    above = rows.kv_aware_ttft_s_p99 > rows.least_outstanding_ttft_s_p99
    assert (rows.flag.str.contains("under 85%") == under).all() and (rows.flag.str.contains("p99 above") == above).all()
    assert ((rows.flag == "") == ~(under | above)).all()


def test_routing_probes_refuses_a_json_path_before_running(tmp_path, capsys, unwritable):
    """--json naming a folder, or a file root cannot write either (os.access let it through): exit
    status 2 before any probe runs (they take minutes), nothing written."""
    for bad, why in ((tmp_path, "is a folder"), (unwritable / "rows.json", "cannot write it")):
        with pytest.raises(SystemExit) as e:
            load("routing_probes").main(["--quick", "--out", str(tmp_path / "out"), "--json", str(bad)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"--json {bad}: {why}" in err and " requests: " not in err
        assert not list((tmp_path / "out").iterdir())
