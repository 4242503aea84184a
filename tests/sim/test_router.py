"""Routers' decisions on hand-made replica states."""
import copy
from types import SimpleNamespace

import pytest

from paged.core.hashing import id_block_hashes
from paged.core.routing import balance_threshold, make_router


def replicas(outstanding, used=None, blocks=100, num_gpu_blocks=None):
    """Views of replicas of `blocks` blocks, `used` of them in use; `num_gpu_blocks`: the size each one
    tells the router (None: unknown, one for all, or a list)."""
    used = used or [0] * len(outstanding)
    sizes = num_gpu_blocks if isinstance(num_gpu_blocks, list) else [num_gpu_blocks] * len(outstanding)
    return [SimpleNamespace(outstanding=o, kv_usage=u / blocks, num_gpu_blocks=n)
            for o, u, n in zip(outstanding, used, sizes, strict=True)]


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


def test_prefix_aware_balances_relative_to_the_replicas_batch():
    """The imbalance limit is sqrt(max_num_seqs): 16 at vLLM's default batch, 3 for replicas of 8,
    which a fixed 32 would never reach."""
    assert [balance_threshold(n) for n in (1, 2, 8, 16, 256)] == [1, 1, 3, 4, 16]
    small = make_router("prefix_aware", 2, capacity_ids=100, max_num_seqs=8)
    assert small.route(req([1, 2]), replicas([0, 0])) == 0
    assert small.route(req([1, 2]), replicas([3, 0])) == 0  # 3 more: still the prefix's replica
    assert small.route(req([1, 2]), replicas([4, 0])) == 1  # 4 more: the lightest
    big = make_router("prefix_aware", 2, capacity_ids=100)
    big.route(req([1, 2]), replicas([0, 0]))
    assert big.route(req([1, 2]), replicas([16, 0])) == 0 and big.route(req([1, 2]), replicas([17, 0])) == 1
    for bad in (0, 2.5, None):
        with pytest.raises(ValueError, match="max_num_seqs"):
            balance_threshold(bad)


def test_prefix_aware_sends_a_short_match_to_the_smallest_record():
    """SGLang's cache_aware: a match of at most cache_threshold of the request's prefix ids goes to the
    replica whose record is smallest (the most room in its cache), not to the match nor the least loaded.
    A shared system prompt (ids 1, 2) no longer holds a new long prompt on its replica."""
    r = make_router("prefix_aware", 3, capacity_ids=100)
    assert r.route(req([1, 2, 3]), replicas([0, 0, 0])) == 0  # nothing recorded: all equal, the lowest index
    assert r.route(req([1, 2, 4, 5, 6, 7, 8, 9]), replicas([2, 0, 1])) == 1  # 2 of 8 <= 0.3: empty, lightest
    assert r.route(req([1, 2, 5, 6, 7, 8, 9, 10]), replicas([1, 0, 3])) == 2  # records of 3, 8, 0 ids
    assert r.route(req([1, 2, 4, 5, 6]), replicas([0, 0, 0])) == 1  # 5 of 5: the match
    assert r.route(req([7]), replicas([1, 0, 9])) == 0  # no match: the smallest record (3 ids), not the lightest


