"""`paged router --policy kv_aware` over two real `paged serve` replicas: the router routes by
what each replica's prefix cache holds, as the replicas' KV events report it, not by what the
router itself sent where.

Where a request ran is read back from the replicas' own caches (`GET /kv/blocks`): a prompt that
ends in blocks no other prompt has leaves their hashes on the replica that ran it, and only there.
Each replica's pool is small (48 blocks of 16 tokens), so that later prompts evict earlier ones.
"""
from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import pytest

from paged.serve.prefix_ids import token_block_hashes
from paged.serve.server_process import launched_server

from .conftest import Processes, engine_flags, metric, start_router, wait_router, wait_until

BLOCK = 16


def prompt(seed: int, n: int) -> list[int]:
    """n token ids (the tiny model's bytes) that differ from every other seed's from the first block on."""
    return [(seed * 37 + 11 * i) % 251 for i in range(n)]


def hashes(ids: list[int]) -> list[str]:
    return [h.hex() for h in token_block_hashes({"prompt": ids}, BLOCK)]


@pytest.fixture(scope="module")
def kv_cluster(tiny_chat_model, tmp_path_factory):
    """Two replicas (a, b) and a kv_aware router before them that probes health once a minute
    (a replica stopped by a test stays in service) and reads KV events every 0.2 s."""
    logs = tmp_path_factory.mktemp("kv_aware")
    procs = Processes(logs)
    with ExitStack() as stack:
        stack.callback(procs.stop_all)
        a, b = (stack.enter_context(launched_server(tiny_chat_model, [*engine_flags(num_gpu_blocks=48), "--log-level",
                                                                       "warning"], logs / f"{name}.log"))
                for name in "ab")
        url, proc = start_router(procs, [a.url, b.url], "kv_aware", "--block-size", str(BLOCK),
                                 "--health-interval-s", "60", "--kv-events-interval-s", "0.2")
        wait_router(procs, url, proc, [a.url, b.url])
        yield {"a": a, "b": b, "router": url, "model": str(tiny_chat_model)}


