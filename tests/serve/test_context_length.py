"""prompt + max_tokens beyond max_model_len (512 here) is a 400 naming the context length, the
total asked for and its split, as vLLM's server answers, for completions and chat, streamed or
not; left out, max_tokens is what the context has left. The engine's API caps instead (vLLM's
`LLM` does too): `tests/engine/test_bad_input.py`."""
import pytest

from .test_bad_input import assert_error

CHAT = "/v1/chat/completions"
QUIET = {"ignore_eos": True, "temperature": 0}


def chat_body(n_chars: int, **fields) -> dict:
    return {"messages": [{"role": "user", "content": "q" * n_chars}], **fields}


def chat_prompt_tokens(server, n_chars: int) -> int:
    r = server.post(CHAT, json=chat_body(n_chars, max_tokens=1))
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_past_the_context_is_400_with_the_split(server, stream):
    error = assert_error(server.post("/v1/completions", json={"prompt": [7] * 500, "max_tokens": 20, "stream": stream}),
                         400, "maximum context length is 512 tokens", "requested 520 tokens", "500 in the prompt",
                         "20 in the completion", param="max_tokens")
    assert error["type"] == "invalid_request_error"


def test_a_chat_past_the_context_is_400_with_the_split(server):
    p = chat_prompt_tokens(server, 400)
    for field in ("max_tokens", "max_completion_tokens"):
        assert_error(server.post(CHAT, json=chat_body(400, **{field: 600 - p})), 400, "maximum context length is 512",
                     "requested 600 tokens", f"{p} in the messages", f"{600 - p} in the completion", param="max_tokens")


def test_a_prompt_that_fills_the_context_is_400(server):
    """No room for one output token: vLLM refuses it (the engine would have capped it at one)."""
    assert_error(server.post("/v1/completions", json={"prompt": [7] * 512}), 400, "512 input tokens",
                 "max_model_len=512", param="prompt")
    assert_error(server.post("/v1/completions", json={"prompt": [[7] * 4, [7] * 600]}), 400, "prompt 1:",
                 "600 input tokens", param="prompt")


def test_exactly_the_context_runs_to_the_end(server):
    r = server.post("/v1/completions", json={"prompt": [7] * 500, "max_tokens": 12, **QUIET})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 12 and r.json()["choices"][0]["finish_reason"] == "length"


def test_without_max_tokens_a_request_gets_what_the_context_has_left(server):
    p = chat_prompt_tokens(server, 480)
    chat = server.post(CHAT, json=chat_body(480, **QUIET)).json()
    assert chat["usage"]["completion_tokens"] == 512 - p and chat["choices"][0]["finish_reason"] == "length"
    # completions: OpenAI's default of 16 where it fits, else what is left
    short = server.post("/v1/completions", json={"prompt": [7] * 100, **QUIET}).json()
    assert short["usage"]["completion_tokens"] == 16
    tight = server.post("/v1/completions", json={"prompt": [7] * 505, **QUIET}).json()
    assert tight["usage"]["completion_tokens"] == 7
    assert_error(server.post("/v1/completions", json={"prompt": [7] * 505, "min_tokens": 10}), 400, "min_tokens",
                 param="min_tokens")