def test_prefix_aware_cache_threshold_edges():
    """At exactly the threshold, the smallest record; just above, the match; 0 follows any match, 1 none, not
    even of the whole prompt; ties by fewer outstanding, then the lowest index."""
    r = make_router("prefix_aware", 2, capacity_ids=100, cache_threshold=0.5)
    r.route(req([1, 2, 3, 4]), replicas([0, 0]))  # recorded at 0
    assert r.route(req([1, 2, 9, 9]), replicas([0, 0])) == 1  # 2 of 4 = 0.5: the smallest record
    assert r.route(req([1, 2, 3, 8]), replicas([0, 0])) == 0  # 3 of 4: the match
    zero = make_router("prefix_aware", 2, capacity_ids=100, cache_threshold=0.0)
    zero.route(req([1, 2, 3, 4]), replicas([0, 0]))
    assert zero.route(req([1, 5, 6, 7]), replicas([0, 0])) == 0  # 1 of 4 > 0
    assert zero.route(req([9]), replicas([0, 0])) == 1  # no match: still the smallest record
    one = make_router("prefix_aware", 2, capacity_ids=100, cache_threshold=1)
    one.route(req([1, 2]), replicas([0, 0]))
    assert one.route(req([1, 2, 3]), replicas([0, 0])) == 1  # 2 of 3: the empty record
    assert one.route(req([1, 2]), replicas([0, 0])) == 0  # held whole at both; records of 2 and 3 ids
    ties = make_router("prefix_aware", 3, capacity_ids=2)  # every record full at 2 ids: sizes tie
    for i, ids in enumerate(([1, 2], [3, 4], [5, 6])):
        assert ties.route(req(ids), replicas([int(j != i) for j in range(3)])) == i
    assert ties.route(req([7, 8]), replicas([2, 1, 1])) == 1  # fewer outstanding, then the lower index


def test_prefix_aware_balances_before_the_smallest_record():
    """The smallest record loses the request to the least loaded past the balance threshold, as the match does."""
    r = make_router("prefix_aware", 2, capacity_ids=100, max_num_seqs=8)
    r.route(req([1, 2, 3]), replicas([0, 0]))
    assert r.route(req([9]), replicas([0, 3])) == 1  # the smallest record, 3 above the lightest: within
    r2 = make_router("prefix_aware", 2, capacity_ids=100, max_num_seqs=8)
    r2.route(req([1, 2, 3]), replicas([0, 0]))
    assert r2.route(req([9]), replicas([0, 4])) == 0  # the smallest record (1) is 4 above the lightest


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), None, True])
def test_prefix_aware_refuses_a_cache_threshold_outside_0_1(bad):
    with pytest.raises(ValueError, match=r"PrefixAware.cache_threshold=.*expected a number in \[0, 1\]"):
        make_router("prefix_aware", 2, cache_threshold=bad)


def test_the_simulator_gives_prefix_aware_its_cache_threshold(monkeypatch):
    import numpy as np

    import paged.core.routing as routing
    from sim import SimConfig, Workload, simulate

    seen = []
    init = routing.PrefixAware.__init__
    monkeypatch.setattr(routing.PrefixAware, "__init__", lambda self, *a, **k: seen.append(self) or init(self, *a, **k))
    w = Workload(np.zeros(1), np.array([40]), np.array([2]), name="one")
    simulate(w, SimConfig(replicas=2, router="prefix_aware", cache_threshold=0.7, num_gpu_blocks=64, max_model_len=64))
    assert seen[0].cache_threshold == 0.7
    with pytest.raises(ValueError, match=r"SimConfig.cache_threshold=1.2: expected a number in \[0, 1\]"):
        SimConfig(cache_threshold=1.2)


def test_the_simulator_gives_prefix_aware_the_replicas_batch(monkeypatch):
    import numpy as np

    import paged.core.routing as routing
    from sim import SimConfig, Workload, simulate

    seen = []
    monkeypatch.setattr(routing, "balance_threshold", lambda n: seen.append(n) or 1)
    w = Workload(np.zeros(1), np.array([40]), np.array([2]), name="one")
    simulate(w, SimConfig(replicas=2, router="prefix_aware", max_num_seqs=8, num_gpu_blocks=64, max_model_len=64))
    assert seen == [8]


