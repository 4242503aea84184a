"""prefix_aware routes as SGLang's cache-aware router, whatever the prompts and loads: a request whose
longest recorded prefix is above `cache_threshold` of its prefix ids goes to a replica holding that
longest prefix (ties: fewer outstanding, then the lowest index); at or below, to a replica whose record
is smallest (ties: fewer outstanding, then the lowest index); in both cases, unless that replica has
more than `balance_threshold` outstanding requests above the least loaded, which then takes it. The
model keeps each replica's record as what was sent there: every prefix of every prompt sent, in an
LRU of `CAPACITY` prefixes, and after every step the router's records are as large as the model's.
Prompts come back extended (a conversation's next turn) and share their first ids (a system prompt),
and the threshold is drawn from its edges (0, 1) and SGLang's and vLLM router's default."""
from collections import OrderedDict
from types import SimpleNamespace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from paged.core.routing import PrefixAware

NUM_REPLICAS = 3
CAPACITY = 6  # prefixes per record: records fill up and evict, and their sizes tie
MAX_NUM_SEQS = 4  # balance threshold 2
IDS = st.lists(st.integers(0, 3), min_size=1, max_size=6)
LOADS = st.tuples(*[st.integers(0, 5)] * NUM_REPLICAS)


class PrefixAwareMachine(RuleBasedStateMachine):
    PROMPTS = Bundle("prompts")

    @initialize(threshold=st.sampled_from([0.0, 0.3, 0.3, 0.5, 1.0]))
    def start(self, threshold):
        self.router = PrefixAware(NUM_REPLICAS, CAPACITY, MAX_NUM_SEQS, cache_threshold=threshold)
        self.threshold = threshold
        self.records = [OrderedDict() for _ in range(NUM_REPLICAS)]  # prefix (a tuple of ids) -> None, LRU first

    @rule(target=PROMPTS, ids=IDS, loads=LOADS)
    def route(self, ids, loads):
        self.check_route(ids, loads)
        return ids

    @rule(target=PROMPTS, prompt=PROMPTS, more=st.lists(st.integers(0, 3), max_size=3), loads=LOADS)
    def follow_up(self, prompt, more, loads):
        """A prompt routed before, extended: a conversation's next turn."""
        self.check_route(prompt + more, loads)
        return prompt + more

    def match(self, i, ids) -> int:
        return next((k for k in range(len(ids)) if tuple(ids[:k + 1]) not in self.records[i]), len(ids))

    def check_route(self, ids, loads):
        replicas = [SimpleNamespace(outstanding=o, kv_usage=0.0, num_gpu_blocks=None) for o in loads]
        got = self.router.route(ids, replicas)
        lightest = min(loads)
        longest = max(self.match(i, ids) for i in range(NUM_REPLICAS))
        if longest > self.threshold * len(ids):  # the best match: the longest, fewest outstanding, lowest index
            fits = [i for i in range(NUM_REPLICAS) if self.match(i, ids) == longest]
        else:  # the smallest record: the most room in its cache
            smallest = min(len(r) for r in self.records)
            fits = [i for i in range(NUM_REPLICAS) if len(self.records[i]) == smallest]
        want = min(fits, key=lambda i: (loads[i], i))
        if loads[want] - lightest > self.router.balance_threshold:  # overloaded: the least loaded wins first
            want = loads.index(lightest)
        assert got == want
        record = self.records[want]
        for k in range(len(ids)):
            record[tuple(ids[:k + 1])] = None
            record.move_to_end(tuple(ids[:k + 1]))
        while len(record) > CAPACITY:
            record.popitem(last=False)

    @invariant()
    def records_as_large_as_what_was_sent(self):
        for i in range(NUM_REPLICAS):
            assert len(self.router.trees[i]) == len(self.records[i])


TestPrefixAware = PrefixAwareMachine.TestCase
TestPrefixAware.settings = settings(max_examples=max(200, settings().max_examples))
