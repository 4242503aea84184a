"""kv_aware's view of each backend's prefix cache, kept equal to it from the backend's KV events.

Every `interval_s` the router reads `GET /kv/events?since=SEQ` from each backend in service and
applies the events, in order, to `KVAware.replica_events(i)` (stored, removed, all cleared), as
llm-d's precise prefix-cache scorer consumes vLLM's. It resyncs from `GET /kv/blocks` (clear,
then store every cached hash, then follow from the snapshot's seq) when it starts following a
backend, when the backend rejoins, when the backend says it can no longer give the events since
SEQ (`reset`: the router fell behind its bounded log), and when the log is another one (`epoch`:
the backend restarted). A backend out of service has its view cleared: its cache is unknown,
and whatever it held is lost if it died. A poll that fails leaves the view as it was, to be
brought up to date by the next one (events are set operations: applying some twice is harmless).
A backend whose block size differs from the router's `--block-size` gets a warning: its hashes
never match a prompt's, so kv_aware sends it requests by load alone. So does one that refuses the
router's key (401: a poll that fails, logged at debug level as every failed poll is, and warned
about once).
"""
from __future__ import annotations

import asyncio
import logging

import httpx

from paged.core.routing import ReplicaCacheView

from .backends import Backend

log = logging.getLogger("paged.router")


class KVSync:
    def __init__(self, backend: Backend, view: ReplicaCacheView, block_size: int, headers: dict | None = None) -> None:
        """`headers`: sent with every read (the backends' API key)."""
        self.backend = backend
        self.headers = headers or {}
        self.view = view
        self.block_size = block_size
        self.epoch: str | None = None  # None: the view follows nothing (empty)
        self.seq = 0
        self.refused = False  # a 401 was warned about

    async def poll(self, timeout_s: float) -> None:
        backend = self.backend
        if not backend.healthy:
            if self.epoch is not None:  # its cache is unknown until it answers again
                self.view.all_blocks_cleared()
                self.epoch = None
            return
        try:
            if self.epoch is not None:
                r = await backend.client.get(f"{backend.url}/kv/events", params={"since": self.seq}, timeout=timeout_s,
                                           headers=self.headers)
                r.raise_for_status()
                page = r.json()
                if not page["reset"] and page["epoch"] == self.epoch:
                    self._apply(page["events"])
                    self.seq = page["seq"]
                    return
            r = await backend.client.get(f"{backend.url}/kv/blocks", timeout=timeout_s, headers=self.headers)
            r.raise_for_status()
            self._resync(r.json())
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            log.debug("KV events from %s: %r", backend.url, e)
            if isinstance(e, httpx.HTTPStatusError) and e.response.status_code == 401 and not self.refused:
                self.refused = True
                log.warning("%s refuses the router's API key: kv_aware sees none of its cache and routes there by "
                            "load alone (give the router the backends' key: --api-key or $PAGED_API_KEY)", backend.url)

    def _apply(self, events: list[dict]) -> None:
        view = self.view
        for e in events:
            kind = e["kind"]
            if kind == "cleared":
                view.all_blocks_cleared()
            elif kind == "stored":
                view.blocks_stored([bytes.fromhex(h) for h in e["hashes"]])
            elif kind == "removed":
                view.blocks_removed([bytes.fromhex(h) for h in e["hashes"]])

    def _resync(self, snapshot: dict) -> None:
        if snapshot["block_size"] != self.block_size and snapshot["epoch"] != self.epoch:
            log.warning("%s caches blocks of %d tokens, the router hashes blocks of %d (--block-size): kv_aware "
                        "can never match a prompt there", self.backend.url, snapshot["block_size"], self.block_size)
        self.view.all_blocks_cleared()
        self.view.blocks_stored([bytes.fromhex(h) for h in snapshot["blocks"]])
        self.epoch, self.seq = snapshot["epoch"], snapshot["seq"]


async def follow(sync: KVSync, interval_s: float, timeout_s: float) -> None:
    """Poll one backend's KV events for as long as the router runs."""
    while True:
        await sync.poll(timeout_s)
        await asyncio.sleep(interval_s)
