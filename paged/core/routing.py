"""Routing policies: which replica a new request goes to.

Pure decision code, shared by the simulator's cluster (`sim.cluster`) and the real load
balancer (`paged.serve`): both hand a router the request's chained prefix ids and a view of
each replica (`ReplicaView`), and get back an index. A router sees what a real one would see at
the moment of arrival: the requests outstanding at each replica, each replica's KV usage, and
(prefix-aware) the prefixes it has itself sent where, as SGLang's cache-aware router keeps an
approximate tree per worker rather than asking the workers. Ties go to the lowest replica
index, so routing is deterministic.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol


class ReplicaView(Protocol):
    """What a router may read of a replica: requests routed there and not finished, and the
    share of its KV cache in use (0..1; vLLM exports it as `vllm:kv_cache_usage_perc`)."""

    @property
    def outstanding(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...


class Router(Protocol):
    name: str

    def route(self, prefix_ids: Sequence[int] | None, replicas: Sequence[ReplicaView]) -> int:
        """The index of the replica for a request whose prompt has these chained block hash ids
        (None or empty when unknown)."""


class RoundRobin:
    name = "round_robin"

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        self._next = 0

    def route(self, prefix_ids, replicas) -> int:
        i = self._next
        self._next = (i + 1) % self.num_replicas
        return i


def least_outstanding(replicas) -> int:
    return min(range(len(replicas)), key=lambda i: replicas[i].outstanding)


class LeastOutstanding:
    """Fewest requests routed and not finished (vLLM production-stack's session-less default)."""

    name = "least_outstanding"

    def __init__(self, num_replicas: int) -> None:
        pass

    def route(self, prefix_ids, replicas) -> int:
        return least_outstanding(replicas)


class LeastKVUsage:
    """Lowest KV cache usage; ties by fewest outstanding requests."""

    name = "least_kv"

    def __init__(self, num_replicas: int) -> None:
        pass

    def route(self, prefix_ids, replicas) -> int:
        return min(range(len(replicas)),
                   key=lambda i: (replicas[i].kv_usage, replicas[i].outstanding))


class PrefixAware:
    """Send a request where the longest part of its prefix was sent before, unless that replica
    has `balance_threshold` more outstanding requests than the least loaded one (then, and for
    requests without prefix ids, least outstanding). Each replica's record of prefixes is an
    LRU of `capacity_ids` prefix ids, about what its KV cache holds."""

    name = "prefix_aware"

    def __init__(self, num_replicas: int, capacity_ids: int = 1 << 20, balance_threshold: int = 32) -> None:
        self.trees: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]
        self.capacity_ids = capacity_ids
        self.balance_threshold = balance_threshold

    def route(self, prefix_ids, replicas) -> int:
        ids = prefix_ids
        if not ids:
            return least_outstanding(replicas)
        keys, h = [], 0
        for x in ids:  # chained: a key names the whole prefix up to it
            h = hash((h, x))
            keys.append(h)
        best, best_len = 0, -1
        for i, tree in enumerate(self.trees):
            m = 0
            for key in keys:
                if key not in tree:
                    break
                m += 1
            if m > best_len or (m == best_len and replicas[i].outstanding < replicas[best].outstanding):
                best, best_len = i, m
        lightest = least_outstanding(replicas)
        if best_len == 0 or replicas[best].outstanding - replicas[lightest].outstanding > self.balance_threshold:
            best = lightest
        tree = self.trees[best]
        for key in keys:
            tree[key] = None
            tree.move_to_end(key)
        while len(tree) > self.capacity_ids:
            tree.popitem(last=False)
        return best


ROUTER_CLASSES = {r.name: r for r in (RoundRobin, LeastOutstanding, LeastKVUsage, PrefixAware)}


ROUTERS = tuple(ROUTER_CLASSES)


def make_router(name: str, num_replicas: int, capacity_ids: int | None = None) -> Router:
    if name not in ROUTER_CLASSES:
        raise ValueError(f"unknown router {name!r}: known are {sorted(ROUTER_CLASSES)}")
    if name == "prefix_aware" and capacity_ids is not None:
        return PrefixAware(num_replicas, capacity_ids)
    return ROUTER_CLASSES[name](num_replicas)
