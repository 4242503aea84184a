"""Ray runs searches and sweeps for real on a local cluster, with the same rows, in the same
order, as the process pool."""
import tempfile

import pytest

from sim import SimConfig, load_workload, sweep
from sim.search import search
from sim.slo import SLO

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    with tempfile.TemporaryDirectory(prefix="ray", dir="/tmp") as tmp:
        ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tmp, ignore_reinit_error=True)
        yield
        ray.shutdown()


@pytest.fixture(scope="module")
def workload():
    from paged.workloads.traces import AZURE_CONV

    return load_workload(AZURE_CONV, num_requests=100, max_model_len=4096)


def test_search_on_ray_equals_processes(local_ray, workload):
    configs = [SimConfig(replicas=2, max_num_seqs=32), SimConfig(max_num_seqs=32),
               SimConfig(model="llama-2-70b", hardware="a100-80gb")]
    slo = SLO(1.0, 0.1)
    on_ray = search(workload, configs, slo, rtol=0.1, backend="ray")
    assert on_ray.equals(search(workload, configs, slo, rtol=0.1, workers=2))
    assert list(on_ray.replicas) == [2, 1, 1]


def test_sweep_on_ray_equals_processes(local_ray, workload):
    configs = [SimConfig(max_num_seqs=s) for s in (8, 64)]
    timing = ["wall_time_s", "sim_requests_per_wall_s"]
    on_ray = sweep(workload, configs, backend="ray").drop(columns=timing)
    assert on_ray.equals(sweep(workload, configs, max_workers=2).drop(columns=timing))
    assert list(on_ray.max_num_seqs) == [8, 64]
