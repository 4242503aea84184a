"""Sampling: seeds, top-k/top-p, parallel sampling through fork and copy-on-write, stops, max_tokens."""
import pytest
import torch

from paged.engine import LLM, SamplingParams
from paged.engine.sampler import Sampler, SampleRow

from .conftest import TINY
from .recorder import assert_all_blocks_free, record_steps
from .tiny_models import hf_greedy

PROMPT = [104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 32, 1, 2, 3, 4, 5, 6, 7]  # 20 tokens


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama[0]), **TINY)


def test_seeded_sampling_is_reproducible_under_any_batch(llm):
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=7, ignore_eos=True)
    alone = llm.generate([PROMPT], params)[0].token_ids
    crowd = llm.generate([[9] * 30, PROMPT, [1, 2, 3]], [SamplingParams(max_tokens=5), params, params])
    assert crowd[1].token_ids == alone
    other = llm.generate([PROMPT], SamplingParams(temperature=1.0, max_tokens=16, seed=8, ignore_eos=True))
    assert other[0].token_ids != alone
    assert_all_blocks_free(llm)


def test_top_k_one_is_greedy(llm, tiny_llama):
    out = llm.generate([PROMPT], SamplingParams(temperature=1.5, top_k=1, max_tokens=10))[0]
    assert out.token_ids == hf_greedy(tiny_llama[1], PROMPT, 10)


def test_parallel_greedy_samples_follow_the_reference_through_copy_on_write(tiny_llama):
    llm = LLM(str(tiny_llama[0]), **TINY)
    log = record_steps(llm)
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, n=3, max_tokens=12, ignore_eos=True))[0]
    ref = hf_greedy(tiny_llama[1], PROMPT, 12, eos=None)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(c.token_ids == ref for c in out.outputs)
    assert log.copied > 0  # 20 tokens: the shared last block is copied before the first write
    assert_all_blocks_free(llm)


def test_parallel_random_samples_differ_and_repeat_with_the_seed(llm):
    params = SamplingParams(temperature=1.0, n=3, max_tokens=10, seed=3, ignore_eos=True)
    first = llm.generate([PROMPT], params)[0]
    again = llm.generate([PROMPT], params)[0]
    samples = [tuple(c.token_ids) for c in first.outputs]
    assert len(set(samples)) == 3
    assert samples == [tuple(c.token_ids) for c in again.outputs]
    assert all(c.finish_reason == "length" and len(c.token_ids) == 10 for c in first.outputs)


def test_parallel_sampling_with_one_token(llm):
    out = llm.generate([PROMPT], SamplingParams(temperature=1.0, n=4, max_tokens=1, seed=0))[0]
    assert len(out.outputs) == 4 and all(len(c.token_ids) == 1 for c in out.outputs)
    assert_all_blocks_free(llm)


def test_stop_token_ids_and_max_tokens(llm, tiny_llama):
    ref = hf_greedy(tiny_llama[1], PROMPT, 12, eos=None)
    stop = ref[4]
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop], ignore_eos=True)
    out = llm.generate([PROMPT], params)[0]
    assert out.token_ids == ref[:ref.index(stop) + 1]
    assert (out.finish_reason, out.outputs[0].stop_reason) == ("stop", stop)
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))[0]
    assert (out.token_ids, out.finish_reason) == (ref[:3], "length")


def test_stop_string_truncates_the_text(llm):
    full = llm.generate(["Once upon a time"], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0]
    text = full.text
    assert len(text) >= 6
    stop = text[3:5]
    out = llm.generate(["Once upon a time"], SamplingParams(temperature=0.0, max_tokens=20, stop=[stop, "\x00zz"]))[0]
    cut = text.index(stop)
    assert out.text == text[:cut]
    assert (out.finish_reason, out.outputs[0].stop_reason) == ("stop", stop)
    assert len(out.token_ids) < 20
    assert_all_blocks_free(llm)


def _rows(n, **params):
    return [SampleRow(0, "r", i, SamplingParams(**params)) for i in range(n)]