def test_kv_aware_follows_what_replicas_report_not_what_it_sent():
    """A prefix goes where the replica's events say it is cached, unless the load there costs
    more than the cached tokens save (at first 1,024 tokens per outstanding request); once the
    replica reports the blocks evicted, the router stops believing they are there."""
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512)
    blocks = id_block_hashes([5, 6, 7], 512, 16, 96)  # 1,536 tokens
    assert r.route(req([5, 6, 7]), replicas([1, 0])) == 1  # nothing cached anywhere: least outstanding
    r.replica_events(0).blocks_stored(blocks)
    assert r.route(req([5, 6, 7]), replicas([1, 0])) == 0  # 1,536 cached tokens beat one more request
    assert r.route(req([5, 6, 7]), replicas([2, 0])) == 1  # but not two
    assert r.route(req([9, 6, 7]), replicas([1, 0])) == 1  # a different start shares nothing
    assert r.route(req([5, 6, 9]), replicas([0, 1])) == 0  # a shared start counts: 1,024 tokens
    r.replica_events(0).blocks_removed(blocks[32:])
    assert r.route(req([5, 6, 7]), replicas([2, 0])) == 1  # 512 tokens left: not worth two requests
    r.replica_events(0).all_blocks_cleared()
    assert r.route(req([5, 6, 7]), replicas([0, 0])) == 0 and r.views[0].hashes == set()


def test_kv_aware_counts_blocks_in_flight_at_the_replica_it_sent_them_to():
    """A conversation's next turn that arrives before its replica has reported the last turn's
    blocks stored goes to the same replica: the blocks sent there count as cached until the
    replica reports them stored, for as many of its newest routings as it has outstanding (while no
    replica is idle: see the next test)."""
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512)
    turn1, turn2 = [5, 6, 7], [5, 6, 7, 8]  # 1,536 tokens, then 512 more
    assert r.route(req(turn1), replicas([0, 0])) == 0
    assert r.route(req(turn2), replicas([2, 1])) == 0  # 1,536 tokens in flight
    assert make_router("kv_aware", 2).route(req(turn2), replicas([3, 1])) == 1  # no record: the lightest (3 > 1 + 1)
    r.replica_events(0).blocks_stored(id_block_hashes(turn1, 512, 16, 96))  # turn 1 prefilled
    assert r.route(req(turn2 + [9]), replicas([1, 0])) == 0  # 96 blocks cached, 32 of turn 2's in flight
    assert set(r.views[0].in_flight) == set(id_block_hashes(turn2 + [9], 512, 16, 160, 96))
    # Both requests finished (none outstanding) without reporting turn 2's blocks: none in flight.
    assert r.route(req([1, 2]), replicas([0, 1])) == 0 and len(r.views[0].in_flight) == 64


def test_kv_aware_sends_no_request_to_wait_behind_a_prefill_while_a_replica_is_idle():
    """Blocks in flight at a replica are a prefill there still to do: while another replica is idle, a
    request sharing them would only wait behind it, so they count as not cached. An 8k-token system prompt
    on 8 H200s (probe grid): a request spilt to a replica and computed the prompt cold, the next ones, seeing
    it in flight, queued behind that prefill (TTFT p99 0.25 s, least_outstanding 0.15 s). With no replica
    idle every request queues anyway and the blocks count; once stored, they count as cached."""
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512)
    system = list(range(16))  # 8,192 tokens
    assert r.route(req(system + [100]), replicas([0, 0])) == 0
    none_idle = copy.deepcopy(r)
    assert r.route(req(system + [101]), replicas([1, 0])) == 1  # replica 1 idle: no wait behind 0's prefill
    assert none_idle.route(req(system + [101]), replicas([2, 1])) == 0  # 8,192 tokens in flight at 0
    r.replica_events(0).blocks_stored(id_block_hashes(system, 512, 16, 512))  # replica 0 prefilled it
    assert r.route(req(system + [102]), replicas([2, 0])) == 0  # cached: 8,192 tokens beat two requests


