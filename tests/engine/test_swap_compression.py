"""LZ4-compressed swap: lossless for every cache format, invisible in the engine's output, within
the swap space it was given, and as many host blocks in the engine as in the simulator."""
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from paged.engine import LLM, SamplingParams
from paged.engine.engine_config import EngineConfig
from paged.engine.swap_compression import CODECS, CompressedHostPool, compress, decompress
from sim import SimConfig
from sim.compressed_swap import DEFAULT_PROFILE
from sim.runner import build_cache_config

from .conftest import TINY
from .recorder import assert_all_blocks_free, record_steps
from .test_greedy_vs_hf import _workload

pytestmark = pytest.mark.filterwarnings("ignore:max_model_len=512 exceeds the KV cache")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.float8_e4m3fn)


@given(codec=st.sampled_from(CODECS), dtypes=st.lists(st.sampled_from(DTYPES), min_size=1, max_size=3),
       seed=st.integers(0, 2**16), repetitive=st.booleans())
def test_round_trip_is_bit_exact(codec, dtypes, seed, repetitive):
    """Random bytes reinterpreted as each dtype (NaN payloads and all), or runs of one value (which must shrink)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for dtype in dtypes:
        raw = torch.randint(0, 256, (2, 3, 8 * 4), dtype=torch.uint8, generator=generator)
        if repetitive:
            raw[:] = raw[0, 0, 0]
        tensors.append(raw.view(dtype))
    frame = compress(tensors, codec)
    restored = decompress(frame, tensors, codec)
    for got, want in zip(restored, tensors, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    if repetitive:
        assert len(frame) < sum(t.numel() * t.element_size() for t in tensors)


def test_pool_holds_only_what_is_swapped_out():
    pool = CompressedHostPool("lz4")
    block = [torch.zeros(4, 16), torch.ones(4, dtype=torch.int8)]
    pool.put(3, block)
    assert pool.stored_bytes > 0 and pool.raw_bytes_out == 4 * 16 * 4 + 4
    assert torch.equal(pool.take(3, block)[0], block[0])
    assert pool.stored_bytes == 0 and not pool.frames


@pytest.mark.parametrize("codec", CODECS)
def test_an_incompressible_block_takes_no_more_than_its_bytes(codec):
    """LZ4 expands noise (a frame's headers): such a block is kept as it is, so the pool never holds
    more than its blocks' raw bytes, the swap space it was sized with."""
    noise = [torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)),
             torch.randn(64, generator=torch.Generator().manual_seed(1)).half()]
    raw = sum(t.numel() * t.element_size() for t in noise)
    assert len(compress(noise, codec)) > raw  # the case this is for
    pool = CompressedHostPool(codec)
    pool.put(0, noise)
    assert pool.stored_bytes == raw
    for got, want in zip(pool.take(0, noise), noise, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert pool.stored_bytes == 0


@pytest.mark.parametrize("codec", CODECS)
def test_the_engine_and_the_simulator_give_compressed_swap_as_many_host_blocks(tiny_llama, codec):
    """Both hold swap_space // block bytes, compressed or not: the engine's pool cannot promise more
    (paged.engine.swap_compression), and the simulator models the engine's."""
    swap_gib = 1 / 256
    engine = [LLM(str(tiny_llama[0]), **TINY, preemption_mode="swap", swap_space=swap_gib, swap_compression=c)
              .llm_engine for c in (None, codec)]
    block_bytes = engine[0].cache.device_cache[:, :, 0].nbytes
    assert [e.scheduler.cache_config.num_cpu_blocks for e in engine] == [int(swap_gib * 2**30) // block_bytes] * 2
    # The simulator's block bytes for SmolLM2-135M equal the engine's, as swap_profile measured them.
    with open(DEFAULT_PROFILE) as f:
        measured = json.load(f)["kv_cache_dtypes"]["fp16"][codec]["block_bytes"]
    # (vLLM's default 4 GiB: enough blocks that 1 / ratio of them would be more, for either codec)
    sim = [build_cache_config(SimConfig(model="smollm2-135m", preemption="swap", swap_space_gib=4.0,
                                        swap_compression=c)).num_cpu_blocks for c in (None, codec)]
    assert sim == [4 * 2**30 // measured] * 2


def test_unknown_codec_is_refused():
    with pytest.raises(ValueError, match="swap_compression='zstd'"):
        EngineConfig(model="smollm2-135m", swap_compression="zstd")
    with pytest.raises(ValueError, match="codec 'zstd'"):
        CompressedHostPool("zstd")


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int4"])
def test_compressed_swap_keeps_greedy_output(tiny_llama, codec, kv_cache_dtype):
    prompts = _workload()
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    plain = LLM(str(tiny_llama[0]), **TINY, kv_cache_dtype=kv_cache_dtype).generate(prompts, greedy)
    llm = LLM(str(tiny_llama[0]), **{**TINY, "num_gpu_blocks": 10, "preemption_mode": "swap", "num_cpu_blocks": 64},
              kv_cache_dtype=kv_cache_dtype, swap_compression=codec)
    log = record_steps(llm)
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == [o.token_ids for o in plain]
    pool = llm.llm_engine.cache.host_pool
    assert log.swapped_out > 0 and log.swapped_in > 0 and llm.llm_engine.cache.host_cache is None
    assert pool.raw_bytes_out > 0 and pool.stored_bytes == 0
    assert_all_blocks_free(llm)


def test_the_config_names_exactly_the_codecs_there_are():
    """EngineConfig names the codecs without importing lz4; the two lists must not drift."""
    from paged.engine.engine_config import SWAP_COMPRESSIONS
    from paged.engine.swap_compression import CODECS

    assert SWAP_COMPRESSIONS == (None, *CODECS)


def test_the_swap_profiler_never_writes_over_the_simulators_profile_unasked(tmp_path, capsys, monkeypatch):
    """`python -m paged.engine.swap_profile`, as the README listed it, wrote its measurement over the
    tracked `sim/profiles/kv_swap_lz4.json` (its default --out). --out is now required, and checked
    before the minutes of measuring (here: a folder, refused before any model loads)."""
    import pytest

    from paged.engine import swap_profile

    monkeypatch.setattr(swap_profile, "measure", lambda *a: pytest.fail("measured before checking --out"))
    with pytest.raises(SystemExit) as e:
        swap_profile.main([])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err
    assert swap_profile.main(["--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path}: is a folder" in capsys.readouterr().err