def test_sampler_keeps_only_the_top_k_and_top_p_tokens():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.05, 0.05]]))
    sampler = Sampler(seed=0)
    sampler.add_request("r", SamplingParams(seed=1))
    assert set(sampler(logits, _rows(200, top_k=2))) == {0, 1}
    assert set(sampler(logits, _rows(200, top_p=0.6))) == {0, 1}  # 0.4 < 0.6, 0.4 + 0.3 reaches it
    assert set(sampler(logits, _rows(200, top_p=0.4))) == {0}
    assert set(sampler(logits, _rows(400))) == {0, 1, 2, 3, 4}
    assert sampler(logits, _rows(5, temperature=0.0)) == [0] * 5


def test_sampler_frequencies_follow_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    sampler = Sampler(seed=0)
    sampler.add_request("r", SamplingParams(seed=5))
    tokens = torch.tensor(sampler(torch.log(probs)[None], _rows(3000)))
    freq = torch.bincount(tokens, minlength=3) / 3000
    assert torch.allclose(freq, probs, atol=0.04)


def test_parallel_samples_when_a_child_name_is_taken(llm):
    """The core renames a child whose id `<parent>-<i>` a user's request already has."""
    engine = llm.llm_engine
    engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), request_id="x-1")
    engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=8, n=2, ignore_eos=True), request_id="x")
    done = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    assert len(done["x-1"].outputs) == 1 and len(done["x"].outputs) == 2
    assert done["x"].outputs[0].token_ids == done["x"].outputs[1].token_ids == done["x-1"].token_ids
    assert_all_blocks_free(llm)


def test_a_users_id_never_collides_with_a_fork(llm):
    """While "chat" (n=2) runs, its fork exists in the scheduler; a user's own "chat-1" is still
    accepted, because the scheduler knows requests by internal ids, never by the user's."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=8, n=2, ignore_eos=True), request_id="chat")
    while not any(r.parent is not None for r in llm.scheduler.requests.values()):
        engine.step()
    engine.add_request(PROMPT, params, request_id="chat-1")
    with pytest.raises(ValueError, match="'chat-1' is already in use"):
        engine.add_request(PROMPT, params, request_id="chat-1")  # user ids are still unique among users
    done = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    assert len(done["chat"].outputs) == 2 and len(done["chat-1"].outputs) == 1
    assert done["chat"].outputs[1].token_ids == done["chat-1"].token_ids
    assert_all_blocks_free(llm)


def test_unnamed_requests_skip_the_ids_users_took(llm):
    engine = llm.llm_engine
    taken = [engine.add_request([1, 2], SamplingParams(max_tokens=2), request_id=str(i)) for i in range(100)]
    auto = engine.add_request([1, 2], SamplingParams(max_tokens=2))
    assert auto not in taken
    while engine.has_unfinished_requests():
        engine.step()


def test_min_tokens_holds_off_stop_tokens_and_stop_strings(llm, tiny_llama):
    """vLLM's min_tokens: no stop token (EOS included) and no stop string ends a sequence earlier."""
    first = hf_greedy(tiny_llama[1], PROMPT, 1, eos=None)[0]
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[first], ignore_eos=True)
    assert llm.generate([PROMPT], params)[0].token_ids == [first]
    params.min_tokens = 5
    out = llm.generate([PROMPT], params)[0]
    assert len(out.token_ids) >= 5 and first not in out.token_ids[:4]
    text = llm.generate(["Once upon a time"], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0].text
    params = SamplingParams(temperature=0.0, max_tokens=20, stop=[text[0]], ignore_eos=True)
    early = llm.generate(["Once upon a time"], params)[0]
    assert early.finish_reason == "stop" and early.text == ""
    params.min_tokens = len(early.token_ids) + 3
    assert len(llm.generate(["Once upon a time"], params)[0].token_ids) >= params.min_tokens
    assert_all_blocks_free(llm)


def test_streamed_text_never_takes_back_the_start_of_a_stop_string(llm):
    """Each output's text is a prefix of the final one: what could begin a stop string is held
    back until the sequence shows it is not one."""
    full = llm.generate(["Once upon a time"], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0].text
    stop = full[4:7]
    engine = llm.llm_engine
    engine.add_request("Once upon a time", SamplingParams(temperature=0.0, max_tokens=20, stop=[stop]), "s")
    texts = []
    while engine.has_unfinished_requests():
        texts += [o.text for o in engine.step()]
    assert texts[-1] == full[:full.index(stop)]
    assert all(texts[-1].startswith(t) for t in texts)
