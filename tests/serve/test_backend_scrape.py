"""What the router learns of a backend from its `/metrics`, on expositions that prometheus-client
writes: the KV usage and, from `vllm:cache_config_info`, the KV cache's size in blocks, which an
explicit `--num-gpu-blocks` overrides."""
import asyncio

import httpx
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from paged.serve.backends import Backend, num_gpu_blocks_from_metrics, probe
from paged.serve.scrape import Scrape


def exposition(*engines: dict[str, str], usage: float = 0.25) -> str:
    """A vLLM server's: one `vllm:cache_config_info` sample per engine, labelled with its cache config."""
    r = CollectorRegistry()
    Gauge("vllm:kv_cache_usage_perc", "KV cache usage", registry=r).set(usage)
    if engines:
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(engines[0]), registry=r)
        for labels in engines:
            info.labels(**labels).set(1)
    return generate_latest(r).decode()


def engine(index: int, num_gpu_blocks: str) -> dict[str, str]:
    return {"block_size": "16", "cache_dtype": "auto", "enable_prefix_caching": "True", "engine": str(index),
            "gpu_memory_utilization": "0.9", "num_cpu_blocks": "0", "num_gpu_blocks": num_gpu_blocks}


def test_the_cache_size_is_the_cache_config_infos_num_gpu_blocks():
    assert num_gpu_blocks_from_metrics(Scrape(exposition(engine(0, "661")))) == 661
    assert num_gpu_blocks_from_metrics(Scrape(exposition(engine(0, "661"), engine(1, "600")))) == 600  # the smallest
    assert num_gpu_blocks_from_metrics(Scrape(exposition(engine(0, "None")))) is None  # vLLM's before sizing it
    assert num_gpu_blocks_from_metrics(Scrape(exposition(engine(0, "0")))) is None
    assert num_gpu_blocks_from_metrics(Scrape(exposition())) is None


def probed(text: str, num_gpu_blocks: int | None = None) -> Backend:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=text if request.url.path == "/metrics" else "")

    async def run() -> Backend:
        backend = Backend("http://b", lambda: httpx.AsyncClient(transport=httpx.MockTransport(answer)), num_gpu_blocks)
        await probe(backend, 1.0)
        await backend.client.aclose()
        return backend

    return asyncio.run(run())


def test_a_probe_reads_the_size_with_the_usage_and_a_given_size_wins():
    backend = probed(exposition(engine(0, "661"), usage=0.5))
    assert (backend.healthy, backend.kv_usage, backend.num_gpu_blocks) == (True, 0.5, 661)
    assert probed(exposition(engine(0, "661")), num_gpu_blocks=48).num_gpu_blocks == 48
    assert probed(exposition()).num_gpu_blocks is None  # a server without it: unknown
