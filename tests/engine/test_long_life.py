"""A long-lived engine keeps no state that grows with the number of requests it has served.

A server runs for weeks: any container that gains an entry per request (a heap of stale keys, a
map that is never cleaned) is a leak. Rather than naming the containers to check, the test walks
every object reachable from the engine and compares the size of each container, by path, after
300 and after 600 requests of the same mixed workload (early stops, parallel sampling, stop
strings, aborts at every stage).
"""
import random
from collections import defaultdict, deque

import torch

from paged.engine import LLM, SamplingParams

from .conftest import TINY
from .recorder import assert_all_blocks_free


def container_sizes(root) -> dict[str, int]:
    """Total length of the containers reachable from `root`, by attribute path (elements of a
    container share the path `container[]`). Tensors and torch modules are data, not state."""
    sizes: dict[str, int] = defaultdict(int)
    seen: set[int] = set()
    todo = deque([("engine", root)])
    while todo:
        path, obj = todo.popleft()
        if id(obj) in seen or isinstance(obj, (torch.Tensor, torch.nn.Module, type, str, bytes, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            sizes[path] += len(obj)
            todo.extend((f"{path}[]", x) for kv in obj.items() for x in kv)
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            sizes[path] += len(obj)
            todo.extend((f"{path}[]", x) for x in obj)
        else:
            names = list(getattr(obj, "__dict__", ()))
            for cls in type(obj).__mro__:
                names += getattr(cls, "__slots__", ())
            todo.extend((f"{path}.{name}", getattr(obj, name)) for name in names if hasattr(obj, name))
    return dict(sizes)


def serve(engine, rng: random.Random, num_requests: int) -> None:
    """Submit `num_requests` mixed requests a few at a time, aborting some, until all are done."""
    live: list[str] = []
    for _ in range(num_requests):
        params = SamplingParams(temperature=rng.choice([0.0, 1.0]), max_tokens=rng.randrange(1, 30),
                                n=rng.choice([1, 1, 2]), seed=rng.randrange(1000),
                                stop_token_ids=rng.sample(range(256), 40),  # early stops in the decode batch
                                stop=rng.choice([[], ["a"], ["xy", "z"]]))
        prompt = [rng.randrange(256) for _ in range(rng.randrange(1, 40))]
        live.append(engine.add_request(prompt, params))
        if rng.random() < 0.1:
            engine.abort_request(live.pop(rng.randrange(len(live))))  # often still waiting
        for out in engine.step():
            if out.finished:
                live.remove(out.request_id)
    while engine.has_unfinished_requests():
        engine.step()


def test_no_state_grows_with_requests_served(tiny_llama):
    llm = LLM(str(tiny_llama[0]), **{**TINY, "num_gpu_blocks": 48, "max_num_seqs": 8})
    engine = llm.llm_engine
    rng = random.Random(0)
    sizes = []
    for _ in range(2):
        serve(engine, rng, 300)
        assert_all_blocks_free(llm)
        # Which free blocks still hold a prefix-cache entry depends on the last prompts served;
        # the pool bounds that map (one hash per block). Forget it so the comparison is exact.
        engine.scheduler.kv.reset_prefix_cache()
        sizes.append(container_sizes(engine))
    after_300, after_600 = sizes
    grown = {path: (after_300.get(path, 0), n) for path, n in after_600.items() if n != after_300.get(path, 0)}
    assert not grown, f"containers that grew between 300 and 600 requests: {grown}"
    assert engine.scheduler.num_finished > 500 and engine.scheduler.num_aborted > 30
    assert "engine.scheduler.decode._finish_clocks" in after_600  # the walk reaches the scheduler's insides
