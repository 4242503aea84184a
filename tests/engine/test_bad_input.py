"""Bad input gets a clear ValueError, and the engine keeps serving; aborts and finishes free every block."""
import random

import pytest

from paged.engine import LLM, SamplingParams

from .conftest import TINY
from .recorder import assert_all_blocks_free

# These tests shrink the cache below max_model_len on purpose, to force preemption.
pytestmark = pytest.mark.filterwarnings("ignore:max_model_len=512 exceeds the KV cache")


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama[0]), **TINY)


GOOD = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.mark.parametrize(("prompt", "message"), [
    ("", "empty"),
    ([], "empty"),
    ([1] * 600, "max_model_len=512"),
    ([1, 2, 999], "token id 999"),
    ([1, -1], "token id -1"),
    (3.5, "type float"),
])
def test_bad_prompt_names_itself_and_the_engine_goes_on(llm, prompt, message):
    with pytest.raises(ValueError, match=message) as err:
        llm.generate(["fine", prompt, [5, 6]], GOOD)
    assert "prompt 1" in str(err.value)
    assert_all_blocks_free(llm)
    assert len(llm.generate(["fine", [5, 6]], GOOD)) == 2


def test_max_tokens_past_the_context_is_capped_there(llm):
    """The engine's API caps a sequence at max_model_len (finish_reason "length"), as vLLM's `LLM`
    does; the OpenAI server refuses such a request instead (tests/serve/test_context_length.py)."""
    out = llm.generate([[5] * 500], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 12 and out.finish_reason == "length"


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -0.5), ("top_p", 0.0), ("top_p", 1.5), ("max_tokens", 0), ("top_k", -2), ("n", 0),
    ("seed", 2**64), ("seed", 1.5), ("seed", "x"), ("stop", [1]), ("stop_token_ids", [[1]]), ("max_tokens", True),
    ("ignore_eos", "no"), ("ignore_eos", 1), ("stop", 123), ("stop", [""]), ("stop_token_ids", [-1]),
    ("stop_token_ids", 5), ("min_tokens", -1), ("min_tokens", 17), ("min_tokens", 2.0), ("temperature", float("inf")),
    ("temperature", "hot"), ("top_k", 1.5), ("top_p", None), ("n", 1.0),
])
def test_invalid_sampling_params(llm, field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
    params = SamplingParams()
    setattr(params, field, value)  # changed after construction: checked again on submission
    with pytest.raises(ValueError, match=field):
        llm.generate(["fine"], params)
    assert_all_blocks_free(llm)


def test_token_ids_in_any_integer_sequence_are_one_prompt(llm):
    """As vLLM: a sequence of integers (numpy's included) is one prompt, not a batch of prompts."""
    import numpy as np

    ref = llm.generate([[5, 6, 7]], GOOD)[0].token_ids
    for prompt in ((5, 6, 7), [np.int64(5), np.int32(6), 7], np.array([5, 6, 7]), {"prompt_token_ids": (5, 6, 7)}):
        outs = llm.generate(prompt, GOOD)
        assert len(outs) == 1 and outs[0].token_ids == ref and outs[0].prompt_token_ids == [5, 6, 7]
        assert all(type(t) is int for t in outs[0].prompt_token_ids)
    assert [o.token_ids for o in llm.generate([(5, 6, 7), "fine"], GOOD)][0] == ref
    with pytest.raises(ValueError, match="prompt 0: prompt token id 5.0"):
        llm.generate([(5.0, 6)], GOOD)
    with pytest.raises(ValueError, match="prompt dict with keys"):
        llm.generate({"text": "fine"}, GOOD)


def test_prompt_larger_than_the_cache_is_rejected(tiny_llama):
    llm = LLM(str(tiny_llama[0]), **{**TINY, "num_gpu_blocks": 4})
    with pytest.raises(ValueError, match="never fit in the KV cache"):
        llm.generate([[1] * 100], GOOD)
    assert llm.generate([[1] * 10], GOOD)[0].finish_reason == "length"


@pytest.mark.parametrize("make", [
    lambda tmp: "no-such-model",
    lambda tmp: str(tmp / "missing.gguf"),
    lambda tmp: _write(tmp / "junk.gguf", b"this is not a gguf file"),
    lambda tmp: str(tmp),  # a folder without config.json
    lambda tmp: _write(tmp / "model.bin", b"\x00" * 64),
])
def test_unknown_or_unreadable_model(tmp_path, make):
    with pytest.raises(ValueError, match="model|GGUF|config.json"):
        LLM(make(tmp_path))


@pytest.mark.parametrize("config, what", [
    ({}, "architecture"),
    ([1, 2], "expected a JSON object"),
    ({"model_type": "gpt2", "n_head": 12}, "architecture 'gpt2'"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}, "missing field"),
    ("FULL", "hidden_size='big'"),
    ("FULL_JUNK_WEIGHTS", "not a readable safetensors file"),
])
def test_broken_model_folders_name_the_problem(tiny_llama, tmp_path, config, what):
    import json
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny_llama[0], folder)
    full = json.loads((folder / "config.json").read_text())
    if config == "FULL":
        config = {**full, "hidden_size": "big"}
    elif config == "FULL_JUNK_WEIGHTS":
        config = full
        for f in folder.glob("*.safetensors"):
            f.write_bytes(b"\xff" * 64)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=what):
        LLM(str(folder), **TINY)


