"""kv_aware's view of each replica is that replica's pool, event by event: whatever the pools
do (allocate, cache, hit, free, evict, churn, reset), after every step the set of hashes the router
holds for replica i equals the hashes replica i's pool caches, and routing picks the best score
computed from the pools themselves plus the blocks claimed, at the price per outstanding
request the router has learnt, for the requests beyond the lightest replica's count plus its
square root (while a replica is idle, the blocks still in flight at another count there as
not cached, and none at a replica whose blocks in use, in flight and the request's that its routings
do not claim would overflow its cache, of the size its view reports: unknown, full at 100% usage; and,
while a cache has room for the blocks the request would store there, those a replica would evict to store
them count against what it caches);
ties go to fewer outstanding (for a prompt
no replica holds, fewer beyond that spread), then fewer blocks in flight, then the replica routed to
longest ago. The model keeps its own record of
what was sent where: per replica, for the newest `min(outstanding, MAX_NUM_SEQS)` routings as of each
routing, each routing's blocks (claimed: held there whatever the pool evicts since) and those of them
the pool did not cache (in flight: leaving the record once the pool caches them), both gone on a reset;
and the number of its latest routing.
Prompts routed before come back, computed by a pool or extended (a conversation's next turn), and the
views purge expired claims at every chance (`MIN_COMPACT` lowered)."""
import math
from types import SimpleNamespace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from paged.core import routing
from paged.core.block_pool import BlockPool
from paged.core.routing import MAX_LOAD_TOKENS, MIN_COMPACT, KVAware

NUM_BLOCKS = 4
MAX_NUM_SEQS = 2
HASHES = st.lists(st.integers(0, 11), min_size=1, max_size=4)
LOAD = st.integers(0, 9) | st.just(0)  # an idle replica often: blocks in flight elsewhere count as not cached
LOADS = st.tuples(LOAD, LOAD)
USAGE = st.sampled_from([0.0, 0.25, 0.5, 1.0])  # KV usage: the request fits, or would wait for memory
USAGES = st.tuples(USAGE, USAGE)
SIZE = st.sampled_from([NUM_BLOCKS, 2 * NUM_BLOCKS, None])  # the cache each replica's view reports (None: unknown)
SIZES = st.tuples(SIZE, SIZE)


