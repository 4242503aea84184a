"""Multi-turn conversations and the pooled-LRU yardstick, on cases worked by hand."""
import numpy as np

from paged.workloads.conversations import ConversationShape, conversation_workload
from paged.workloads.prefix_reuse import pooled_lru_hit_rate
from paged.workloads.workload import Workload


def test_each_turn_extends_the_previous_turn():
    """A turn's prompt is the conversation so far plus a new message: its ids start with every
    id of the previous turn but the last (a partly filled block), and it arrives later."""
    w = conversation_workload(ConversationShape(num_conversations=20, mean_turns=4), seed=3)
    assert np.all(np.diff(w.arrival_s) >= 0) and w.arrival_s[0] == 0
    ids = [tuple(w.prefix_ids(i)) for i in range(len(w))]
    assert all(len(x) == -(-int(p) // 16) for x, p in zip(ids, w.num_prompt_tokens, strict=True))
    system = ids[0][:32]  # 512 tokens shared by all
    assert all(x[:32] == system for x in ids)
    conversations = {}  # the first id past the system prompt is the conversation's own
    for x in ids:
        conversations.setdefault(x[32], []).append(x)
    for turns in conversations.values():
        for a, b in zip(turns, turns[1:]):
            assert len(b) >= len(a) and b[:len(a) - 1] == a[:-1]
    assert sum(len(t) > 1 for t in conversations.values()) > 10


def shared(n_requests, ids, prompt):
    return Workload(np.arange(n_requests, dtype=float), np.full(n_requests, prompt), np.ones(n_requests, dtype=int),
                    prefix_index=np.zeros(n_requests, dtype=np.int64), prefix_values=np.array(ids),
                    prefix_offsets=np.array([0, len(ids)]), hash_id_block_size=16)


def test_pooled_lru_by_hand():
    """Two identical 64-token prompts: the second hits 3 blocks (never the last token's), so
    48 of 128 prompt tokens; a cache of 2 blocks keeps the first two (the start is kept, the
    tail evicted), and no cache hits nothing."""
    w = shared(2, [1, 2, 3, 4], 64)
    assert pooled_lru_hit_rate(w, 100) == 48 / 128
    assert pooled_lru_hit_rate(w, 2) == 32 / 128
    assert pooled_lru_hit_rate(w, 0) == 0.0
