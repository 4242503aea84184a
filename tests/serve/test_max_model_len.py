"""`paged serve` and max_model_len, as `vllm serve`: a --max-model-len beyond the model's maximum,
or beyond what the KV cache holds, refuses to start with one line naming the value, what was
expected and where it comes from (the engine's API keeps a too-large value with a warning: tests
shrink the cache so); one left out is derived as before, and the startup log says what it is and
why (it was cut to the cache's size without a word)."""
from __future__ import annotations

import pytest

from paged.serve import server


@pytest.fixture
def serve(monkeypatch, capsys, tiny_chat_model):
    """serve(*flags) -> (exit status, stderr): `paged serve` on the tiny model (1,024 positions;
    8 blocks of 16 tokens hold 128), up to where uvicorn would start."""
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)

    def run(*flags: str) -> tuple[int, str]:
        code = server.main(["--model", str(tiny_chat_model), "--port", "0", "--threads", "1", *flags])
        return code, capsys.readouterr().err

    return run


def test_beyond_the_models_maximum_is_an_error_naming_it(serve):
    code, err = serve("--max-model-len", "5000")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ("max_model_len=5000 is greater than the model's maximum of 1024 tokens (max_position_embeddings in its "
            "config): expected at most 1024") in err


def test_beyond_what_the_kv_cache_holds_is_an_error_naming_it(serve):
    code, err = serve("--max-model-len", "512", "--num-gpu-blocks", "8")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ("paged serve: error: --max-model-len 512: the KV cache holds 128 tokens (8 blocks of 16), too few for "
            "one sequence that long; expected at most 128, or a larger cache (--kv-cache-memory-bytes") in err


def test_left_out_it_is_derived_and_the_startup_log_says_so(serve):
    code, err = serve("--num-gpu-blocks", "8")
    assert code == 0, err
    assert ("max_model_len=128: the model's maximum of 1024 tokens, capped to what the KV cache holds (8 blocks of 16;"
            in err)
    code, err = serve()
    assert code == 0 and "max_model_len=1024: the model's maximum (--max-model-len to lower it)" in err
    code, err = serve("--max-model-len", "128", "--num-gpu-blocks", "8")
    assert code == 0 and "max_model_len=128 (--max-model-len)" in err
    code, err = serve("--num-gpu-blocks", "8", "--log-level", "warning")
    assert code == 0 and "max_model_len" not in err
