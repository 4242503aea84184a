"""Shared fixtures: tiny random checkpoints (created once per session) and SmolLM2-135M (loaded once).

No test touches the network: HF_HUB_OFFLINE is set before transformers is imported.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from .tiny_models import make_tiny_model  # noqa: E402

# Small caches for tiny models: 2 layers x 2 KV heads x 16 dims x 4 bytes x 2 = 512 bytes a token.
TINY = {"kv_cache_memory_bytes": 4 << 20, "max_num_batched_tokens": 256, "max_model_len": 512}


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """One torch thread for these tests. On a small machine shared with other jobs, a second
    OpenMP thread stalls at every barrier while another process holds the other core: steps
    then take ten times longer, where one thread just runs at its own pace."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """arch -> (folder, transformers model) for llama, qwen2 and mistral."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny_model(root / arch, arch) for arch in ("llama", "qwen2", "mistral")}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def smollm2():
    from paged.engine import LLM

    return LLM("smollm2-135m", max_model_len=1024, kv_cache_memory_bytes=64 << 20)


@pytest.fixture(scope="session")
def smollm2_hf():
    """transformers' own reading of the same GGUF (model and tokenizer) as the reference."""
    from transformers import AutoTokenizer

    from paged.engine.bench import hf_model_from_gguf
    from paged.engine.loader import resolve_model_path

    path = resolve_model_path("smollm2-135m")
    return hf_model_from_gguf(path), AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
