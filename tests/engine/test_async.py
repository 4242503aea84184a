"""AsyncLLM streams tokens as they come, takes requests while running, and isolates a bad request."""
import asyncio

import pytest

from paged.engine import AsyncLLM, SamplingParams

from .conftest import TINY
from .recorder import assert_all_blocks_free
from .tiny_models import hf_greedy

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture
def engine(tiny_llama):
    return AsyncLLM(str(tiny_llama[0]), **TINY)


async def _collect(engine, prompt, params=PARAMS, **kwargs):
    return [out async for out in engine.generate(prompt, params, **kwargs)]


def test_streams_growing_outputs_and_accepts_requests_while_running(engine, tiny_llama):
    async def main():
        first = engine.generate([1, 2, 3], PARAMS)
        outs = [await anext(first)]  # the engine is running now
        second = asyncio.create_task(_collect(engine, [4, 5, 6, 7]))
        outs += [out async for out in first]
        return outs, await second

    first, second = asyncio.run(main())
    lengths = [len(o.token_ids) for o in first]
    assert lengths == sorted(lengths) and lengths[-1] == 12 and len(first) > 1
    assert [o.finished for o in first] == [False] * (len(first) - 1) + [True]
    ref = hf_greedy(tiny_llama[1], [1, 2, 3], 12, eos=None)
    assert first[-1].token_ids == ref and second[-1].token_ids == hf_greedy(tiny_llama[1], [4, 5, 6, 7], 12, eos=None)
    assert first[-1].text == engine.engine.tokenizer.decode(ref)
    assert all(o.token_ids == ref[:len(o.token_ids)] for o in first)
    m = first[-1].metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time


def test_bad_request_fails_only_its_own_stream(engine):
    async def main():
        good = asyncio.create_task(_collect(engine, [1, 2, 3]))
        bad = asyncio.create_task(_collect(engine, []))
        worse = asyncio.create_task(_collect(engine, [1] * 600))
        return await asyncio.gather(good, bad, worse, return_exceptions=True)

    good, bad, worse = asyncio.run(main())
    assert good[-1].finished and len(good[-1].token_ids) == 12
    assert isinstance(bad, ValueError) and "empty" in str(bad)
    assert isinstance(worse, ValueError) and "max_model_len" in str(worse)


def test_params_broken_after_construction_fail_only_their_stream(engine):
    """Checked again on submission: a field changed to a bad value never reaches a step."""
    broken = SamplingParams(max_tokens=4)
    broken.seed = 2**64

    async def main():
        good = asyncio.create_task(_collect(engine, [1, 2, 3]))
        bad = asyncio.create_task(_collect(engine, [4, 5], broken))
        return await asyncio.gather(good, bad, return_exceptions=True)

    good, bad = asyncio.run(main())
    assert good[-1].finished and len(good[-1].token_ids) == 12
    assert isinstance(bad, ValueError) and "seed" in str(bad)
    assert_all_blocks_free(engine.engine)


def test_abort_ends_the_stream_and_frees_blocks(engine):
    async def main():
        stream = engine.generate([1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True), request_id="r")
        await anext(stream)
        await engine.abort("r")
        rest = [out async for out in stream]
        # A consumer that walks away frees its request too.
        other = engine.generate([4, 5], SamplingParams(max_tokens=400, ignore_eos=True))
        await anext(other)
        await other.aclose()
        await _collect(engine, [9])  # one more step applies the pending abort
        await engine.shutdown()
        return rest

    rest = asyncio.run(main())
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert len(rest[-1].token_ids) < 400
    assert_all_blocks_free(engine.engine)


def test_engine_serves_successive_event_loops(engine):
    for prompt in ([1, 2], [3, 4]):
        outs = asyncio.run(_collect(engine, prompt, SamplingParams(temperature=0.0, max_tokens=3)))
        assert outs[-1].finished and len(outs[-1].token_ids) == 3


def test_unnamed_streams_skip_the_ids_users_took(engine):
    async def main():
        mine = engine.generate([1, 2], PARAMS, request_id="async-0")
        await anext(mine)
        auto = await _collect(engine, [3, 4])  # would be "async-0" too, and refused, if names were not skipped
        return auto, [o async for o in mine]

    auto, mine = asyncio.run(main())
    assert auto[-1].request_id != "async-0" and auto[-1].finished and mine[-1].finished