@pytest.mark.parametrize("kwargs, field", [
    ({"block_size": 0}, "block_size"),
    ({"block_size": 12}, "block_size"),
    ({"kv_cache_memory_bytes": "1GB"}, "kv_cache_memory_bytes"),
    ({"max_model_len": 0}, "max_model_len"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"gpu_memory_utilization": "most"}, "gpu_memory_utilization"),
    ({"threads": 0}, "threads"),
    ({"threads": 1.5}, "threads"),
])
def test_bad_engine_settings_are_refused_before_loading(kwargs, field):
    with pytest.raises(ValueError, match=rf"EngineConfig\.{field}="):
        LLM("no-such-model", **kwargs)  # the settings are checked first: the model is never looked up


def test_cuda_on_a_machine_without_it_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="EngineConfig.device='cuda'.*no CUDA device"):
        LLM("no-such-model", device="cuda")


def test_max_model_len_defaults_to_what_the_cache_holds(tiny_llama):
    small = LLM(str(tiny_llama[0]), num_gpu_blocks=8, block_size=16)
    assert small.scheduler.config.max_model_len == 128
    with pytest.warns(UserWarning, match="max_model_len=512 exceeds the KV cache's 128 tokens"):
        LLM(str(tiny_llama[0]), num_gpu_blocks=8, block_size=16, max_model_len=512)


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_abort_frees_blocks_at_any_point(llm):
    engine = llm.llm_engine
    ids = [engine.add_request([7] * 40, SamplingParams(max_tokens=50, ignore_eos=True, n=n)) for n in (1, 2, 1)]
    for _ in range(3):
        engine.step()
    assert llm.scheduler.kv.num_free_blocks < llm.scheduler.kv.pool.num_blocks
    for rid in ids:
        out = engine.abort_request(rid)
        assert out.finished and {c.finish_reason for c in out.outputs} == {"abort"}
    assert_all_blocks_free(llm)


def test_many_requests_with_aborts_leave_every_block_free(tiny_llama):
    llm = LLM(str(tiny_llama[0]), **{**TINY, "num_gpu_blocks": 16, "max_num_seqs": 6})
    engine = llm.llm_engine
    rng = random.Random(0)
    live: list[str] = []
    for _ in range(60):
        prompt = [rng.randrange(256) for _ in range(rng.randrange(1, 60))]
        params = SamplingParams(temperature=rng.choice([0.0, 1.0]), max_tokens=rng.randrange(1, 40),
                                n=rng.choice([1, 1, 2]), seed=rng.randrange(100))
        live.append(engine.add_request(prompt, params))
        for out in engine.step():
            if out.finished:
                live.remove(out.request_id)
        if live and rng.random() < 0.3:
            engine.abort_request(live.pop(rng.randrange(len(live))))
    while engine.has_unfinished_requests():
        engine.step()
    assert_all_blocks_free(llm)
    assert llm.scheduler.num_preemptions > 0
