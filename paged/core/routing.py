"""Routing policies: which replica a new request goes to.

Pure decision code, shared by the simulator's cluster (`sim.cluster`) and the real load
balancer (`paged.serve`): both hand a router the request's chained prefix ids and a view of
each replica (`ReplicaView`), and get back an index. A router sees what a real one would see at
the moment of arrival: the requests outstanding at each replica, each replica's KV usage, and
(prefix-aware) the prefixes it has itself sent where, as SGLang's cache-aware router keeps an
approximate tree per worker rather than asking the workers; kv-aware, what each replica
reports it caches, from its KV events, as llm-d's precise prefix-cache scorer. Ties go to the
lowest replica index (kv_aware's: to the replica routed to longest ago), so routing is deterministic.
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Protocol

from .hashing import id_block_hashes
from .validation import is_number, require


class ReplicaView(Protocol):
    """What a router may read of a replica: requests routed there and not finished, the share of
    its KV cache in use (0..1; vLLM exports it as `vllm:kv_cache_usage_perc`), and its KV cache in
    blocks (vLLM exports it in `vllm:cache_config_info`; None while unknown). The size is per replica,
    since replicas on different GPUs, or with other memory budgets, hold different caches."""

    @property
    def outstanding(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...

    @property
    def num_gpu_blocks(self) -> int | None: ...


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


# vLLM's default max_num_seqs, for a router that is not told its replicas' batch size.
DEFAULT_MAX_NUM_SEQS = 256
# prefix_aware's match rate at or below which a request goes to the smallest record: SGLang router's
# and vLLM router's default `--cache-threshold`.
DEFAULT_CACHE_THRESHOLD = 0.3
# prefix_aware's record of a replica whose KV cache size is not known yet: as good as unbounded.
UNKNOWN_CACHE_IDS = 1 << 20


def balance_threshold(max_num_seqs: int) -> int:
    """prefix_aware's imbalance limit for replicas that run up to `max_num_seqs` requests at once:
    sqrt(max_num_seqs), at least 1.

    Why: a replica's outstanding count moves by itself as requests come and go, by about the
    square root of what it holds (a Poisson count's spread) when it holds a batch; an imbalance
    well inside that is noise, which following the prefix costs nothing, and one beyond it is a
    replica overloaded for real, whose queue costs more than the prefix saves. A fixed 32 (SGLang's
    absolute threshold) never triggers on replicas of 8, where a hot system prompt then piles up
    on one replica while the other idles, and triggers late on replicas of 256. In the simulator
    (`experiments/cache_aware_routing.py`, 4 replicas of 256: 16 instead of 32) this keeps the
    Mooncake result and improves the conversations: agentic hit rate 0.53 -> 0.58, TTFT p99
    8.8 s -> 1.9 s, preemptions 1,601 -> 131; chat TTFT p99 0.17 s -> 0.15 s. On deploy_check's
    replicas of 8 (threshold 3) and of 16 (4) it was within 1% of the best fixed threshold for
    E2E, uniform or Zipf-skewed system prompts, where 1 lost 2-5% and never balancing up to 3%."""
    if not (isinstance(max_num_seqs, int) and max_num_seqs >= 1):
        raise ValueError(f"balance_threshold: max_num_seqs={max_num_seqs!r}, expected an integer >= 1")
    return max(1, round(math.sqrt(max_num_seqs)))


class PrefixAware:
    """SGLang's cache-aware router (`cache_aware`; vLLM's router runs the same algorithm): per
    replica, a record of the prefixes sent there, an LRU of prefix ids about what its KV cache holds
    (`capacity_ids`, or where that is None as many ids as the replica's `num_gpu_blocks` of
    `block_size` tokens hold at `tokens_per_id` tokens an id, read from its view at each routing, so
    that the simulator's router and the real one, which learns the size from the replicas' metrics,
    keep the same record; unbounded while the size is unknown, as SGLang's tree). A request's match
    rate is the longest prefix of its ids a record holds over its ids (the router sees prefix ids,
    one per `tokens_per_id` tokens, not tokens). Above `cache_threshold` (0.3, SGLang's and vLLM
    router's default) it goes to the replica that holds that longest prefix (ties: fewer
    outstanding); at or below, to the replica whose record is smallest, the one with the most
    room in its cache (ties: fewer outstanding, then the lowest index), as SGLang's smallest tree.
    Either way, a replica with more than `balance_threshold` more outstanding requests than the
    least loaded one loses the request to the least loaded (as do requests without prefix ids).

    Why: where every request shares a system prompt (agentic traffic), every request matches
    something, and following any match sent a new conversation where the prompt was until the
    balance threshold tripped, so a replica the warm-up did not recruit stayed idle for the whole
    run; a first turn of 10-30k tokens whose only match is the 2k-token prompt matches under 0.3 of
    its ids, and the smallest record, an idle replica, takes it. `experiments/cache_aware_routing.py`
    (4 replicas), share of the pooled-LRU yardstick: agentic 90.1% -> 91.4% (TTFT p99 1.88 s -> 0.48 s),
    over workload seeds 3-6 69-88% on 2 or 4 replicas -> 92-93% on 4 (TTFT p99 2.1-2.7 s -> 0.37-0.45 s);
    chat 82.7% (a replica idle) -> 95.9%; Mooncake 91.9% -> 91.5%. The threshold on imbalance scales
    with the replicas' batch (`balance_threshold(max_num_seqs)`), where SGLang's is a fixed absolute
    and relative one."""

    name = "prefix_aware"

    def __init__(self, num_replicas: int, capacity_ids: int | None = None,
                 max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
                 block_size: int = 16, tokens_per_id: int = 16) -> None:
        require(is_number(cache_threshold) and 0 <= cache_threshold <= 1, "PrefixAware", "cache_threshold",
                cache_threshold, "a number in [0, 1]")
        self.trees: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]
        self.capacity_ids = capacity_ids
        self.block_size, self.tokens_per_id = block_size, tokens_per_id
        self.balance_threshold = balance_threshold(max_num_seqs)
        self.cache_threshold = float(cache_threshold)

    def capacity(self, replica: ReplicaView) -> int:
        """How many prefix ids the record of `replica` keeps."""
        if self.capacity_ids is not None:
            return self.capacity_ids
        blocks = replica.num_gpu_blocks
        return UNKNOWN_CACHE_IDS if blocks is None else max(1, blocks * self.block_size // self.tokens_per_id)

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
        if best_len <= self.cache_threshold * len(keys):
            best = min(range(len(replicas)), key=lambda i: (len(self.trees[i]), replicas[i].outstanding))
        lightest = least_outstanding(replicas)
        if replicas[best].outstanding - replicas[lightest].outstanding > self.balance_threshold:
            best = lightest
        tree = self.trees[best]
        for key in keys:
            tree[key] = None
            tree.move_to_end(key)
        capacity = self.capacity(replicas[best])
        while len(tree) > capacity:
            tree.popitem(last=False)
        return best


# ReplicaCacheView.claims's size below which it is never purged of expired claims.
MIN_COMPACT = 4096


class ReplicaCacheView:
    """One replica's cached block hashes as its KV events report them (a `block_pool.KVEvents`
    sink): after every event `hashes` equals the set of hashes the replica's pool caches.

    What the router sent the replica, for its newest routings (`sent`: their numbers; `expire`
    keeps at most as many as the replica has outstanding requests): `claimed`, every block of their
    prompts, cached when sent or not, counted as cached there (the replica holds them while those
    requests run, and computes again any its cache evicts while they wait); `in_flight`, those it
    did not cache when sent and has not reported stored since (the prefill still to do there; hash
    -> number of the routing that last sent it). A stored block leaves `in_flight`, so the two
    never share a hash; it stays claimed."""

    __slots__ = ("hashes", "claims", "oldest", "compact_at", "in_flight", "sent")

    def __init__(self) -> None:
        self.hashes: set = set()
        # hash -> number of the routing that last sent it; those below `oldest` expired. Updated a
        # routing at a time in C and purged in bulk once it doubled: keeping it ordered, block by block
        # as `in_flight`, made Mooncake's routing 70% slower (prompts of hundreds of blocks, most cached)
        self.claims: dict = {}
        self.oldest = 0
        self.compact_at = MIN_COMPACT
        # ordered by routing, and expired from the front: an OrderedDict drops its first key in O(1), where
        # a dict's next(iter()) walks past every key deleted before it (20k expiries of 200k: 0.22 s, not 8 ms)
        self.in_flight: OrderedDict = OrderedDict()
        self.sent: deque[int] = deque()

    @property
    def claimed(self) -> set:
        oldest = self.oldest
        return {h for h, routing in self.claims.items() if routing >= oldest}

    def blocks_stored(self, block_hashes) -> None:
        self.hashes.update(block_hashes)
        in_flight = self.in_flight
        if in_flight:
            for h in block_hashes:
                in_flight.pop(h, None)

    def blocks_removed(self, block_hashes) -> None:
        self.hashes.difference_update(block_hashes)

    def all_blocks_cleared(self) -> None:
        """A reset, or a replica restarted: what was sent there is gone too."""
        self.hashes.clear()
        self.claims.clear()
        self.in_flight.clear()
        self.sent.clear()

    def holds(self, block_hash) -> bool:
        return block_hash in self.hashes or self.claims.get(block_hash, -1) >= self.oldest

    def expire(self, keep: int) -> None:
        """Keeps the blocks of the newest `keep` routings: the older ones' requests finished, as far
        as the router can tell (first come, first served), or their blocks are not worth a request
        ahead."""
        sent = self.sent
        while len(sent) > keep:
            sent.popleft()
        in_flight = self.in_flight
        if not sent:
            self.claims.clear()
            in_flight.clear()
            return
        oldest = self.oldest = sent[0]
        while in_flight:
            h = next(iter(in_flight))
            if in_flight[h] >= oldest:
                break
            del in_flight[h]

    def send(self, routing: int, block_hashes) -> None:
        """Routing number `routing` sent a request with these blocks here: all are claimed by it from
        then on, and those not cached are in flight, those in flight already included (the request
        computes them too, if an earlier one does not first)."""
        self.sent.append(routing)
        claims = self.claims
        claims.update(dict.fromkeys(block_hashes, routing))
        if len(claims) > self.compact_at:
            oldest = self.oldest
            claims = self.claims = {h: r for h, r in claims.items() if r >= oldest}
            self.compact_at = max(MIN_COMPACT, 2 * len(claims))
        in_flight, cached = self.in_flight, self.hashes
        for h in block_hashes:
            if h not in cached:
                in_flight[h] = routing
                in_flight.move_to_end(h)  # sent again: the dict stays ordered by routing


# kv_aware's price of an outstanding request before it has measured any, and its most.
MAX_LOAD_TOKENS = 1024


class KVAware:
    """Route by what the replicas really cache, as llm-d's precise prefix-cache scorer does: each
    replica publishes KV events (block hashes stored, removed, all cleared) to
    `replica_events(i)`, so the router's view is the replica's cache, evictions included. A
    request goes to the replica with the best score = its prompt's cached prefix in tokens minus
    a price per outstanding request beyond the spread of the lightest replica's count (ties: fewer
    outstanding, or for a prompt no replica holds fewer beyond that spread, then less prefill in
    flight, then the replica routed to longest ago).

    Both terms are prefill tokens: a cached prefix is prefill the replica skips, and an
    outstanding request is prefill the replica does ahead of this one (or did), about the
    uncached part of a prompt the router sends. The router measures that (`load_tokens`: the
    running mean over about the last `LOAD_MEAN_WINDOW` requests it routed) and prices a
    request at it, up to `MAX_LOAD_TOKENS` (1,024). A fixed 1,024 was too dear where turns
    bring a few hundred new tokens to a history of a thousand or two: one more request
    outweighed a conversation's whole history, conversations were split across replicas and
    their caches duplicated (probe grid, 25 setups: 8 A100s with short chats 74% of the
    pooled-LRU yardstick, now 87%; 8 H200s with chats in tight caches 84% -> 91%). Above 1,024
    the measured price loses the cache for nothing: where prompts bring thousands of new tokens
    (Mooncake at low load) an outstanding request is mostly decoding, its prefill done, and
    pricing it at its whole prompt made kv_aware least_outstanding (73% of the yardstick
    instead of 103%, TTFT p99 the same).

    Load is priced only beyond the noise: a replica's outstanding count moves by itself by about
    the square root of what it holds (a Poisson count's spread; `balance_threshold` uses the same
    fact), so only the requests a replica has above the lightest's count plus its square root are
    priced. At low load that is nearly every request (none free at 0 outstanding, about one at 1
    to 3), so the rule keeps its meaning. Past saturation two replicas of 60 outstanding differ by
    1 to 4 requests, which the next arrivals even out; pricing them moved turns off their history,
    made the other replica prefill all of it, and the misses raised the price (uncached prefill per
    request) that moved the next turns. Chat on 2 A100s past saturation (probe grid): 88 of 748
    follow-up turns moved off a cached history, 80.5% of the pooled-LRU yardstick; priced beyond
    the spread, none and 84.2% (TTFT p99 59.4 s -> 57.3 s, least_outstanding 62.4 s; four more
    seeds 78.6-82.9% -> 77.9-83.8%); the other setups' hit rates within a point or up to 4.5 points
    higher (short chats on 8 A100s 88% -> 93%), TTFT p99 still under least_outstanding's wherever
    it was, if closer (Mooncake on 4 H100s 1.23 s -> 1.76 s, least_outstanding 1.77 s; agentic on
    4 A100s 2.7 s -> 4.5 s, 15.4 s). `experiments/cache_aware_routing.py`: chat
    91% -> 96%, agentic 95% -> 96% (TTFT p99 0.44 s -> 0.51 s, least_outstanding 0.93 s).
    Pricing the prefill queued at each replica (its blocks in flight) instead of its outstanding
    requests reached 79.0% there: past saturation the queues' prefill differs by thousands of
    tokens from one arrival to the next, more than a history.

    Blocks in flight count as cached: a request's blocks that its replica does not cache yet
    count as cached there from the moment the router sends it until the replica reports them
    stored (`ReplicaCacheView.in_flight`), for the replica's newest routings, as many as it has
    outstanding requests and at most `max_num_seqs`. Without that, a conversation's next turn
    that arrives before its replica has prefilled the last one (or, behind a real router, before
    the replica's events arrive: `paged router` polls them every 0.25 s), or a conversation
    sharing its system prompt, sees no history anywhere and goes where the load is least,
    splitting what could be shared. In the simulator, whose events arrive at once (probe grid):
    2 H100s with heavy chat, TTFT p99 0.143 s -> 0.133 s (least_outstanding 0.136 s); 2 A100s
    past saturation, 72% -> 81% of the pooled-LRU yardstick; no setup a point lower, TTFT p99
    at most 25% up (agentic on 4 A100s: 1.85 s -> 2.28 s, least_outstanding 15.4 s).

    Blocks claimed count as cached too: every block of the requests those routings sent, cached
    there when sent or not (`ReplicaCacheView.claimed`). Past saturation a request waits tens of
    seconds while its replica's cache churns, and may find the history it was sent for evicted
    when it starts: it computes it again there. Counting only what the replica reported, its
    conversation's next turn, arriving meanwhile, saw nothing there and went elsewhere, where the
    history was computed once more (chat on 2 A100s past saturation, seed 1: 36 of 765 follow-up
    turns moved while the turn before waited; claimed, 6). Claimed, 81.5% -> 85.5% of the
    pooled-LRU yardstick there; seven seeds 79.2-89.2% -> 82.1-90.0%, none lower, TTFT p99 within
    10% either way (least_outstanding's 12-23% above); the probe grid's other 29 setups within 0.6
    points (agentic on 4 A100s: TTFT p99 4.5 s -> 1.6 s). `experiments/cache_aware_routing.py`:
    agentic 96.1% -> 96.7%, TTFT p99 0.51 s -> 0.47 s (preemptions 31 -> 141); Mooncake and chat
    the same.

    Except blocks in flight while a replica is idle: a request sharing them would wait behind their
    prefill at the replica they were sent to, where the idle one could start it at once. An 8k-token
    system prompt on 8 H200s (probe grid): a request spilt from the two replicas caching the prompt to an
    idle one, which computed it cold (0.27 s), and the next ones, seeing it in flight there, queued behind
    that prefill (seed 51: TTFT p99 0.252 s, least_outstanding 0.145 s). Counted as not cached while a
    replica is idle, five seeds' TTFT p99 0.165/0.151/0.166/0.111/0.252 s -> 0.136/0.108/0.090/0.103/0.115 s,
    all under least_outstanding's (0.146/0.158/0.165/0.138/0.145 s), hit rates the same. Past saturation
    no replica is idle and nothing changes (chat on 2 A100s, five seeds identical); history claimed and
    evicted still counts (it was cached when sent: not in flight). Elsewhere on the probe grid hit rates
    within 0.6 points, TTFT p99 the same or up to 2x (agentic bursts on 8 H200s 0.25 s -> 0.55 s,
    least_outstanding 1.0 s; agentic on 4 A100s 1.60 s -> 1.71 s).

    Nor, while a replica is idle, what a replica caches where the request would wait for memory: one whose
    blocks in use (`kv_usage`), prefill in flight and the request's blocks (those its outstanding requests
    claim counted once: held or in flight there already) overflow its KV cache (`num_gpu_blocks`) starts it
    only once whole requests there finish, a wait of their decoding that the cached prefix does not shorten,
    where the idle one starts it at once (its load is still priced). Past saturation no replica is idle and
    nothing changes (`chat_past_saturation.py`: every row identical). `cache_aware_routing.AGENTIC` with an
    8k-token system prompt on 8 H200s of 2,048 blocks, turns of 10-30k tokens (two fill a replica): the
    prompt's 8,192 cached tokens outweighed 8 outstanding requests, so the five replicas that first cached it
    took every turn while three idled, turns queued there for memory (seed 11: the slowest 1% took 1.4 s, half
    of it queued; 55-522 preemptions a seed) and their histories were evicted. Seeds 11/21/31/41/51: TTFT p99
    0.72/1.74/1.19/1.45/1.31 s -> 0.395/0.397/0.405/0.392/0.426 s, least_outstanding 0.406/0.467/0.444/0.400/0.462 s;
    84.8/82.6/82.8/81.3/82.1% of the pooled-LRU yardstick -> 84.4/88.1/89.9/85.6/87.4%; 0-3 preemptions. With
    each of 20 bursts (mean gap 20 s) of 16 such conversations sharing an 8k-token prefix of its own: 92.7/93.5/
    95.4/94.9/94.5% -> 91.6/91.0/91.2/90.4/91.4%, TTFT p99 6.72/4.27/8.03/3.02/4.87 s -> 7.04/4.02/5.55/3.00/4.77 s
    (least_outstanding 20-110 s). Tried: the request's cached blocks counted as needed too (a router cannot
    tell those running requests hold from those the cache keeps free): the first setup 88.8-89.6%, TTFT p99
    0.37-0.42 s, but each burst's prefix computed again on idle replicas, 84.8-89.4% and up to 8.7 s there;
    the request's size estimated as the replica's mean (`kv_usage` over its outstanding requests, no cache
    size) missed the turns sent before the first showed in `kv_usage` (0.40-0.48 s, 84.5-87.0%); the rule
    while any replica had room, not only while one is idle (cached blocks counted as needed), moved chat past
    saturation -1.3 to +3.0 points a seed (a replica has room now and then) and `cache_aware_routing.py`'s
    agentic trace to 91.1%.

    Nor, while a replica is idle and a cache has room for the request, all of what a full one caches: the
    blocks the request would store where the cache is full evict as many cached ones (history a later turn
    would hit), where a cache with room evicts nothing, so they count against the cached prefix there. Room
    is the KV cache (`num_gpu_blocks`) less the blocks in flight to the replica and those it caches or its
    requests hold (at least `kv_usage`'s share); a full cache stays full, blocks leaving it only to be
    reused, so once every cache has filled nothing changes, and past saturation, where a replica is seldom
    idle, hardly anything (`chat_past_saturation.py`: seed 5 under FCFS 87.8% -> 88.3%, the rest as before).
    The same AGENTIC setup, after the memory rule: a cached 8k-token prompt outweighed all a turn brings anew, its
    history evicted meanwhile included, so the replicas that cached the prompt first kept every turn and the
    others' caches stayed empty, three of eight on seed 11 (two on seeds 21, 41, 51; none on 31): a pooled
    cache a quarter to three eighths short, and the hit rate with it (seed 11 84.4% of the yardstick, seed
    31 89.9%). A turn bringing more than the prompt saves now goes to an empty cache, which then holds the
    prompt and draws turns as the others do: seeds 11/21/31/41/51 84.4/88.1/89.9/85.6/87.4% ->
    93.8/93.5/93.6/93.3/93.2%, TTFT p99 0.395/0.397/0.405/0.392/0.426 s -> 0.314/0.368/0.377/0.341/0.388 s
    (least_outstanding 0.406/0.467/0.444/0.400/0.462 s). Bursts of 16 such conversations sharing an 8k-token
    prefix of their own: 92.5/90.7/91.6/90.8/92.1% -> 91.9/90.3/91.8/90.5/91.0%, TTFT p99 7.9/2.1/4.4/2.6/4.8 s
    -> 12.0/2.3/6.0/2.0/4.9 s (least_outstanding 14-98 s). `cache_aware_routing.py`, where it decides only
    while the caches fill and where one has a few blocks free: 98.6/96.2/95.7% -> 97.8/95.7/96.6% (events read
    every 0.25 s: 96.6/95.4/95.6% -> 99.8/96.3/97.0%), TTFT p99 3.12/0.13/0.49 s -> 3.12/0.13/0.43 s.

    Ties spread: at equal score and load the lowest index used to win, and on an idle cluster
    (every replica at 0 outstanding, a prompt no replica holds) every new prefix went to replica
    0, whose cache churned while the others' stayed empty: Mooncake stretched 4x on 8 H200s sent
    160 of 400 requests to replica 0 and none to replica 7, and caught 66% of the pooled-LRU
    yardstick. A tie goes first to the replica with fewer blocks in flight (prefill sent and not
    done: the work a new request waits behind), then to the one routed to longest ago, so an idle
    cluster takes new prefixes in turn and its caches fill evenly, as one pooled cache's would
    (that setup: 50 requests on each replica, 114% of the yardstick; Mooncake on 4 H100s unstretched,
    TTFT p99 1.79 s -> 1.23 s, least_outstanding 1.77 s; `experiments/cache_aware_routing.py`'s
    Mooncake 95% -> 98%, TTFT p99 3.66 s -> 3.20 s).

    A prompt no replica holds (its first block neither cached nor claimed anywhere) goes, among the
    replicas within the lightest's count plus its square root, to the one with the least prefill in
    flight, not the fewest outstanding: it waits behind that prefill wherever it goes, and within the
    spread a count is noise. Cache-aware routing skews the counts besides: the replica holding the hot
    prefixes takes many requests that bring little prefill, so the one with fewer outstanding often has
    more queued. Mooncake capped at 4,096 tokens on 2 A100s (windows of 400 requests at 2.5x, 3x and
    3.5x its rate): kv_aware's TTFT p99 above least_outstanding's in 3 of 9 (1.97 s against 1.55 s),
    none since (that one 1.26 s); on 4 A100s (5x-7x) 4 of 9, none since; hit rates the same. A prompt
    held somewhere keeps the count order: past saturation it evens the counts out, which keeps turns'
    histories unpriced (ordering every tie by prefill in flight lost chat on 2 A100s past saturation up
    to 4.8 points of the yardstick on 5 of 7 seeds); there, and wherever prompts share a system prompt,
    nothing changes.

    Interface for a real load balancer: call `replica_events(i).blocks_stored(hashes)` (and
    `blocks_removed`, `all_blocks_cleared`) as replica i's events arrive, with the hashes its
    `BlockPool` registers (`paged.core.hashing`: chained BLAKE2b of the block's tokens, or of
    trace hash ids), and `route_hashes` with a request's block hashes; `route` takes trace
    prefix ids and hashes them as the replicas will. It reads each replica's `num_gpu_blocks` from its view
    (`paged router` scrapes it from `vllm:cache_config_info`, or is told by `--num-gpu-blocks`) to tell when
    a request would wait for memory; a replica whose size is unknown is full only at 100% usage."""

    name = "kv_aware"
    LOAD_MEAN_WINDOW = 64  # requests: smooths prompts' spread, follows a change of traffic within seconds

    def __init__(self, num_replicas: int, block_size: int = 16, hash_id_block_size: int = 512,
                 load_tokens: float = MAX_LOAD_TOKENS, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> None:
        """`load_tokens`: the first estimate of an outstanding request's prefill; `max_num_seqs`:
        the most routings per replica whose blocks count in flight (a batch)."""
        if not (isinstance(max_num_seqs, int) and max_num_seqs >= 1):
            raise ValueError(f"KVAware: max_num_seqs={max_num_seqs!r}, expected an integer >= 1")
        self.views = [ReplicaCacheView() for _ in range(num_replicas)]
        self.block_size = block_size
        self.hash_id_block_size = hash_id_block_size
        self.load_tokens = float(load_tokens)
        self.max_num_seqs = max_num_seqs
        self.num_routed = 0
        self.last_routed = [-1] * num_replicas  # per replica, the number of its latest routing (-1: none yet)

    def replica_events(self, index: int) -> ReplicaCacheView:
        return self.views[index]

    def route(self, prefix_ids, replicas) -> int:
        """The replica for a request whose prompt has these trace prefix ids, hashed as the replicas
        will. It claims every block the ids name: a prompt that ends inside its last id's chunk
        should come through `route_hashes` with its full blocks' hashes, as the simulator's cluster
        sends them, or the rest of the chunk stays in flight until it expires."""
        if not prefix_ids:
            self._expire(replicas)
            best = max(range(len(replicas)), key=lambda i: self._load_key(i, replicas[i].outstanding))
            self._send(best, ())
            return best
        total = len(prefix_ids) * self.hash_id_block_size // self.block_size
        return self.route_hashes(id_block_hashes(prefix_ids, self.hash_id_block_size, self.block_size, total),
                                 replicas)

    def route_hashes(self, block_hashes, replicas) -> int:
        """The replica for a request whose prompt's full blocks have these hashes, in order."""
        self._expire(replicas)
        best = self._choose(block_hashes, len(block_hashes), replicas)
        self._send(best, block_hashes)
        return best

    def _expire(self, replicas) -> None:
        for view, replica in zip(self.views, replicas):
            view.expire(min(replica.outstanding, self.max_num_seqs))

    def _send(self, index: int, block_hashes) -> None:
        self.views[index].send(self.num_routed, block_hashes)
        self.last_routed[index] = self.num_routed
        self.num_routed += 1

    def _load_key(self, index: int, load: float) -> tuple:
        """Larger is lighter: fewer outstanding requests (or, for a prompt held nowhere, fewer beyond the
        lightest's spread), then fewer blocks in flight, then routed to longer ago."""
        return -load, -len(self.views[index].in_flight), -self.last_routed[index]

    def _full(self, replica, new_blocks: int) -> bool:
        """Whether the replica's blocks in use and `new_blocks` more (its prefill in flight, and the request's
        blocks that its outstanding requests do not claim) exceed its KV cache (`num_gpu_blocks`; while unknown,
        full only at 100% usage): a request waits there for memory."""
        if replica.outstanding == 0:
            return False
        num_gpu_blocks = replica.num_gpu_blocks
        if num_gpu_blocks is None:
            return replica.kv_usage >= 1
        return replica.kv_usage + new_blocks / num_gpu_blocks > 1

    @staticmethod
    def _evicts(view: ReplicaCacheView, replica, new_blocks: int) -> int:
        """How many cached blocks the replica evicts to store `new_blocks` more: those beyond its empty room, its
        KV cache less the blocks in flight to it and those it caches or its requests hold (at least as many as
        either; unknown size: none)."""
        num_gpu_blocks = replica.num_gpu_blocks
        if num_gpu_blocks is None:
            return 0
        taken = max(len(view.hashes), replica.kv_usage * num_gpu_blocks) + len(view.in_flight)
        return max(0, new_blocks - max(0, num_gpu_blocks - taken))

    def _choose(self, block_hashes, num_blocks: int, replicas) -> int:
        """The best replica. `block_hashes`: the first of the prompt's
        `num_blocks` blocks, at least as many as any replica holds."""
        best, best_key, best_run = 0, None, 0
        price = min(self.load_tokens, MAX_LOAD_TOKENS)
        lightest = min(replica.outstanding for replica in replicas)
        even = lightest + math.sqrt(lightest)  # as loaded as the lightest, within its count's own spread
        idle = lightest == 0  # a replica could start the request at once: prefill in flight is a wait
        # held nowhere: within the spread, the prefill in flight (the wait) ranks replicas, not the count
        cold = len(block_hashes) > 0 and not any(v.holds(block_hashes[0]) for v in self.views)
        rows = []
        for view in self.views:
            cached, claims, oldest, in_flight = view.hashes, view.claims, view.oldest, view.in_flight
            m = waits = shared = 0  # blocks held; of them, while a replica is idle, those in flight (that would
            for h in block_hashes:  # only be waited for), and those claimed (held or in flight there already)
                if h not in cached:
                    if claims.get(h, -1) < oldest:
                        break
                    if idle:
                        waits += h in in_flight
                        shared += 1
                elif idle and claims.get(h, -1) >= oldest:
                    shared += 1
                m += 1
            rows.append((m, waits, shared))
        evicts = [0] * len(rows)
        if idle:  # and a cache has room for the request: what a full one would evict to store it counts
            need = [self._evicts(view, replica, num_blocks - row[0])
                    for view, replica, row in zip(self.views, replicas, rows)]
            if min(need) == 0:
                evicts = need
        for i, (m, waits, shared) in enumerate(rows):
            excess = max(0.0, replicas[i].outstanding - even)
            # while a replica is idle, one where the request would wait for memory saves it nothing
            full = idle and self._full(replicas[i], len(self.views[i].in_flight) + num_blocks - shared)
            saved = 0 if full else m - waits - evicts[i]
            key = (saved * self.block_size - price * excess,
                   *self._load_key(i, excess if cold else replicas[i].outstanding))
            if best_key is None or key > best_key:
                best, best_key, best_run = i, key, m
        self.load_tokens += ((num_blocks - best_run) * self.block_size - self.load_tokens) / self.LOAD_MEAN_WINDOW
        return best


ROUTER_CLASSES = {r.name: r for r in (RoundRobin, LeastOutstanding, LeastKVUsage, PrefixAware, KVAware)}


ROUTERS = tuple(ROUTER_CLASSES)


def make_router(name: str, num_replicas: int, capacity_ids: int | None = None, block_size: int = 16,
                hash_id_block_size: int = 512, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                cache_threshold: float = DEFAULT_CACHE_THRESHOLD) -> Router:
    """`capacity_ids`: prefix_aware's record per replica (None: what each replica's cache holds, from its
    view); `cache_threshold`: prefix_aware's match rate
    at or below which a request goes to the smallest record; `max_num_seqs`: the replicas' batch,
    which sizes prefix_aware's imbalance limit and kv_aware's record of blocks in flight; `block_size`
    and `hash_id_block_size`: how kv_aware names a request's blocks (as the replicas' pools do). kv_aware
    reads each replica's KV cache size from its view (`ReplicaView.num_gpu_blocks`)."""
    if name not in ROUTER_CLASSES:
        raise ValueError(f"unknown router {name!r}: known are {sorted(ROUTER_CLASSES)}")
    if name == "prefix_aware":
        return PrefixAware(num_replicas, capacity_ids, max_num_seqs, cache_threshold, block_size, hash_id_block_size)
    if name == "kv_aware":
        return KVAware(num_replicas, block_size, hash_id_block_size, max_num_seqs=max_num_seqs)
    return ROUTER_CLASSES[name](num_replicas)
