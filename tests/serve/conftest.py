"""Real servers in subprocesses on free loopback ports, over tiny random models.

Every server is started and stopped by the fixture that owns it (`launched_server`: terminate,
then kill, in a finally), waits for /health for a bounded time, and fails with its own log if
it dies first.
"""
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny_models imports transformers: never the network

from paged.serve.launcher import launched_server  # noqa: E402
from tests.engine.tiny_models import make_tiny_model  # noqa: E402

# One byte-level token per character; the template closes each turn with EOS, as chat models do.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
# Engine settings shared by the servers and the in-process reference engine.
ENGINE = {"max_model_len": 512, "kv_cache_memory_bytes": 4 << 20, "max_num_batched_tokens": 256, "max_num_seqs": 16,
          "threads": 1}


def engine_flags(**overrides) -> list[str]:
    flags = []
    for name, value in {**ENGINE, **overrides}.items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    """A tiny random Llama folder with a tokenizer_config.json carrying a chat template."""
    folder = tmp_path_factory.mktemp("serve") / "tiny"
    make_tiny_model(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE}))
    return folder


@dataclass
class Server:
    url: str
    log: Path

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **kwargs)


@contextmanager
def running_server(model: Path, *flags: str, log_dir: Path, env: dict | None = None):
    log = log_dir / f"server-{len(list(log_dir.iterdir()))}.log"
    with launched_server(model, [*flags, "--log-level", "warning"], log, env) as launched:
        yield Server(launched.url, launched.log)


@pytest.fixture(scope="package")
def server(tiny_chat_model, tmp_path_factory):
    with running_server(tiny_chat_model, *engine_flags(), "--max-body-bytes", "65536",
                        log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


@pytest.fixture(scope="package")
def model_name(tiny_chat_model) -> str:
    return str(tiny_chat_model)


def wait_until(predicate, what: str, tries: int = 300, pause: float = 0.05):
    """Poll `predicate` a bounded number of times; fail naming `what` if it never holds."""
    for _ in range(tries):
        value = predicate()
        if value:
            return value
        time.sleep(pause)
    pytest.fail(f"never happened: {what}")


