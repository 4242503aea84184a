"""Routers' decisions on hand-made replica states."""
from types import SimpleNamespace

from paged.core.routing import make_router


def replicas(outstanding, used=None, blocks=100):
    used = used or [0] * len(outstanding)
    return [SimpleNamespace(outstanding=o, kv_usage=u / blocks) for o, u in zip(outstanding, used, strict=True)]


def req(ids=None):
    return ids


def test_round_robin_cycles():
    r = make_router("round_robin", 3)
    assert [r.route(req(), replicas([0, 0, 0])) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_and_least_kv_break_ties_by_index():
    assert make_router("least_outstanding", 3).route(req(), replicas([4, 2, 2])) == 1
    lk = make_router("least_kv", 3)
    assert lk.route(req(), replicas([0, 5, 1], used=[50, 10, 10])) == 2  # equal usage: fewer outstanding
    assert lk.route(req(), replicas([0, 0, 0], used=[30, 20, 20])) == 1


def test_prefix_aware_follows_prefixes_but_not_into_overload():
    r = make_router("prefix_aware", 2, capacity_ids=100)
    assert r.route(req([1, 2, 3]), replicas([0, 0])) == 0
    assert r.route(req([7, 8]), replicas([1, 0])) == 1  # no match: least outstanding
    assert r.route(req([1, 2, 9]), replicas([5, 0])) == 0  # longest match wins over load
    assert r.route(req([7, 8, 1]), replicas([0, 3])) == 1
    assert r.route(req([1, 2]), replicas([40, 0])) == 1  # 40 more outstanding than the lightest: balance
    assert r.route(req(), replicas([3, 2])) == 1