def test_kv_aware_counts_no_cache_where_a_request_would_wait_for_memory():
    """A request whose blocks would not fit beside a replica's blocks in use and in flight (those its
    outstanding requests claim counted once) waits there for memory, for whole requests to finish: while
    another replica is idle, what the full one caches saves it nothing.
    AGENTIC turns with an 8k-token system prompt on 8 H200s of 2,048 blocks: the prompt's 8,192 cached tokens
    outweighed 8 outstanding requests, and turns of 10-30k tokens queued for memory where only two fit
    while three replicas idled (TTFT p99 0.72-1.74 s, least_outstanding 0.40-0.47 s). With no replica idle
    it waits wherever it goes, and the cache counts; with the cache's size unknown, a replica is full only
    at 100% usage. The size is each replica's own, read from its view: one twice as large has room."""
    system = list(range(16))  # 8,192 tokens: 512 blocks, a quarter of the cache
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512)
    r.replica_events(0).blocks_stored(id_block_hashes(system, 512, 16, 512))
    assert r.route(req(system + [100]), replicas([2, 0], used=[1500, 0], blocks=2048, num_gpu_blocks=2048)) == 0
    none_idle, unknown, larger = copy.deepcopy(r), copy.deepcopy(r), copy.deepcopy(r)  # 544 blocks fit
    # the system prompt is claimed there: 32 blocks in flight (request 100's) and the request's 32 others do not fit
    assert r.route(req(system + [101]), replicas([2, 0], used=[2000, 0], blocks=2048, num_gpu_blocks=2048)) == 1
    assert none_idle.route(req(system + [101]), replicas([2, 1], used=[2000, 200], blocks=2048,
                                                         num_gpu_blocks=2048)) == 0
    assert unknown.route(req(system + [101]), replicas([2, 0], used=[2000, 0], blocks=2048)) == 0
    assert larger.route(req(system + [101]), replicas([2, 0], used=[2000, 0], blocks=4096,
                                                      num_gpu_blocks=[4096, 2048])) == 0


def test_kv_aware_fills_an_empty_cache_before_evicting_from_a_full_one():
    """The blocks a request stores at a replica whose cache is full evict as many cached ones; while another
    replica's cache has room for them, they count against what the full one caches. A cached system prompt
    that is less than the turn brings anew no longer keeps every turn on the replicas that cached it first
    while the others' caches stay empty (AGENTIC with an 8k-token system prompt on 8 H200s: three never
    used, 84.4% of the pooled-LRU yardstick). A turn bringing less than the prompt stays; with no room
    anywhere every choice evicts, and the cache counts as before."""
    system = list(range(16))  # 8,192 tokens: 512 blocks, a quarter of the cache
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512)
    r.replica_events(0).blocks_stored(id_block_hashes(system + list(range(100, 148)), 512, 16, 2048))  # full
    no_room = copy.deepcopy(r)
    no_room.replica_events(1).blocks_stored(id_block_hashes(list(range(200, 264)), 512, 16, 2048))
    long_turn = system + list(range(300, 320))  # 640 blocks past the system prompt
    first_turn = system + [400]  # 32
    assert r.route(req(first_turn), replicas([0, 0], num_gpu_blocks=2048)) == 0
    assert r.route(req(long_turn), replicas([0, 0], num_gpu_blocks=2048)) == 1
    assert no_room.route(req(long_turn), replicas([0, 0], num_gpu_blocks=2048)) == 0


def test_the_simulator_shows_kv_aware_each_replicas_cache_size(monkeypatch):
    import numpy as np

    import paged.core.routing as routing
    from sim import SimConfig, Workload, simulate

    seen = []
    route = routing.KVAware.route
    monkeypatch.setattr(routing.KVAware, "route", lambda self, ids, replicas: seen.append(
        [r.num_gpu_blocks for r in replicas]) or route(self, ids, replicas))
    w = Workload(np.zeros(1), np.array([40]), np.array([2]), name="one")
    simulate(w, SimConfig(replicas=2, router="kv_aware", num_gpu_blocks=64, max_model_len=64))
    assert seen == [[64, 64]]


