"""StepLog keeps each step's shape and forward times without changing what the engine computes, and
pages by number: a reader that asks for the steps since its mark gets exactly the new ones."""
import pytest

from paged.engine import EngineConfig, LLMEngine, SamplingParams
from paged.engine.profile import FEATURES
from paged.engine.step_log import StepLog

PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10], list(range(11, 30))]


@pytest.fixture
def engine(tiny_llama):
    return LLMEngine(EngineConfig(model=str(tiny_llama[0]), max_model_len=64, kv_cache_memory_bytes=4 << 20,
                                  max_num_batched_tokens=16, threads=1, enable_prefix_caching=False))


def run(engine, prompts=PROMPTS) -> tuple[dict[str, list[int]], list[dict]]:
    """Every request to the end: outputs by id, and each step's SchedulerOutput features as the scheduler made them."""
    schedule = engine.scheduler.schedule
    shapes = []

    def recording(now):
        out = schedule(now)
        if not out.is_empty:
            shapes.append({k: getattr(out, k) for k in FEATURES})
        return out

    engine.scheduler.schedule = recording
    for i, p in enumerate(prompts):
        engine.add_request(p, PARAMS, request_id=str(i))
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    del engine.scheduler.schedule
    return done, shapes


def test_rows_are_the_steps_shapes_and_outputs_are_unchanged(engine, tiny_llama):
    plain, _ = run(engine)
    log = StepLog.install(engine)
    assert StepLog.install(engine) is log  # once
    logged, shapes = run(engine)
    assert logged == plain
    assert [{k: r[k] for k in FEATURES} for r in log.rows] == shapes
    assert sum(r["num_prefill_tokens"] for r in log.rows) == sum(map(len, PROMPTS))  # chunked (budget 16), no hits
    assert [r["seq"] for r in log.rows] == list(range(len(shapes))) and log.next_seq == len(shapes)
    for a, b in zip(log.rows, list(log.rows)[1:]):
        assert a["start_s"] <= a["end_s"] <= b["start_s"] and a["forward_s"] == a["end_s"] - a["start_s"]
    assert all(r["decode_max_context"] == 0 for r in log.rows if not r["num_decode_tokens"])
    assert all(r["decode_max_context"] > 0 for r in log.rows if r["num_decode_tokens"])


def test_since_pages_and_capacity_keeps_the_last(engine):
    log = StepLog.install(engine, capacity=3)
    assert log.since(0) == {"next": 0, "steps": []}  # nothing yet: the mark is 0, not the asked number
    assert log.since(1 << 40)["next"] == 0
    _, shapes = run(engine)
    n = len(shapes)
    assert n > 3 and log.next_seq == n
    assert [r["seq"] for r in log.since(0)["steps"]] == [n - 3, n - 2, n - 1]
    assert [r["seq"] for r in log.since(n - 1)["steps"]] == [n - 1]
    assert log.since(n) == {"next": n, "steps": []}


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_capacity_is_named(engine, bad):
    with pytest.raises(ValueError, match=f"capacity={bad!r}"):
        StepLog(engine.runner, bad)


def test_bad_since_is_named(engine):
    with pytest.raises(ValueError, match="since=-1"):
        StepLog.install(engine).since(-1)
