"""The discrete-event simulator: real traces through the shared `paged` core, a cost model
in place of the GPU.

    from sim import simulate, SimConfig, load_workload
    result = simulate(load_workload("traces/azure_llm_2023_conv.csv"), SimConfig(model="llama-2-7b"))
    result.summary(); result.requests; result.timeseries; result.goodput(1.0, 0.1)

Profile fitting loads when first named (`sim.fit_profile`, `sim.ProfileFit`): a `python -m sim
run` never uses it.
"""
import importlib

from paged.metrics_summary import format_summary
from paged.workloads.traces import TraceError, read_trace
from paged.workloads.workload import (
    Workload,
    lengths_workload,
    load_workload,
    sample_lengths,
    shared_prefix_workload,
    synthetic_arrivals,
)

from .cost_model import CostModel, RooflineParams, roofline_cost_model
from .gpu_cost import gpu_cost_model, step_breakdown
from .hardware import HARDWARE, HardwareSpec, get_hardware
from .memory import KVPlan, plan_kv_cache
from .models import KV_DTYPES, MODELS, ModelSpec, get_model
from .report import SimResult
from .runner import simulate
from .sim_config import ROUTERS, SimConfig
from .sweep import grid, sweep


def __getattr__(name: str):
    if name not in ("ProfileFit", "fit_profile"):
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    return getattr(importlib.import_module(".profiled", __name__), name)

__all__ = [
    "ROUTERS", "SimConfig", "CostModel", "RooflineParams", "roofline_cost_model", "HARDWARE", "HardwareSpec",
    "get_hardware", "KVPlan", "plan_kv_cache", "KV_DTYPES", "MODELS", "ModelSpec", "get_model", "ProfileFit",
    "fit_profile", "SimResult", "format_summary", "simulate", "grid", "sweep", "TraceError", "read_trace", "Workload",
    "lengths_workload", "load_workload", "sample_lengths", "shared_prefix_workload", "synthetic_arrivals",
    "gpu_cost_model", "step_breakdown",
]