def test_kv_aware_counts_a_waiting_requests_blocks_at_its_replica_though_evicted():
    """A request sent where its history is cached claims those blocks there: should the cache evict them
    while the request waits, it computes them again, so the conversation's next turn, arriving meanwhile,
    still goes there (past saturation, turns went elsewhere and both replicas prefilled the history).
    Only blocks the replica did not cache when they were sent count as prefill in flight."""
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512)
    turn1, turn2 = [5, 6, 7], [5, 6, 7, 8]  # 1,536 tokens, then 512 more
    r.replica_events(0).blocks_stored(id_block_hashes(turn1, 512, 16, 96))
    assert r.route(req(turn2), replicas([0, 0])) == 0  # turn 2 where turn 1 is cached
    assert set(r.views[0].in_flight) == set(id_block_hashes(turn2, 512, 16, 128, 96))
    r.replica_events(0).blocks_removed(id_block_hashes(turn1, 512, 16, 96))  # evicted while turn 2 waits
    assert r.route(req(turn2 + [9]), replicas([1, 0])) == 0  # 2,048 tokens claimed beat one request
    # No request outstanding at 0: nothing claimed there but the new routing's blocks.
    assert r.route(req([1, 2]), replicas([0, 1])) == 0 and len(r.views[0].claimed) == 64


def test_kv_aware_keeps_in_flight_only_the_newest_routings():
    """A replica with k outstanding requests keeps the blocks of its k newest routings in flight
    (a block sent again counts from its latest routing), and never more than a batch of them."""
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512, max_num_seqs=2)
    a, b, c, d = [1], [2], [3], [4]  # 32 blocks each, nothing shared

    def in_flight(*prompts):
        return {h for ids in prompts for h in id_block_hashes(ids, 512, 16, 32)}

    for load, ids in enumerate((a, b, a)):  # replica 0 the lighter each time
        assert r.route(req(ids), replicas([load, 9])) == 0
    assert set(r.views[0].in_flight) == in_flight(a, b)
    assert r.route(req(c), replicas([1, 9])) == 0  # one outstanding at 0: a's second routing, the newest
    assert set(r.views[0].in_flight) == in_flight(a, c)
    assert r.route(req(b), replicas([5, 9])) == 0
    assert r.route(req(d), replicas([5, 9])) == 0  # five outstanding, but a batch is 2: c's and b's
    assert set(r.views[0].in_flight) == in_flight(b, c, d) and len(r.views[0].sent) == 3


def test_kv_aware_spreads_ties():
    """At equal score and load a request goes to the replica with fewer blocks in flight, then to the one
    routed to longest ago: an idle cluster takes new prefixes in turn, where the lowest index took them all
    (one replica's cache churned while the others' stayed empty). Prompts without ids tie the same way."""
    r = make_router("kv_aware", 3, block_size=16, hash_id_block_size=512)
    assert [r.route(req([k]), replicas([0, 0, 0])) for k in range(4)] == [0, 1, 2, 0]
    assert [r.route(req(), replicas([0, 0, 0])) for _ in range(3)] == [1, 2, 0]
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512)
    assert r.route(req([1, 2]), replicas([0, 0])) == 0  # 64 blocks in flight at 0
    assert r.route(req([3]), replicas([1, 0])) == 1  # 32 at 1
    assert r.route(req([4]), replicas([1, 1])) == 1  # the less prefill in flight, though routed to last
    assert r.route(req([5]), replicas([0, 0])) == 0  # none outstanding, none in flight: routed to longest ago


