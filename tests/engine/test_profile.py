"""The profiler measures the decode batches it is asked for, up to the end of max_model_len, and always ends.

Before: the set-up prompts of a decode batch prefilled over several steps (the grid's token budget), the
requests prefilled first decoded meanwhile, and at a context of max_model_len - 1 one of them finished
there: the batch was never reached and the set-up loop spun forever.
"""
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged.engine import EngineConfig, LLMEngine
from paged.engine.profile import ProfileGrid, _Profiler, profile

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig(model=str(tiny_llama[0]), max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=4 << 20,
                                  max_num_batched_tokens=64, threads=1))


def profiled(engine, grid: ProfileGrid, timeout_s: float = 120.0) -> tuple[dict, list[str]]:
    """The profile and its skip notes, or a failure (not a hung test) if it does not end in time."""
    result, notes, errors = {}, [], []

    class Log:
        def write(self, text):
            notes.extend(line for line in text.splitlines() if line.startswith("profile: skipped"))

    def work():
        try:
            result.update(profile(engine, grid, log=Log()))
        except Exception as e:  # raised again in the test's thread
            errors.append(e)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(timeout_s)
    assert not worker.is_alive(), f"the profiler did not end in {timeout_s} s on {grid}"
    if errors:
        raise errors[0]
    return result, notes


def test_decode_at_max_model_len_minus_one_ends_and_measures_exact_contexts(engine):
    last = MAX_MODEL_LEN - 1  # the longest context a decode can attend to (it writes token max_model_len)
    grid = ProfileGrid(prefill_chunks=(16,), prefill_contexts=(0,), decode_batches=(1, 2, 3), decode_contexts=(last,),
                       mixed_batches=(2,), mixed_chunks=(16,), mixed_context=last, repeats=1)
    assert 3 * last > grid.max_num_batched_tokens  # the set-up prompts do not fit in one step of the grid's budget
    prof, notes = profiled(engine, grid)
    decode = [s for s in prof["samples"] if s["num_prefill_tokens"] == 0]
    expected = [(b, sum(c)) for b in grid.decode_batches for c in grid.batch_contexts(b, last)]
    assert [(s["num_decode_tokens"], s["decode_context_sum"]) for s in decode] == expected
    # The mixed step decodes one token later than the set-up: at max_model_len nothing is left to decode.
    assert not [s for s in prof["samples"] if s["num_prefill_tokens"] and s["num_decode_tokens"]]
    assert sum("beside 2 decodes" in n for n in notes) == 2, notes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.integers(1, 6), min_size=1, max_size=2, unique=True),
       contexts=st.lists(st.integers(2, MAX_MODEL_LEN - 1), min_size=1, max_size=2, unique=True),
       spreads=st.lists(st.sampled_from((0.0, 0.5, 1.0)), min_size=1, max_size=2, unique=True))
def test_every_decode_batch_is_measured_at_its_contexts(engine, batches, contexts, spreads):
    grid = ProfileGrid(prefill_chunks=(16,), prefill_contexts=(0,), decode_batches=tuple(batches),
                       decode_contexts=tuple(contexts), mixed_batches=(1,), mixed_chunks=(8,), mixed_context=2,
                       repeats=1, decode_spreads=tuple(spreads))
    prof, notes = profiled(engine, grid)
    decode = [(s["num_decode_tokens"], s["decode_context_sum"]) for s in prof["samples"]
              if s["num_prefill_tokens"] == 0]
    assert decode == [(b, sum(c)) for b in batches for longest in contexts for c in grid.batch_contexts(b, longest)]
    assert not notes


def test_set_up_batches_read_scattered_blocks_the_same_for_the_same_seed(engine):
    """Each timed batch's block tables are scattered over the cache, as in an engine that has served for a
    while (a fresh pool would give each request consecutive blocks), and a profile sets them up alike every time."""
    grid = ProfileGrid(prefill_chunks=(16,), prefill_contexts=(0,), decode_batches=(1,), decode_contexts=(8,),
                       mixed_batches=(1,), mixed_chunks=(16,), mixed_context=8, repeats=1)

    def tables():
        scheduler, out = _Profiler(engine, grid).decoders([MAX_MODEL_LEN - 1, 40, 20])
        return [scheduler.kv.block_table(r).block_ids for r in out.decode_requests]

    first = tables()
    assert first == tables()
    ids = [b for t in first for b in t]
    assert len(set(ids)) == len(ids) and ids != list(range(min(ids), min(ids) + len(ids)))


def test_every_kv_slot_is_written_before_anything_is_timed(engine):
    """The timed steps' set-up is never run, so they read what the blocks hold: the profile first writes every
    slot of every block by a real prefill (`fill_cache`; a zeroed cache made steps 5-7% faster than serving ones)."""
    cache = engine.cache.device_cache  # [layers, 2, blocks, block_size, kv_heads, head_dim]
    cache.zero_()
    grid = ProfileGrid(prefill_chunks=(16,), prefill_contexts=(0,), decode_batches=(1,), decode_contexts=(8,),
                       mixed_batches=(1,), mixed_chunks=(16,), mixed_context=8, repeats=1)
    profiled(engine, grid)
    written = cache.ne(0).flatten(4).any(-1)  # [layers, 2, blocks, block_size]
    assert cache.shape[2] > 2 * grid.max_num_batched_tokens // cache.shape[3]  # the fill takes several steps
    assert written.all(), f"{int((~written).sum())} of {written.numel()} slots never written"


def test_it_says_each_long_phase_as_it_starts(engine):
    """`python -m paged.engine profile` runs for minutes: it printed nothing before its last line."""
    import io

    log = io.StringIO()
    profile(engine, ProfileGrid(prefill_chunks=(16,), prefill_contexts=(0,), decode_batches=(1,), decode_contexts=(8,),
                                mixed_batches=(1,), mixed_chunks=(16,), repeats=1), log=log)
    lines = log.getvalue().splitlines()
    assert lines[0] == f"profile: prefilling all {engine.scheduler.cache_config.num_gpu_blocks:,} KV blocks ..."
    assert lines[1] == "profile: timing 2 steps, 2 rounds (one warm-up) ..."
