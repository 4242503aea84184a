"""Random small workloads and deployments for the simulator's property tests."""
import hypothesis.strategies as st
import numpy as np

from sim import CostModel, SimConfig, Workload

# Two pieces that cross inside typical windows, so the envelope has two segments.
TWO_PIECES = CostModel([(0.004, 2e-5, 1e-9, 2e-5, 1e-7, 0.0), (0.001, 1e-5, 0.0, 1e-5, 4e-7, 1e-4)], 1e-4)
# Every step 10 ms: arrivals on the workloads' grids land exactly on step boundaries (ties).
UNIT_STEPS = CostModel([(0.01, 0.0, 0.0, 0.0, 0.0, 0.0)])


@st.composite
def workloads(draw) -> Workload:
    n = draw(st.integers(1, 24))
    # arrival times on a coarse grid: many ties, and some at exactly a step boundary
    grid = draw(st.sampled_from([0.001, 0.005, 0.01, 0.1]))
    arrival = np.sort(np.array(draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)), dtype=np.float64)) * grid
    arrival -= arrival[0]
    prompt = np.array(draw(st.lists(st.integers(1, 270), min_size=n, max_size=n)), dtype=np.int64)
    output = np.array(draw(st.lists(st.integers(1, 80), min_size=n, max_size=n)), dtype=np.int64)
    kw = {}
    if draw(st.booleans()):  # system prompts shared by groups, as in the shared-prefix workload
        groups = draw(st.integers(1, 3))
        id_block = draw(st.sampled_from([4, 16, 32]))
        ids_per_group = draw(st.integers(1, 6))
        kw = dict(prefix_index=np.array(draw(st.lists(st.integers(-1, groups - 1), min_size=n, max_size=n))),
                  prefix_values=np.arange(groups * ids_per_group, dtype=np.int64),
                  prefix_offsets=np.arange(groups + 1, dtype=np.int64) * ids_per_group,
                  hash_id_block_size=id_block)
    if draw(st.booleans()):
        kw["priority"] = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
        kw["business_value"] = np.array(draw(st.lists(st.floats(0, 5), min_size=n, max_size=n)))
        kw["deadline_s"] = arrival + np.array(draw(st.lists(st.floats(0.01, 2), min_size=n, max_size=n)))
    return Workload(arrival, prompt, output, name="random", **kw)


@st.composite
def sim_configs(draw) -> SimConfig:
    bs = draw(st.sampled_from([1, 2, 4, 8, 16]))
    max_num_seqs = draw(st.integers(1, 8))
    chunked = draw(st.booleans())
    max_model_len = 256
    budget = draw(st.integers(max(max_num_seqs, bs), 128))
    if not chunked:
        budget = max(budget, max_model_len)
    replicas = draw(st.integers(1, 3))
    static = draw(st.integers(0, 5)) == 0
    policy = draw(st.sampled_from(["fcfs", "priority", "sjf", "edf", "lpm"]))
    eviction = "lru" if policy == "lpm" else draw(st.sampled_from(["lru", "queue"]))  # queue: a static order
    return SimConfig(
        replicas=replicas,
        router=draw(st.sampled_from(["round_robin", "least_outstanding", "least_kv", "prefix_aware", "kv_aware"])),
        kv_events_interval_s=draw(st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.05])),
        block_size=bs,
        # from "one request barely fits" to roomy: forces preemption
        num_gpu_blocks=draw(st.integers(-(-max_model_len // bs), 6 * max_model_len // bs)),
        swap_space_gib=draw(st.sampled_from([0.0, 0.02, 4.0])),
        enable_prefix_caching=draw(st.booleans()),
        watermark=draw(st.sampled_from([0.0, 0.01, 0.1])),
        eviction=eviction,
        queue_reserve=draw(st.sampled_from([0.0, 0.1, 0.3])) if eviction == "queue" else 0.0,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8, 20])),
        policy=policy,
        preemption=draw(st.sampled_from(["recompute", "swap"])),
        static_batching=static,
        static_batch_size=draw(st.integers(1, min(4, max_num_seqs))),
        batch_timeout_s=draw(st.sampled_from([0.0, 0.01, 0.05])),
        cost_model=draw(st.sampled_from(["calibrated", "roofline", TWO_PIECES, UNIT_STEPS])),
        timeseries_interval_s=draw(st.sampled_from([None, None, 0.01, 0.1])),
        record_itl=draw(st.booleans()),
    )