def test_kv_aware_sends_a_prompt_held_nowhere_where_less_prefill_is_in_flight():
    """A prompt no replica holds waits behind the prefill queued where it goes: among the replicas within the
    lightest's count plus its square root (a count's own spread) it goes where fewer blocks are in flight, not
    to the fewer outstanding. Cache-aware routing skews the counts: the replica holding the hot prefixes takes
    many requests that bring little prefill. A prompt held somewhere keeps the count order, which evens the
    counts out and keeps histories unpriced."""
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512)
    assert r.route(req([1, 2, 3, 4]), replicas([0, 0])) == 0  # 128 blocks in flight at 0
    assert r.route(req([5]), replicas([1, 0])) == 1  # 32 at 1
    held = copy.deepcopy(r)
    assert r.route(req([6]), replicas([4, 5])) == 1  # 5 is within 4 + 2: the less prefill in flight
    assert r.route(req([7]), replicas([4, 7])) == 0  # 7 is beyond it: priced
    for i in (0, 1):
        held.replica_events(i).blocks_stored(id_block_hashes([9], 512, 16, 32))
    assert held.route(req([9, 10]), replicas([4, 5])) == 0  # cached at both: fewer outstanding


def test_kv_aware_prices_a_request_at_the_prefill_it_brings():
    """An outstanding request costs about the uncached prompt of the requests routed (a running
    mean), not a fixed 1,024 tokens: where requests bring 256 new tokens each, a 1,024-token history
    is worth three more requests at its replica, where a fixed price moved it at one."""
    r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=16)
    for k in range(400):  # 16 new blocks each, nothing shared
        r.route(req([10_000 + 16 * k + j for j in range(16)]), replicas([0, 0]))
    assert abs(r.load_tokens - 256) < 2
    history = list(range(64))  # 1,024 tokens at replica 0
    r.replica_events(0).blocks_stored(id_block_hashes(history, 16, 16, 64))
    assert r.route(req(history + [99]), replicas([3, 0])) == 0
    assert r.route(req(history + [98]), replicas([5, 0])) == 1


def test_kv_aware_prices_load_only_beyond_the_lightest_replicas_spread():
    """Outstanding requests up to the lightest replica's count plus its square root cost nothing (a count's
    own spread, which the next arrivals even out): past saturation a cached history stays where it is at a few
    requests of imbalance, where a price on every request moved it and made another replica prefill it all.
    Beyond that the price holds, and at 0 outstanding every request is priced as before."""
    history = [5, 6]  # 1,024 tokens

    def route(loads):
        """A fresh router, 1,024 tokens a request: where a turn goes whose history replica 0 caches."""
        r = make_router("kv_aware", 2, block_size=16, hash_id_block_size=512)
        r.replica_events(0).blocks_stored(id_block_hashes(history, 512, 16, 64))
        return r.route(req(history + [7]), replicas(loads))

    assert route([72, 64]) == 0  # 8 more than 64: within sqrt(64)
    assert route([74, 64]) == 1  # 10 more: 2 priced, 2,048 tokens > 1,024 cached
    assert route([2, 1]) == 0  # 1 more than 1: within sqrt(1)
    assert route([2, 0]) == 1  # none free at 0: two requests priced


def test_cluster_wires_pool_events_to_kv_aware_only(azure_conv):
    """In a run, each replica's pool reports to kv_aware, whose view ends equal to the pool's
    cache; other routers leave the pools without a sink."""
    from paged.workloads.conversations import ConversationShape, conversation_workload
    from sim import simulate

    w = conversation_workload(ConversationShape(num_conversations=30, rate=2.0, think_time_s=2.0))
    kv = simulate(w, replicas=2, router="kv_aware", num_gpu_blocks=400)
    for s in kv.schedulers:
        assert s.kv.pool.events.hashes == set(s.kv.pool.cached) and s.kv.pool.cached
    rr = simulate(w, replicas=2, router="round_robin", num_gpu_blocks=400)
    assert all(s.kv.pool.events is None for s in rr.schedulers)


