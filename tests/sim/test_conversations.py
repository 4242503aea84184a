"""Multi-turn conversations and the pooled-LRU yardstick, on cases worked by hand."""
import numpy as np

from paged.workloads.conversations import ConversationShape, conversation_workload
from paged.workloads.prefix_reuse import pooled_lru_hit_rate
from paged.workloads.workload import Workload


def test_each_turn_extends_the_previous_turn():
    """A turn's prompt is the conversation so far plus a new message: its ids name its prompt and
    its answer, the next turn's ids start with all of them, and it arrives later."""
    w = conversation_workload(ConversationShape(num_conversations=20, mean_turns=4), seed=3)
    assert w.ids_cover_output
    assert np.all(np.diff(w.arrival_s) >= 0) and w.arrival_s[0] == 0
    ids = [tuple(w.prefix_ids(i)) for i in range(len(w))]
    tokens = w.num_prompt_tokens + w.num_output_tokens
    assert all(len(x) == -(-int(n) // 16) for x, n in zip(ids, tokens, strict=True))
    system = ids[0][:32]  # 512 tokens shared by all
    assert all(x[:32] == system for x in ids)
    conversations = {}  # the first id past the system prompt is the conversation's own
    for x in ids:
        conversations.setdefault(x[32], []).append(x)
    for turns in conversations.values():
        for a, b in zip(turns, turns[1:]):
            assert len(b) >= len(a) and b[:len(a)] == a
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


def one_conversation(turns=5):
    shape = ConversationShape(num_conversations=1, mean_turns=turns, think_time_s=600, system_prompt_tokens=64,
                              user_tokens=40, output_tokens=50, max_model_len=4096)
    return conversation_workload(shape, seed=7, name="one")


def test_the_next_turn_hits_the_previous_answer():
    """An engine caches the answer's blocks as it writes them (all but the last token's KV), and the
    next turn's prompt holds the answer: with a cache that keeps everything, each turn hits every
    full block the previous turn computed, answer included, never its own last prompt token."""
    from sim import SimConfig, simulate

    w = one_conversation()
    assert len(w) >= 3
    req = simulate(w, SimConfig(num_gpu_blocks=4096, max_model_len=4096)).requests.sort_values("request_id")
    computed = (w.num_prompt_tokens + w.num_output_tokens - 1) // 16 * 16
    expected = np.minimum(computed[:-1], (w.num_prompt_tokens[1:] - 1) // 16 * 16)
    assert req.prefix_hit_tokens.tolist() == [0, *expected.tolist()]


def test_routers_see_only_the_prompts_ids(monkeypatch):
    """A real router sees the prompt, never the answer to come, so the simulated one does too."""
    import paged.core.routing as routing
    from sim import SimConfig, simulate

    seen = []
    route = routing.PrefixAware.route
    monkeypatch.setattr(routing.PrefixAware, "route", lambda self, ids, r: seen.append(len(ids)) or route(self, ids, r))
    w = one_conversation()
    simulate(w, SimConfig(replicas=2, router="prefix_aware", num_gpu_blocks=4096, max_model_len=4096))
    assert seen == (-(-w.num_prompt_tokens // 16)).tolist()


def test_pooled_lru_caches_answers_as_the_replicas_do():
    """The yardstick caches an answer under the ids that name it, so the next turn hits it, and a
    request's own blocks (past its ids) take room, as in the replicas."""
    w = one_conversation()
    big = pooled_lru_hit_rate(w, 10**6)
    prompts = int(w.num_prompt_tokens.sum())
    named = (w.num_prompt_tokens + w.num_output_tokens) // 16 * 16
    assert big == np.minimum(named[:-1], (w.num_prompt_tokens[1:] - 1) // 16 * 16).sum() / prompts
    # Ids that name the prompt only (Mooncake's): A and C share 4 blocks, B is another prompt of 2, and
    # each answer fills one block of its own. 8 blocks hold all: C hits 3 (never its last token's). In
    # 5, B's 3 blocks push out A's own block and its last two: C hits 2.
    abc = Workload(np.arange(3.0), np.array([64, 32, 64]), np.full(3, 16), prefix_index=np.array([0, 1, 0]),
                   prefix_values=np.array([1, 2, 3, 4, 5, 6]), prefix_offsets=np.array([0, 4, 6]),
                   hash_id_block_size=16)
    assert pooled_lru_hit_rate(abc, 8) == 48 / 160
    assert pooled_lru_hit_rate(abc, 5) == 32 / 160
