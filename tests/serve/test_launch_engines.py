"""`paged launch` of real engines: three `paged serve` replicas of a tiny random model behind the
router. One replica is killed (SIGKILL) while requests run: a plain request in flight on it, which
has had no byte of its answer, is sent once more to a survivor (it was a 502) and finishes, never
hangs, and every other request, then and afterwards, finishes."""
from __future__ import annotations

import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx

from .conftest import engine_flags, metric, wait_until
from .test_launch import launch, ready

TOKENS = 400  # long enough to be caught in flight


def complete(url: str, model: str, i: int) -> int:
    """One request's status code."""
    body = {"model": model, "prompt": [100 + i, 200 + i, 300 + i], "max_tokens": TOKENS, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code


def test_three_engine_replicas_one_killed_mid_run(procs, tmp_path, tiny_chat_model):
    model = str(tiny_chat_model)
    proc, url = launch(procs, tmp_path, 3, "--router", "round_robin", *engine_flags(), server="",
                       model=model)
    started = ready(procs, proc, url)
    victim = re.search(r"^replica 1: pid \d+ at (\S+)", proc.log_path.read_text(), re.M).group(1)

    def running_on_victim() -> bool:
        return (metric(httpx.get(f"{victim}/metrics", timeout=10).text, "vllm:num_requests_running") or 0) >= 1

    with ThreadPoolExecutor(6) as pool:
        running = [pool.submit(complete, url, model, i) for i in range(6)]  # two on each replica
        wait_until(running_on_victim, "a request running on replica 1")
        os.kill(started["replica 1"], signal.SIGKILL)
        during = [f.result() for f in running]
    after = [complete(url, model, 10 + i) for i in range(6)]
    assert during == [200] * 6
    retried = metric(httpx.get(f"{url}/metrics", timeout=10).text, "paged_router_errors_total", backend=victim,
                     reason="retried")
    assert 1 <= retried <= 2  # the victim's, each sent once more
    assert after == [200] * 6


def test_a_kv_aware_launch_routes_a_repeated_chat_to_the_replica_that_caches_it(procs, tmp_path, tiny_chat_model):
    """`paged launch --router kv_aware` gave its router no tokenizer: chats went by load alone, and
    the same chat to another replica than the one caching it. A chat seeded on replica 1 behind the
    router's back (a load-only router sends the repeats to replica 0, the first of a tie) is sent
    there, and finds its prompt cached."""
    model = str(tiny_chat_model)
    proc, url = launch(procs, tmp_path, 2, "--router", "kv_aware", *engine_flags(), server="", model=model)
    ready(procs, proc, url)
    second = re.search(r"^replica 1: pid \d+ at (\S+)", proc.log_path.read_text(), re.M).group(1)
    content = "".join(chr(97 + (7 * i) % 26) for i in range(160))  # ten blocks of the tiny model's byte tokens
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    assert httpx.post(f"{second}/v1/chat/completions", json=body, timeout=60).status_code == 200
    wait_until(lambda: httpx.get(f"{url}/kv/view", timeout=10).json()["backends"][1]["blocks"],
               "the router sees replica 1 cache the chat")
    for _ in range(2):
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["x-paged-backend"] == second
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
