"""Sweeps: grids of configs, one summary row each, in order."""
import pytest

from sim import SimConfig, grid, load_workload, sweep


def test_grid_and_sweep(azure_conv):
    configs = grid(SimConfig(max_num_seqs=64), replicas=[1, 2], router=["round_robin", "least_kv"])
    assert len(configs) == 4 and {c.max_num_seqs for c in configs} == {64}
    w = load_workload(azure_conv, num_requests=100, max_model_len=4096)
    df = sweep(w, configs, max_workers=2)
    assert list(df.replicas) == [1, 1, 2, 2] and list(df.router) == ["round_robin", "least_kv"] * 2
    assert "ttft_s_p99" in df.columns and (df.num_finished == 100).all()
    serial = sweep(w, configs, max_workers=1)
    assert serial.drop(columns=["wall_time_s", "sim_requests_per_wall_s"]).equals(
        df.drop(columns=["wall_time_s", "sim_requests_per_wall_s"]))
    with pytest.raises(ValueError, match="unknown SimConfig"):
        grid(replica=[1])
    with pytest.raises(ValueError, match="backend"):
        sweep(w, configs, backend="dask")


def test_ray_backend_explains_when_missing(azure_conv):
    try:
        import ray  # noqa: F401
        pytest.skip("ray is installed")
    except ImportError:
        pass
    w = load_workload(azure_conv, num_requests=5)
    with pytest.raises(RuntimeError, match="pip install"):
        sweep(w, [SimConfig()], backend="ray")
