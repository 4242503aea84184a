"""The router's view of a backend's cache (`kv_sync`) stays that cache through what breaks a plain
event stream: events the backend's bounded log dropped before the router read them (reset), a
restarted backend (a new log), a backend out of service (its view cleared) and its return
(resync). The backend here is a real block pool and event log behind an in-process transport."""
import asyncio
from types import SimpleNamespace

import httpx

from paged.core.block_pool import BlockPool
from paged.core.routing import ReplicaCacheView
from paged.serve.backends import Backend
from paged.serve.kv_events import KVEventLog, snapshot
from paged.serve.kv_sync import KVSync


class Replica:
    """A pool of 8 blocks publishing to a log of `capacity` events, answering /kv/events and /kv/blocks."""

    def __init__(self, capacity: int) -> None:
        self.pool = BlockPool(8)
        self.log = self.pool.events = KVEventLog(capacity)
        self.engine = SimpleNamespace(scheduler=SimpleNamespace(kv=SimpleNamespace(block_size=16, pool=self.pool)))

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/kv/events":
            return httpx.Response(200, json=self.log.since(int(request.url.params["since"])))
        return httpx.Response(200, json=snapshot(self.log, self.engine))

    def fill(self, *seeds: int) -> None:
        """Cache one block per seed (evicting the oldest once the pool is full), then free them."""
        blocks = self.pool.allocate_n(len(seeds))
        self.pool.cache(blocks, [bytes([s]) * 16 for s in seeds])
        self.pool.free(blocks)


def test_the_view_follows_resets_restarts_and_outages():
    replica = Replica(capacity=3)
    backend = Backend("http://replica", lambda: httpx.AsyncClient(transport=httpx.MockTransport(replica.handle)))
    backend.healthy = True
    view = ReplicaCacheView()
    sync = KVSync(backend, view, block_size=16)

    async def poll_and_compare() -> None:
        await sync.poll(timeout_s=1)
        assert view.hashes == set(replica.pool.cached)

    async def run() -> None:
        replica.fill(1, 2)  # before the router follows: only the snapshot has these
        await poll_and_compare()
        replica.fill(3)  # one event
        await poll_and_compare()
        for seed in range(4, 15):  # 11 events, evictions among them, in a log that keeps 3
            replica.fill(seed)
        await poll_and_compare()
        backend.healthy = False
        await sync.poll(timeout_s=1)
        assert view.hashes == set()  # out of service: its cache is unknown
        replica.fill(20)
        backend.healthy = True
        await poll_and_compare()
        seq = replica.log.seq
        replica.__init__(capacity=100)  # restarted: an empty pool, a new log that reaches the old seq
        for seed in range(30, 30 + seq):
            replica.fill(seed)
        await poll_and_compare()
        await backend.client.aclose()

    asyncio.run(run())
