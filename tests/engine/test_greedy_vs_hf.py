"""Greedy output equals transformers' generate() token for token, whatever the engine's features do.

Prefix caching, chunked prefill and preemption (recompute and swap) change which tokens are
computed in which step and where their K/V live, never the result: each configuration is run
on the same workload and compared with the reference, and the step log proves the feature fired.
"""
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paged.engine import LLM, SamplingParams

from .conftest import TINY
from .recorder import assert_all_blocks_free, record_steps
from .tiny_models import hf_greedy, make_tiny_model

# These tests shrink the cache below max_model_len on purpose, to force preemption.
pytestmark = pytest.mark.filterwarnings("ignore:max_model_len=512 exceeds the KV cache")

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def _workload(seed: int = 1) -> list[list[int]]:
    """Six prompts of 5..70 tokens; three share a 40-token prefix (2.5 blocks), two are identical."""
    rng = random.Random(seed)
    shared = [rng.randrange(256) for _ in range(40)]
    prompts = [shared + [rng.randrange(256) for _ in range(n)] for n in (3, 17, 30)]
    prompts += [[rng.randrange(256) for _ in range(n)] for n in (5, 70)]
    return prompts + [list(prompts[1])]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    _, hf = tiny_llama
    return {tuple(p): hf_greedy(hf, p, GREEDY.max_tokens) for p in _workload()}


FEATURES = {
    "defaults": ({}, lambda log, llm: True),
    "prefix_caching_off": ({"enable_prefix_caching": False}, lambda log, llm: llm.scheduler.kv.prefix_cache_hits == 0),
    "chunked_prefill_off": ({"enable_chunked_prefill": False, "max_num_batched_tokens": 512},
                            lambda log, llm: log.partial_chunks == 0),
    "small_chunks": ({"max_num_batched_tokens": 16, "max_num_seqs": 4}, lambda log, llm: log.partial_chunks > 0),
    "preempt_recompute": ({"num_gpu_blocks": 10, "preemption_mode": "recompute"},
                          lambda log, llm: log.preempted > 0 and log.swapped_out == 0),
    "preempt_swap": ({"num_gpu_blocks": 10, "preemption_mode": "swap", "num_cpu_blocks": 64},
                     lambda log, llm: log.swapped_out > 0 and log.swapped_in > 0),
    "preempt_swap_no_prefix_cache": ({"num_gpu_blocks": 10, "preemption_mode": "swap", "num_cpu_blocks": 64,
                                      "enable_prefix_caching": False},
                                     lambda log, llm: log.swapped_out > 0 and log.swapped_in > 0),
}


@pytest.mark.parametrize("feature", list(FEATURES))
def test_features_keep_greedy_output(tiny_llama, reference, feature):
    kwargs, exercised = FEATURES[feature]
    llm = LLM(str(tiny_llama[0]), **{**TINY, **kwargs})
    log = record_steps(llm)
    prompts = _workload()
    for _ in range(2):  # the second round finds the first one's blocks in the prefix cache
        outputs = llm.generate(prompts, GREEDY)
        assert [o.token_ids for o in outputs] == [reference[tuple(p)] for p in prompts]
        assert_all_blocks_free(llm)
    assert exercised(log, llm), f"{feature} was not exercised: {log}"
    if kwargs.get("enable_prefix_caching", True):
        assert llm.scheduler.kv.prefix_cache_hits > 0


@pytest.fixture(scope="module")
def engines(tiny_models):
    return {arch: LLM(str(folder), **TINY) for arch, (folder, _) in tiny_models.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@given(prompts=st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=90), min_size=1, max_size=4),
       max_tokens=st.integers(1, 12))
def test_random_prompts_match_transformers(tiny_models, engines, arch, prompts, max_tokens):
    llm, hf = engines[arch], tiny_models[arch][1]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.prompt_token_ids == prompt
        assert out.token_ids == hf_greedy(hf, prompt, max_tokens)
    assert_all_blocks_free(llm)


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    folder, hf = make_tiny_model(tmp_path, "llama", seed=3, rope_parameters=rope)
    llm = LLM(str(folder), **TINY)
    prompts = [list(range(7, 107)), [5, 6, 7]]  # positions past the original context
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8))
    assert [o.token_ids for o in outputs] == [hf_greedy(hf, p, 8) for p in prompts]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_parallel_samples_survive_preemption(tiny_llama, reference, mode):
    """n = 2 greedy: both sequences of every request equal the reference, through fork, copy-on-write
    and preemption of parents and children alike."""
    llm = LLM(str(tiny_llama[0]), **{**TINY, "num_gpu_blocks": 14, "preemption_mode": mode})
    log = record_steps(llm)
    prompts = _workload()
    params = SamplingParams(temperature=0.0, max_tokens=GREEDY.max_tokens, n=2)
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        assert [c.token_ids for c in out.outputs] == [reference[tuple(prompt)]] * 2
    assert log.preempted > 0 and log.copied > 0
    assert_all_blocks_free(llm)
