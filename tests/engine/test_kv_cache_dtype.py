"""kv_cache_dtype: the cache holds what its bytes allow, and the engine's features keep each format's output.

A quantized cache changes the numbers, so its greedy output may differ from the float one: what
must not change it is *where* K/V live. Every token's K/V are quantized on their own (per-token
scales for int8/int4, a static one for fp8), so chunking, prefix hits, swapping (scales moved with
their blocks) and recomputation all rebuild the same bytes: each format's output under preemption
must equal its own output without.
"""
import argparse
import dataclasses

import pytest
import torch

from paged.engine import LLM, SamplingParams
from paged.engine.cache_engine import CacheEngine
from paged.engine.engine_args import add_engine_args, engine_kwargs
from paged.engine.engine_config import EngineConfig

from .conftest import TINY
from .recorder import assert_all_blocks_free, record_steps
from .test_greedy_vs_hf import _workload

pytestmark = pytest.mark.filterwarnings("ignore:max_model_len=512 exceeds the KV cache")
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
QUANTIZED = ("int8", "fp8", "int4")


def test_unknown_kv_cache_dtype_is_refused():
    with pytest.raises(ValueError, match="kv_cache_dtype.*'int3'.*'auto', 'fp16', 'int8', 'fp8', 'int4'"):
        EngineConfig(model="smollm2-135m", kv_cache_dtype="int3")


def test_int4_refuses_a_head_dim_it_cannot_pack(tiny_llama):
    """RoPE models have even head dims (transformers refuses an odd one), so the engine's check is met by the
    model config alone: the engine sizes its blocks, and so meets the refusal, before allocating anything."""
    config = dataclasses.replace(LLM(str(tiny_llama[0]), **TINY).llm_engine.model_config, head_dim=15)
    assert CacheEngine.bytes_per_block(config, 16, torch.float32, "int8") == 16 * 2 * 2 * 2 * (15 + 4)
    with pytest.raises(ValueError, match="int4 KV cache: head_dim 15 is odd, but int4 packs two values a byte"):
        CacheEngine.bytes_per_block(config, 16, torch.float32, "int4")


def test_capacity_grows_as_bytes_per_token_shrink(tiny_llama):
    """Tiny llama: 2 layers x 2 KV heads x head_dim 16, float32 on the CPU. Bytes a token a layer (K and V):
    float32 256, fp16 128, int8 2 x 2 x (16 + 4) = 80, fp8 64, int4 2 x 2 x (8 + 4, one group of 16) = 48."""
    per_token = {"auto": 2 * 256, "fp16": 2 * 128, "int8": 2 * 80, "fp8": 2 * 64, "int4": 2 * 48}
    for kv_cache_dtype, size in per_token.items():
        llm = LLM(str(tiny_llama[0]), **TINY, kv_cache_dtype=kv_cache_dtype)
        block_size = llm.scheduler.block_size
        assert llm.scheduler.cache_config.num_gpu_blocks == TINY["kv_cache_memory_bytes"] // (size * block_size)
        assert llm.llm_engine.cache.device_cache.nbytes + (
            0 if llm.llm_engine.cache.device_scales is None else llm.llm_engine.cache.device_scales.nbytes
        ) == llm.scheduler.cache_config.num_gpu_blocks * block_size * size


@pytest.fixture(scope="module")
def quantized_outputs(tiny_llama):
    """Each format's greedy output on the workload, with a cache large enough never to preempt."""
    prompts = _workload()
    return {d: [o.token_ids for o in LLM(str(tiny_llama[0]), **TINY, kv_cache_dtype=d).generate(prompts, GREEDY)]
            for d in QUANTIZED}


@pytest.mark.parametrize("kv_cache_dtype", QUANTIZED)
@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_keeps_each_formats_output(tiny_llama, quantized_outputs, kv_cache_dtype, mode):
    llm = LLM(str(tiny_llama[0]), **{**TINY, "num_gpu_blocks": 10, "preemption_mode": mode, "num_cpu_blocks": 64,
                                     "max_num_batched_tokens": 32}, kv_cache_dtype=kv_cache_dtype)
    log = record_steps(llm)
    outputs = llm.generate(_workload(), GREEDY)
    assert [o.token_ids for o in outputs] == quantized_outputs[kv_cache_dtype]
    assert log.preempted > 0 and log.partial_chunks > 0
    assert (log.swapped_in > 0) == (mode == "swap")
    assert_all_blocks_free(llm)


def test_bytes_per_block_names_the_format():
    cfg = EngineConfig(model="smollm2-135m")  # validates without loading
    assert cfg.kv_cache_dtype == "auto"
    with pytest.raises(ValueError, match="kv_cache_dtype='int2'"):
        CacheEngine.bytes_per_block(None, 16, None, "int2")


def test_command_lines_take_the_kv_cache_dtype_and_swap_compression():
    """`python -m paged.engine` and `paged serve` share these flags (paged.engine.engine_args)."""
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--model", "smollm2-135m", "--kv-cache-dtype", "int4", "--swap-compression", "lz4"])
    kwargs = engine_kwargs(args)
    assert kwargs == {"kv_cache_dtype": "int4", "swap_compression": "lz4"}
    assert EngineConfig(model=args.model, **kwargs).kv_cache_dtype == "int4"
    with pytest.raises(ValueError, match="kv_cache_dtype='int3'"):
        EngineConfig(model=args.model, **engine_kwargs(parser.parse_args(["--model", "m", "--kv-cache-dtype", "int3"])))