class KVEventsMachine(RuleBasedStateMachine):
    PROMPTS = Bundle("prompts")

    def __init__(self) -> None:
        super().__init__()
        routing.MIN_COMPACT = 2  # the views purge expired claims all the time (restored in teardown)
        self.router = KVAware(2, block_size=1, load_tokens=2, max_num_seqs=MAX_NUM_SEQS)
        self.pools = [BlockPool(NUM_BLOCKS) for _ in range(2)]
        for i, pool in enumerate(self.pools):
            pool.events = self.router.replica_events(i)
        self.held = [[], []]  # blocks each pool has handed out and not freed
        self.sent = [[], []]  # per replica, oldest first: each kept routing's (blocks, blocks not cached yet)
        self.last = [-1, -1]  # per replica, the number of its latest routing
        self.num_routed = 0

    def forget_cached(self, r):
        for _, uncached in self.sent[r]:
            uncached.difference_update(self.pools[r].cached)

    def claimed(self, r) -> set:
        return set().union(*(blocks for blocks, _ in self.sent[r]))

    def in_flight(self, r) -> set:
        return set().union(*(uncached for _, uncached in self.sent[r]))

    @rule(r=st.integers(0, 1), hashes=HASHES)
    def fill(self, r, hashes):
        """A prompt's blocks: allocated (evicting cached ones when no plain block is left), then cached."""
        pool = self.pools[r]
        if len(hashes) <= pool.num_free_blocks:
            blocks = pool.allocate_n(len(hashes))
            self.held[r].extend(blocks)
            pool.cache(blocks, hashes)
            self.forget_cached(r)

    @rule(r=st.integers(0, 1), prompt=PROMPTS)
    def compute(self, r, prompt):
        """A prompt routed before, computed (by the replica it was sent to, or another)."""
        self.fill(r, prompt)

    @rule(r=st.integers(0, 1), hashes=HASHES)
    def hit(self, r, hashes):
        pool = self.pools[r]
        hits = [b for b in (pool.get_cached(h) for h in hashes) if b is not None]
        pool.touch(hits)
        self.held[r].extend(hits)

    @precondition(lambda self: self.held[0] or self.held[1])
    @rule(r=st.integers(0, 1), k=st.integers(1, 4))
    def free(self, r, k):
        blocks, self.held[r] = self.held[r][-k:], self.held[r][:-k]
        self.pools[r].free(reversed(blocks))

    @rule(r=st.integers(0, 1))
    def churn(self, r):
        """Every free block handed out (evicting what it cached) and given back empty: the cache keeps only
        what is held, as under pressure while requests wait."""
        pool = self.pools[r]
        blocks = pool.allocate_n(pool.num_free_blocks)
        pool.free(reversed(blocks))

    @rule(r=st.integers(0, 1))
    def reset(self, r):
        if not self.held[r]:
            self.pools[r].reset_prefix_cache()
            self.sent[r] = []

    @rule(target=PROMPTS, hashes=HASHES, loads=LOADS, usages=USAGES, sizes=SIZES)
    def route(self, hashes, loads, usages, sizes):
        self.check_route(hashes, loads, usages, sizes)
        return hashes

    @rule(target=PROMPTS, prompt=PROMPTS, more=st.lists(st.integers(0, 11), max_size=2), loads=LOADS,
          usages=USAGES, sizes=SIZES)
    def follow_up(self, prompt, more, loads, usages, sizes):
        """A prompt routed before, extended: a conversation's next turn."""
        self.check_route(prompt + more, loads, usages, sizes)
        return prompt + more

    def check_route(self, hashes, loads, usages, sizes):
        replicas = [SimpleNamespace(outstanding=o, kv_usage=u, num_gpu_blocks=n)
                    for o, u, n in zip(loads, usages, sizes)]
        price = min(self.router.load_tokens, MAX_LOAD_TOKENS)  # what an outstanding request costs now
        got = self.router.route_hashes(hashes, replicas)
        for r, load in enumerate(loads):  # only the newest routings can still be in flight
            keep = min(load, MAX_NUM_SEQS)
            self.sent[r] = self.sent[r][-keep:] if keep else []

        def run(i):
            held = self.pools[i].cached.keys() | self.claimed(i)
            return next((k for k, h in enumerate(hashes) if h not in held), len(hashes))

        even = min(loads) + math.sqrt(min(loads))  # the lightest's count and its spread: not priced

        def waits(i):
            """While a replica is idle, blocks of the run still in flight are a prefill to wait behind: no hit."""
            return sum(h in self.in_flight(i) for h in hashes[:run(i)]) if min(loads) == 0 else 0

        cold = not any(run(i) for i in range(2))  # held nowhere: within the spread, the count is no tie-break

        def full(i):
            """While a replica is idle, whether the request would wait for memory at replica i: what is in use,
            in flight and its own blocks overflow the cache (of unknown size: 100% in use)."""
            shared = sum(h in self.claimed(i) for h in hashes[:run(i)])  # held or in flight there already
            new = len(self.in_flight(i)) + len(hashes) - shared
            over = usages[i] >= 1 if sizes[i] is None else usages[i] + new / sizes[i] > 1
            return min(loads) == 0 and loads[i] > 0 and over

        def evicts(i):
            """The cached blocks replica i evicts to store the request's blocks it does not hold: those beyond its
            empty room (its cache less what is in flight to it and what it caches or holds; unknown size: none)."""
            if sizes[i] is None:
                return 0
            taken = max(len(self.pools[i].cached), usages[i] * sizes[i]) + len(self.in_flight(i))
            return max(0, len(hashes) - run(i) - max(0, sizes[i] - taken))

        # while a replica is idle and a cache has room for the request, what a full one would evict counts
        room = min(loads) == 0 and min(evicts(i) for i in range(2)) == 0

        def score(i):
            excess = max(0.0, loads[i] - even)
            saved = 0 if full(i) else run(i) - waits(i) - (evicts(i) if room else 0)
            return (saved - price * excess, -(excess if cold else loads[i]), -len(self.in_flight(i)),
                    -self.last[i], -i)

        want = max(range(2), key=score)
        assert got == want
        self.sent[want].append((set(hashes), {h for h in hashes if h not in self.pools[want].cached}))
        self.last[want] = self.num_routed
        self.num_routed += 1

    def teardown(self):
        routing.MIN_COMPACT = MIN_COMPACT

    @invariant()
    def view_equals_pool(self):
        for i, pool in enumerate(self.pools):
            assert self.router.views[i].hashes == set(pool.cached)

    @invariant()
    def records_equal_what_was_sent(self):
        for i in range(2):
            assert set(self.router.views[i].claimed) == self.claimed(i)
            assert set(self.router.views[i].in_flight) == self.in_flight(i)
            assert len(self.router.views[i].sent) <= MAX_NUM_SEQS + 1


TestKVEvents = KVEventsMachine.TestCase
# A claim shows only after a run of steps (a prompt cached or computed, sent, evicted, sent again): more
# runs than the profile's 25 find one
TestKVEvents.settings = settings(max_examples=max(200, settings().max_examples))
