"""The router's view of its backends: each one a `paged.core.routing.ReplicaView`, kept up to
date by probing it.

`outstanding` is the number of requests this router has in flight there (what the simulator's
routers read), `kv_usage` the last scraped `vllm:kv_cache_usage_perc` (vLLM's name, which this
project's server exports too; vLLM before v1 called it `vllm:gpu_cache_usage_perc`). A backend
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
UNAVAILABLE = 1 << 40  # the outstanding requests a backend out of service shows the routers


def is_server_url(url: str) -> bool:
    """http(s)://HOST[:PORT]: checked where a URL is given, since a bare host:port fails only later
    (a backend out of service forever, or httpx's "missing an 'http://' or 'https://' protocol")."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


class Backend:
    def __init__(self, url: str, new_client: Callable[[], httpx.AsyncClient]) -> None:
        self.url = url.rstrip("/")
        self.in_flight = 0
        self.scraped_kv_usage = 0.0
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


def kv_usage_from_metrics(text: str) -> float | None:
    """The KV cache usage (0..1) in a Prometheus exposition, None when it has none (the most
    used engine when a server reports several)."""
    return Scrape(text).max(*KV_USAGE_METRICS)


async def probe(backend: Backend, timeout_s: float) -> None:
    """`/health` says whether the backend is in service (a 200 in time); when it is, `/metrics`
    refreshes its KV usage (a backend without it keeps the last value: 0 for one that never
    exported it)."""
    try:
        healthy = (await backend.client.get(f"{backend.url}/health", timeout=timeout_s)).status_code == 200
    except httpx.HTTPError:
        healthy = False
    if healthy:
        try:
            response = await backend.client.get(f"{backend.url}/metrics", timeout=timeout_s)
            usage = kv_usage_from_metrics(response.text) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):  # ValueError: an exposition the parser rejects
            usage = None
        if usage is not None:
            backend.scraped_kv_usage = usage
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
