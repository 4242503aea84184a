"""Pieces of the server checked without HTTP: the KV audit catches what it must, each app has its
own metrics registry, the cache config is exported as vLLM exports it, and the command line binds
to loopback unless told otherwise."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from paged import SamplingParams
from paged.engine import LLMEngine
from paged.engine.engine_config import EngineConfig
from paged.serve.debug_kv import kv_report
from paged.serve.metrics import ServerMetrics, cache_config_info, scheduler_snapshot
from paged.serve.server import parse_args

from .conftest import ENGINE


@pytest.fixture
def engine(tiny_chat_model):
    return LLMEngine(EngineConfig(model=str(tiny_chat_model), **ENGINE))


def test_the_audit_reports_block_tables_and_leaks(engine):
    engine.add_request([1, 2, 3] * 12, SamplingParams(max_tokens=30, n=2, ignore_eos=True), request_id="mine")
    for _ in range(3):
        engine.step()
    report = kv_report(engine)
    assert report["audit"]["ok"]
    tables = {(r["request_id"], r["sequence"]): r["block_table"] for r in report["requests"]}
    assert set(tables) == {("mine", 0), ("mine", 1)}
    assert tables[("mine", 0)][:2] == tables[("mine", 1)][:2]  # the prompt's full blocks, shared by the fork
    assert report["pool"]["used"] == len(set(tables[("mine", 0)]) | set(tables[("mine", 1)]))

    pool = engine.scheduler.kv.pool
    free = next(b for b in pool.blocks if b.ref_cnt == 0)
    free.ref_cnt = 1  # a reference nobody holds: the block can never be free again
    shared = pool.blocks[tables[("mine", 0)][0]]
    shared.ref_cnt += 1
    audit = kv_report(engine)["audit"]
    assert not audit["ok"] and audit["leaked_blocks"] == [free.block_id]
    assert {m["block"] for m in audit["mismatched_ref_counts"]} == {free.block_id, shared.block_id}


def test_each_app_has_its_own_registry(engine):
    info = cache_config_info(engine)
    first, second = ServerMetrics("a", info), ServerMetrics("b", info)  # the global registry would refuse the second
    first.prompt_tokens.labels("a").inc(5)
    snapshot = scheduler_snapshot(engine)
    assert b'vllm:prompt_tokens_total{model_name="a"} 5.0' in first.render(snapshot)
    assert b'vllm:prompt_tokens_total{model_name="b"} 0.0' in second.render(snapshot)
    assert b'model_name="a"' not in second.render(snapshot)


def test_the_cache_config_is_exported_as_vllm_exports_it(engine):
    """`vllm:cache_config_info`: a gauge at 1 labelled with the cache as built. The engine sized it from its
    memory budget (ENGINE's kv_cache_memory_bytes), so its num_gpu_blocks was never given: a router learns
    it here."""
    snapshot = scheduler_snapshot(engine)
    families = {f.name: f for f in text_string_to_metric_families(
        ServerMetrics("m", cache_config_info(engine)).render(snapshot).decode())}
    family = families["vllm:cache_config_info"]
    assert family.type == "gauge" and [s.value for s in family.samples] == [1.0]
    labels = family.samples[0].labels
    cache = engine.scheduler.cache_config
    assert cache.num_gpu_blocks == engine.scheduler.kv.pool.num_blocks > 1
    assert labels["num_gpu_blocks"] == str(cache.num_gpu_blocks)
    assert {k: labels[k] for k in ("block_size", "num_cpu_blocks", "enable_prefix_caching", "cache_dtype",
                                   "num_gpu_blocks_override", "kv_cache_memory_bytes", "engine")} == {
        "block_size": "16", "num_cpu_blocks": "0", "enable_prefix_caching": "True", "cache_dtype": "auto",
        "num_gpu_blocks_override": "None", "kv_cache_memory_bytes": str(4 << 20), "engine": "0"}


def test_the_kv_budget_label_is_the_one_the_cache_was_sized_from(tiny_chat_model):
    """Left at its default, kv_cache_memory_bytes read "None" in `vllm:cache_config_info` although the
    cache had 256 MiB; it is the default's value, and absent where num_gpu_blocks sized the cache."""
    from paged.engine.engine_config import DEFAULT_CPU_KV_CACHE_BYTES

    engines = {"default": {}, "blocks": {"num_gpu_blocks": 8}}
    labels = {name: cache_config_info(LLMEngine(EngineConfig(model=str(tiny_chat_model), max_model_len=128,
                                                              threads=1, **given)))
              for name, given in engines.items()}
    assert labels["default"]["kv_cache_memory_bytes"] == str(DEFAULT_CPU_KV_CACHE_BYTES)
    assert "kv_cache_memory_bytes" not in labels["blocks"] and labels["blocks"]["num_gpu_blocks"] == "8"


def test_the_server_binds_to_loopback_by_default():
    args = parse_args(["--model", "m"])
    assert (args.host, args.port, args.api_key, args.max_waiting) == ("127.0.0.1", 8000, None, None)
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--max-waiting", "0"])