def test_kv_aware_keeps_short_chats_on_their_history():
    """Many short chats (turns of ~250 new tokens on histories of ~1,000) on two replicas whose
    caches the chats overflow: at a fixed 1,024 tokens per outstanding request kv_aware split
    conversations for one request of imbalance and reached 83% of the pooled-LRU yardstick, TTFT
    p99 0.085 s against least_outstanding's 0.082 s; priced at the prefill requests bring, 90% and
    0.071 s."""
    from paged.workloads.conversations import ConversationShape, conversation_workload
    from paged.workloads.prefix_reuse import pooled_lru_hit_rate
    from sim import SimConfig, simulate

    shape = ConversationShape(num_conversations=200, rate=2.0, mean_turns=2.5, think_time_s=10,
                              system_prompt_tokens=256, user_tokens=100, output_tokens=150, max_model_len=4096)
    w = conversation_workload(shape, seed=9)
    config = SimConfig(model="llama-2-7b", hardware="a100-80gb", replicas=2, num_gpu_blocks=1024)
    kv, lo = (simulate(w, config, router=r) for r in ("kv_aware", "least_outstanding"))
    hit_rate = kv.requests.prefix_hit_tokens.sum() / kv.requests.num_prompt_tokens.sum()
    assert hit_rate >= 0.85 * pooled_lru_hit_rate(w, 2 * 1024, 16)
    assert kv.summary()["ttft_s"]["p99"] <= lo.summary()["ttft_s"]["p99"]


def test_kv_aware_claims_in_a_run_only_the_blocks_replicas_store(monkeypatch):
    """Prompts of 1,000 tokens named by 512-token trace ids end inside their second id's chunk: a
    replica stores 62 full blocks of each, and kv_aware, which claims those 62, has none in flight
    once they are stored. From the ids alone it claimed 64, and the two past the prompt's end stayed
    in flight, counted as prefill to wait behind in its tie-breaks. The prompts were also cut
    (`cap_lengths`) from 1,500 tokens: the ids of the part cut off are no claim either."""
    import numpy as np

    import sim.runner as runner
    from sim import SimConfig, Workload, simulate

    made = []
    monkeypatch.setattr(runner, "make_router", lambda *a, **k: made.append(make_router(*a, **k)) or made[-1])
    n = 6
    w = Workload(np.arange(n) * 0.001, np.full(n, 1500), np.full(n, 50), prefix_index=np.arange(n),
                 prefix_values=np.arange(3 * n), prefix_offsets=np.arange(0, 3 * n + 1, 3), hash_id_block_size=512,
                 name="partial").cap_lengths(1001)
    assert list(w.num_prompt_tokens) == [1000] * n
    r = simulate(w, SimConfig(replicas=2, router="kv_aware", num_gpu_blocks=2048, max_model_len=2048))
    assert len(r.requests) == n
    views = made[0].views
    assert sum(len(v.claims) for v in views) == 62 * n
    assert all(not v.in_flight for v in views)


def test_prefix_awares_record_is_as_long_as_each_replicas_cache_where_not_given():
    """The simulator's router and the real one (which learns the cache from the replicas' metrics)
    keep the same record: as many prefix ids as the replica's KV cache holds, unbounded while unknown."""
    from paged.core.routing import UNKNOWN_CACHE_IDS, PrefixAware

    class View:
        def __init__(self, blocks):
            self.outstanding, self.kv_usage, self.num_gpu_blocks = 0, 0.0, blocks

    one_id_a_block = PrefixAware(2, block_size=16, tokens_per_id=16)
    assert [one_id_a_block.capacity(View(b)) for b in (3, 1000, None)] == [3, 1000, UNKNOWN_CACHE_IDS]
    assert PrefixAware(2, block_size=16, tokens_per_id=512).capacity(View(64)) == 2  # Mooncake's 512-token ids
    assert PrefixAware(2, block_size=16, tokens_per_id=512).capacity(View(1)) == 1  # never none
    assert PrefixAware(2, capacity_ids=7).capacity(View(1000)) == 7  # given, it wins
    views = [View(3), View(3)]
    one_id_a_block.route(list(range(5)), views)  # 5 ids into a record of 3
    assert [len(t) for t in one_id_a_block.trees] == [3, 0]