def complete(url: str, model: str, ids: list[int], timeout_s: float = 60) -> None:
    r = httpx.post(f"{url}/v1/completions", timeout=timeout_s,
                   json={"model": model, "prompt": ids, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text


def decisions(router: str, backend: str) -> float:
    return metric(httpx.get(f"{router}/metrics", timeout=5).text, "paged_router_routing_decisions_total",
                  backend=backend)


def cached(server) -> set[str]:
    return set(httpx.get(f"{server.url}/kv/blocks", timeout=30).json()["blocks"])


def view(router: str) -> list[set[str]]:
    return [set(b["blocks"]) for b in httpx.get(f"{router}/kv/view", timeout=10).json()["backends"]]


def test_the_router_learns_each_replicas_cache_size_from_its_metrics(kv_cluster):
    """The router is not told the replicas' cache size (no --num-gpu-blocks): it reads their
    `vllm:cache_config_info`."""
    backends = httpx.get(f"{kv_cluster['router']}/kv/view", timeout=10).json()["backends"]
    assert [b["num_gpu_blocks"] for b in backends] == [48, 48]


def test_a_shared_prefix_goes_to_the_replica_that_caches_it(kv_cluster):
    """The prefix is cached on replica b behind the router's back (sent to b directly), so only b's
    KV events can tell the router; a load-only router would send every request to a (ties go to
    the first replica)."""
    a, b, router, model = kv_cluster["a"], kv_cluster["b"], kv_cluster["router"], kv_cluster["model"]
    prefix = prompt(1, 10 * BLOCK)
    complete(b.url, model, prefix + prompt(2, 2 * BLOCK))
    wait_until(lambda: set(hashes(prefix)) <= view(router)[1], "the router sees b cache the prefix")
    for seed in (3, 4, 5):
        ids = prefix + prompt(seed, 2 * BLOCK)
        complete(router, model, ids)
        own = hashes(ids)[-1]  # this request's last block: no other prompt has it
        assert own in cached(b) and own not in cached(a), f"request {seed} did not run on b"


def test_a_new_prefix_goes_to_the_less_loaded_replica(kv_cluster):
    """With a stopped (so never finishing) request in flight on a, a request whose prefix no replica
    caches goes to b: kv_aware's scores tie on the cache, and load decides. So does a text prompt,
    which a router without `--tokenizer` cannot hash as the engine does."""
    a, b, router, model = kv_cluster["a"], kv_cluster["b"], kv_cluster["router"], kv_cluster["model"]
    first, second = prompt(20, 4 * BLOCK), prompt(21, 4 * BLOCK)
    with ThreadPoolExecutor(1) as pool:
        a.proc.send_signal(signal.SIGSTOP)
        try:
            held = pool.submit(complete, router, model, first)
            wait_until(lambda: metric(httpx.get(f"{router}/metrics", timeout=5).text,
                                      "paged_router_backend_outstanding", backend=a.url) == 1,
                       "the first request in flight on a")
            complete(router, model, second, timeout_s=30)  # (a bound: on a, it would wait for a to resume)
            before = decisions(router, b.url)
            r = httpx.post(f"{router}/v1/completions", timeout=30, json={
                "model": model, "prompt": "a text prompt", "max_tokens": 1})
            assert r.status_code == 200 and decisions(router, b.url) == before + 1
        finally:
            a.proc.send_signal(signal.SIGCONT)
        held.result()
    assert hashes(second)[-1] in cached(b) and hashes(second)[-1] not in cached(a)
    assert hashes(first)[-1] in cached(a)


def test_the_routers_view_is_each_replicas_cache(kv_cluster):
    """After prompts that evict earlier ones (each replica's pool holds 48 blocks; these are 13
    blocks each), the router's view of each replica equals the hashes the replica caches, evicted
    blocks gone: stored and removed events both reach it."""
    a, b, router, model = kv_cluster["a"], kv_cluster["b"], kv_cluster["router"], kv_cluster["model"]
    for seed in range(30, 34):
        complete(a.url, model, prompt(seed, 13 * BLOCK))
        complete(b.url, model, prompt(seed + 10, 13 * BLOCK))
    assert not set(hashes(prompt(30, 13 * BLOCK))) <= cached(a)  # the pool is too small for all four
    wait_until(lambda: view(router) == [cached(a), cached(b)], "the router's view equals each replica's cache")


def test_the_router_follows_a_keyed_replica_with_its_key(tiny_chat_model, procs, tmp_path):
    """A replica with an API key shows its KV endpoints to no one without it; a router given the key
    (`--api-key`) follows its cache. Clients' requests go on with their own Authorization header,
    never the router's key."""
    key = {"Authorization": "Bearer k3y"}
    with launched_server(tiny_chat_model, [*engine_flags(num_gpu_blocks=48), "--log-level", "warning"],
                         tmp_path / "keyed.log", env={"PAGED_API_KEY": "k3y"}) as replica:
        url, proc = start_router(procs, [replica.url], "kv_aware", "--block-size", str(BLOCK), "--api-key", "k3y",
                                 "--kv-events-interval-s", "0.2")
        wait_router(procs, url, proc, [replica.url])
        ids = prompt(60, 3 * BLOCK)
        r = httpx.post(f"{replica.url}/v1/completions", headers=key, timeout=60,
                       json={"prompt": ids, "max_tokens": 1})
        assert r.status_code == 200, r.text
        wait_until(lambda: set(hashes(ids)) <= view(url)[0], "the router sees the keyed replica's cache")
        assert httpx.get(f"{replica.url}/kv/blocks", timeout=10).status_code == 401
        assert httpx.post(f"{url}/v1/completions", json={"prompt": ids, "max_tokens": 1}, timeout=60).status_code == 401
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
        assert httpx.get(f"{url}/v1/models", headers=key, timeout=10).status_code == 200


def test_with_the_replicas_tokenizer_text_and_chat_go_where_they_are_cached(kv_cluster, procs):
    """`--tokenizer` (the replicas' model): the router cuts text and chat prompts into the engine's
    tokens as `paged serve` does, so they follow the cache like token ids. The prefixes are cached
    on b behind the router's back; a load-only router would send all to a (ties go to the first)."""
    from paged.engine.loader import load_tokenizer

    a, b, model = kv_cluster["a"], kv_cluster["b"], kv_cluster["model"]
    url, proc = start_router(procs, [a.url, b.url], "kv_aware", "--block-size", str(BLOCK), "--tokenizer", model,
                             "--health-interval-s", "60", "--kv-events-interval-s", "0.2")
    wait_router(procs, url, proc, [a.url, b.url])
    tok = load_tokenizer(model)
    prefix = "".join(chr(97 + (7 * i) % 26) for i in range(10 * BLOCK))
    for path, body, ids in (
            ("/v1/completions", lambda s: {"prompt": prefix + s}, lambda s: tok.encode(prefix + s)),
            ("/v1/chat/completions", lambda s: {"messages": [{"role": "user", "content": prefix + s}]},
             lambda s: tok.chat_prompt([{"role": "user", "content": prefix + s}])["prompt_token_ids"])):
        r = httpx.post(f"{b.url}{path}", timeout=60, json={"model": model, "max_tokens": 1, **body("#seed")})
        assert r.status_code == 200, r.text
        seeded = set(hashes(ids("#seed")))
        wait_until(lambda seeded=seeded: seeded <= view(url)[1], f"the router sees b cache {path}'s prefix")
        for own in (" one of its own", " another one", " and a third"):
            r = httpx.post(f"{url}{path}", timeout=60, json={"model": model, "max_tokens": 1, **body(own * 4)})
            assert r.status_code == 200, r.text
            last = hashes(ids(own * 4))[-1]  # no other prompt has this block
            assert last in cached(b) and last not in cached(a), f"{path} {own!r} did not run on b"
