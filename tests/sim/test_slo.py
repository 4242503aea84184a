"""Stopping a run early on an SLO miss is exact: the threshold puts numpy's p99 above the
target whatever the other values, and a run that is not stopped is the run without the watch,
bit for bit."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim import SimConfig, load_workload, simulate
from sim.slo import SLO, violations_to_fail


@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=400), st.floats(0, 10))
def test_enough_values_above_put_p99_above(values, target):
    v = np.array(values)
    if int((v > target).sum()) >= violations_to_fail(len(v)):
        assert np.percentile(v, 99) > target


def test_stopped_runs_fail_and_unstopped_runs_are_unchanged(azure_conv):
    w = load_workload(azure_conv, num_requests=300, max_model_len=4096)
    slo = SLO(ttft_p99_s=0.5, tpot_p99_s=0.1)
    config = SimConfig(max_num_seqs=32)
    outcomes = []
    for qps in (0.5, 2.0, 20.0, 200.0):
        plain = simulate(w.at_rate(qps), config).summary()
        watched = simulate(w.at_rate(qps), config, stop_on_miss=slo).summary()
        outcomes.append(slo.met_by(plain))
        assert slo.met_by(watched) == outcomes[-1]
        if outcomes[-1]:
            for k in ("wall_time_s", "sim_requests_per_wall_s"):
                plain.pop(k), watched.pop(k)
            assert repr(plain) == repr(watched)
    assert outcomes[0] and not outcomes[-1]  # both kinds of run were checked
    stopped = simulate(w.at_rate(200.0), config, stop_on_miss=slo).summary()
    assert stopped["num_finished"] < 300  # it did stop early
