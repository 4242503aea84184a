"""The router's view of its backends: each one a `paged.core.routing.ReplicaView`, kept up to
date by probing it.

`outstanding` is the number of requests this router has in flight there (what the simulator's
routers read), `kv_usage` the last scraped `vllm:kv_cache_usage_perc` (vLLM's name, which this
project's server exports too; vLLM before v1 called it `vllm:gpu_cache_usage_perc`), and
`num_gpu_blocks` its KV cache in blocks: the router's `--num-gpu-blocks` when given, else the
`num_gpu_blocks` label of the `vllm:cache_config_info` the same scrape reads (vLLM's, and this
project's server's), so that kv_aware knows each backend's cache even where the engines sized it
from a memory budget, as they usually do; None while neither says. A backend
out of service looks infinitely loaded, so that the load-aware policies never choose it while
another one is up, and the router skips it when a policy that ignores load (round robin) does.

Each backend has an HTTP client of its own, so that the requests in flight on a backend that
hangs (it fails its probes but keeps its connections open, as a stopped process or a lost
machine does) can be failed at once by closing that client: their reads raise `httpx.ReadError`,
and the router answers them with errors instead of waiting for the read timeout.
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

from .scrape import Scrape

KV_USAGE_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_CONFIG_METRIC = "vllm:cache_config_info"
UNAVAILABLE = 1 << 40  # the outstanding requests a backend out of service shows the routers


def is_server_url(url: str) -> bool:
    """http(s)://HOST[:PORT]: checked where a URL is given, since a bare host:port fails only later
    (a backend out of service forever, or httpx's "missing an 'http://' or 'https://' protocol")."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


class Backend:
    def __init__(self, url: str, new_client: Callable[[], httpx.AsyncClient],
                 num_gpu_blocks: int | None = None) -> None:
        """`num_gpu_blocks`: the backend's KV cache in blocks as the router was told it (None: as scraped)."""
        self.url = url.rstrip("/")
        self.in_flight = 0
        self.scraped_kv_usage = 0.0
        self.scraped_num_gpu_blocks: int | None = None
        self.given_num_gpu_blocks = num_gpu_blocks
        self.healthy = False  # until a probe says otherwise
        self.failed_probes = 0  # in a row
        self._new_client = new_client
        self.client = new_client()

    async def abort_in_flight(self) -> None:
        """Fail every request in flight here now; later requests get new connections."""
        old, self.client = self.client, self._new_client()
        await old.aclose()

    @property
    def outstanding(self) -> int:
        return self.in_flight if self.healthy else UNAVAILABLE

    @property
    def kv_usage(self) -> float:
        return self.scraped_kv_usage if self.healthy else math.inf

    @property
    def num_gpu_blocks(self) -> int | None:
        return self.scraped_num_gpu_blocks if self.given_num_gpu_blocks is None else self.given_num_gpu_blocks


def kv_usage_from_metrics(scrape: Scrape) -> float | None:
    """The KV cache usage (0..1) in a Prometheus exposition, None when it has none (the most
    used engine when a server reports several)."""
    return scrape.max(*KV_USAGE_METRICS)


def num_gpu_blocks_from_metrics(scrape: Scrape) -> int | None:
    """The KV cache in blocks that `vllm:cache_config_info` reports, None when it does not (no such
    metric, or a label that is no positive integer: vLLM's "None" before its cache is sized). With
    several engines, the smallest cache, as the usage is the most used engine's."""
    sizes = [int(v) for s in scrape.samples.get(CACHE_CONFIG_METRIC, ())
             if (v := s.labels.get("num_gpu_blocks", "")).isdecimal() and int(v) > 0]
    return min(sizes, default=None)


async def probe(backend: Backend, timeout_s: float) -> None:
    """`/health` says whether the backend is in service (a 200 in time); when it is, `/metrics`
    refreshes its KV usage and cache size (a backend without them keeps the last values: usage 0
    and size unknown for one that never exported them; a restarted backend may come back with
    another cache)."""
    try:
        healthy = (await backend.client.get(f"{backend.url}/health", timeout=timeout_s)).status_code == 200
    except httpx.HTTPError:
        healthy = False
    if healthy:
        usage = num_gpu_blocks = None
        try:
            response = await backend.client.get(f"{backend.url}/metrics", timeout=timeout_s)
            if response.status_code == 200:
                scrape = Scrape(response.text)
                usage, num_gpu_blocks = kv_usage_from_metrics(scrape), num_gpu_blocks_from_metrics(scrape)
        except (httpx.HTTPError, ValueError):  # ValueError: an exposition the parser rejects
            pass
        if usage is not None:
            backend.scraped_kv_usage = usage
        if num_gpu_blocks is not None:
            backend.scraped_num_gpu_blocks = num_gpu_blocks
    backend.healthy = healthy
    backend.failed_probes = 0 if healthy else backend.failed_probes + 1


async def watch(backend: Backend, interval_s: float, timeout_s: float, abort_after: int) -> None:
    """Probe a backend every `interval_s` for as long as the router runs: a dead one is taken
    out at its first failed probe and rejoins at its first healthy one; at `abort_after` failed
    probes in a row, the requests still in flight there are failed."""
    while True:
        await probe(backend, timeout_s)
        if backend.failed_probes == abort_after and backend.in_flight:
            await backend.abort_in_flight()
        await asyncio.sleep(interval_s)
