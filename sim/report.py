"""Results of a run: per-request records, summaries with percentiles, goodput, time series.

`SimResult.requests` and `.timeseries` are pandas DataFrames built on first access from the
numpy columns the run wrote; `summary()` reads the columns directly, so a million-request
run can be summarised without building a DataFrame.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from paged.core.request import RequestStatus
from paged.metrics_summary import goodput, stats_of, tpot
from paged.workloads.workload import Workload

from .clock import TICKS_PER_S
from .itl_histogram import bin_value
from .recorder import RequestLog

LATENCIES = ("queueing_delay_s", "ttft_s", "tpot_s", "e2e_s")
FINISHED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)


def histogram_stats(hist: dict[int, int], total_ticks_weighted: int) -> dict[str, float]:
    """mean (exact) and percentiles (to the 1% bin) of a log histogram {bin: weight}."""
    weight = sum(hist.values())
    if not weight:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    bins = sorted(hist)
    cum = np.cumsum([hist[b] for b in bins])
    out = {"mean": total_ticks_weighted / weight / TICKS_PER_S}
    for q in (50, 90, 99):
        i = int(np.searchsorted(cum, q / 100 * weight))
        out[f"p{q}"] = bin_value(bins[min(i, len(bins) - 1)]) / TICKS_PER_S
    return out


@dataclass
class SimResult:
    config: object  # the SimConfig of the run
    workload: Workload
    log: RequestLog
    timeseries_columns: dict[str, np.ndarray]  # with a "replica" column
    counters: dict  # figures summed (or maxed) over replicas, see `sim.runner`
    itl_hist: dict[int, int]
    itl_weighted_ticks: int
    simulated_time_s: float
    wall_time_s: float
    num_gpu_blocks: int
    schedulers: list = field(default_factory=list, repr=False)  # each replica's paged scheduler, at the end
    _requests: object = field(default=None, repr=False)

    # -- per-request ------------------------------------------------------------------------
    def latency_columns(self) -> dict[str, np.ndarray]:
        lg = self.log
        arrival = lg.arrival_s
        return {"queueing_delay_s": lg.first_scheduled_s - arrival, "ttft_s": lg.first_token_s - arrival,
                "tpot_s": tpot(lg.first_token_s, lg.last_token_s, lg.num_generated),
                "e2e_s": lg.finished_s - arrival}

    @property
    def requests(self):
        """One row per request of the workload (pandas DataFrame).

        Inter-token latencies: a request's mean ITL is its `tpot_s` (vLLM's definition, (last
        token - first token) / (tokens - 1), as a streaming client sees it; the last token is the
        finish, except in a static batch, which ends after its longest member), its longest is
        `max_itl_s` (a preemption stall shows there).
        Every ITL of every request, in order, is the `itl_s` column (an array per request) when
        the run was asked for it (`SimConfig.record_itl`): off by default, as at ~200 tokens a
        request a million-request trace would hold 200M floats, and recording visits every
        running request at every step. Their distribution over all tokens is the summary's
        `itl_s` either way (a log-binned histogram, filled exactly under the fast path)."""
        if self._requests is None:
            import pandas as pd

            lg, w = self.log, self.workload
            names = {int(s): s.name.lower() for s in RequestStatus}
            names[-1] = "unfinished"
            self._requests = pd.DataFrame({
                "request_id": np.arange(len(w)), "replica": lg.replica, "arrival_s": lg.arrival_s,
                "num_prompt_tokens": w.num_prompt_tokens, "num_output_tokens": w.num_output_tokens,
                "num_generated": lg.num_generated, "prefix_hit_tokens": lg.prefix_hit_tokens,
                "first_scheduled_s": lg.first_scheduled_s, "first_token_s": lg.first_token_s,
                "last_token_s": lg.last_token_s, "finished_s": lg.finished_s, **self.latency_columns(),
                "max_itl_s": lg.max_itl_s,
                "num_preemptions": lg.num_preemptions,
                "status": pd.Categorical([names[int(s)] for s in lg.status]),
            })
            if lg.itl_s is not None:
                self._requests["itl_s"] = lg.itl_s
        return self._requests

    @property
    def timeseries(self):
        """KV usage, fragmentation, running / waiting / swapped requests and batch tokens of each
        replica, sampled on a fixed grid of simulated time (pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame(self.timeseries_columns)

    # -- summaries ----------------------------------------------------------------------------
    def finished_mask(self) -> np.ndarray:
        s = self.log.status
        return (s == FINISHED[0]) | (s == FINISHED[1])

    def summary(self) -> dict:
        done = self.finished_mask()
        lat = self.latency_columns()
        c = self.counters
        T = self.simulated_time_s
        ts = self.timeseries_columns
        out = {
            "num_requests": len(self.workload),
            "num_finished": int(done.sum()),
            "num_rejected": int((self.log.status == RequestStatus.REJECTED).sum()),
            "num_capped": self.workload.num_capped,
            "simulated_time_s": T,
            "wall_time_s": self.wall_time_s,
            "sim_requests_per_wall_s": len(self.workload) / self.wall_time_s if self.wall_time_s else math.nan,
            "throughput_req_s": done.sum() / T if T else math.nan,
            "input_tokens_per_s": float(self.workload.num_prompt_tokens[done].sum() / T) if T else math.nan,
            "output_tokens_per_s": float(self.log.num_generated[done].sum() / T) if T else math.nan,
        }
        for name in LATENCIES:
            out[name] = stats_of(lat[name][done])
        out["itl_s"] = histogram_stats(self.itl_hist, self.itl_weighted_ticks)
        queries = c["prefix_cache_queries"]
        out.update({
            "prefix_cache_hit_rate": c["prefix_cache_hits"] / queries if queries else 0.0,
            "kv_usage_mean": float(ts["kv_usage"].mean()) if len(ts["kv_usage"]) else 0.0,
            "kv_usage_max": c["peak_kv_usage"],
            "kv_tokens_mean": float(ts["kv_tokens"].mean()) if len(ts["kv_tokens"]) else 0.0,
            "fragmentation_mean": float(ts["fragmentation"].mean()) if len(ts["fragmentation"]) else 0.0,
            "num_preemptions": c["num_preemptions"],
            "effective_batch_size_mean": c["num_scheduled_seqs"] / c["num_steps"] if c["num_steps"] else 0.0,
            # the fraction of time the replicas ran steps: 1 is saturation, whatever the batch
            "busy_fraction": c["busy_s"] / (T * self.config.replicas) if T else 0.0,
            "num_steps": c["num_steps"],
            "fast_path_step_fraction": c["num_window_steps"] / c["num_steps"] if c["num_steps"] else 0.0,
            "num_gpu_blocks": self.num_gpu_blocks,
        })
        return out

    def goodput(self, ttft_slo_s: float, tpot_slo_s: float) -> dict[str, float]:
        """DistServe's goodput over the run (see `paged.metrics_summary.goodput`)."""
        lat = self.latency_columns()
        return goodput(self.finished_mask(), lat["ttft_s"], lat["tpot_s"], ttft_slo_s, tpot_slo_s,
                       self.simulated_time_s)

    def plot(self, path=None):
        """Latency CDFs and KV usage over time; saved to `path` when given. Returns the figure."""
        from .plots import summary_figure

        return summary_figure(self, path)
