"""Bad input gets OpenAI's error shape and the right status; the server keeps serving; the API
key and the waiting limit are enforced."""
import asyncio
import json

import httpx
import pytest

from .conftest import engine_flags, running_server


def assert_error(response, status: int, *words: str, param: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    for word in words:
        assert word in error["message"], (word, error["message"])
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(("body", "words"), [
    (b"{bad", ("not valid JSON",)),
    (b"[1, 2]", ("JSON list", "expected an object")),
    (b"\xff\xfe", ("not valid JSON",)),
    (b"[" * 60_000, ("too deeply",)),
])
def test_malformed_json_is_400(server, body, words):
    assert_error(server.post("/v1/completions", content=body), 400, *words)
    assert_error(server.post("/v1/chat/completions", content=body), 400, *words)


def test_unknown_model_is_404(server):
    assert_error(server.post("/v1/completions", json={"model": "gpt-5", "prompt": "x"}), 404, "gpt-5", param="model")


def test_prompt_longer_than_max_model_len_names_both_lengths(server):
    assert_error(server.post("/v1/completions", json={"prompt": "y" * 600}), 400, "600", "max_model_len=512",
                 param="prompt")
    assert_error(server.post("/v1/completions", json={"prompt": [1] * 513}), 400, "513", "512")


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -1), ("temperature", "hot"), ("top_p", 0), ("top_p", 1.5), ("top_k", -2), ("top_k", 0.5),
    ("max_tokens", 0), ("max_tokens", "many"), ("n", 0), ("n", 17), ("seed", -1), ("seed", 1.5), ("stop", 123),
    ("stop", [""]), ("stop_token_ids", ["a"]), ("ignore_eos", "no"), ("min_tokens", -1), ("min_tokens", 600),
    ("stream", "yes"), ("logprobs", 2), ("presence_penalty", 0.5), ("return_token_ids", 1),
])
def test_each_invalid_field_is_400_naming_it(server, field, value):
    for path, body in (("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        assert_error(server.post(path, json={**body, field: value}), 400, field, param=field)


@pytest.mark.parametrize(("prompt", "words"), [
    ([], ("prompt=[]",)), (None, ("prompt=null",)), ([[]], ("prompt",)), (["a", 1], ("prompt",)),
    ([1, -4], ("token id -4",)), ([1, 10**6], ("token id 1000000",)), ("", ("empty",)),
])
def test_bad_prompts_are_400(server, prompt, words):
    assert_error(server.post("/v1/completions", json={"prompt": prompt}), 400, *words, param="prompt")


@pytest.mark.parametrize(("messages", "words"), [
    ("hi", ("messages='hi'",)), ([], ("messages=[]",)), ([{"content": "x"}], ("messages[0].role",)),
    ([{"role": "user"}], ("missing 'content'",)), ([{"role": "user", "content": 7}], ("messages[0].content=7",)),
    ([{"role": "user", "content": [{"type": "image_url"}]}], ("content[0]",)),
])
def test_malformed_messages_are_400(server, messages, words):
    assert_error(server.post("/v1/chat/completions", json={"messages": messages}), 400, *words, param="messages")
    assert_error(server.post("/v1/chat/completions", json={}), 400, "messages", param="messages")


@pytest.mark.parametrize("kwargs", [{"messages": []}, {"bos_token": "x"}, {"chat_template": "x"}, [1]])
def test_chat_template_kwargs_cannot_replace_the_servers_own(server, kwargs):
    body = {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": kwargs}
    assert_error(server.post("/v1/chat/completions", json=body), 400, param="chat_template_kwargs")


def test_body_over_the_limit_is_413(server):
    assert_error(server.post("/v1/completions", json={"prompt": "z" * 70_000}), 413, "65536")

    def chunked():  # no Content-Length: the limit is applied as the body arrives
        yield b'{"prompt": "'
        for _ in range(80):
            yield b"z" * 1000
        yield b'"}'

    assert_error(server.post("/v1/completions", content=chunked()), 413, "65536")


def test_the_server_survives_all_of_it(server):
    assert server.get("/health").status_code == 200
    assert server.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2}).status_code == 200
    assert server.get("/debug/kv").json()["audit"]["ok"]


def assert_head_is_get_without_body(url: str, path: str, **kwargs) -> httpx.Response:
    """HEAD answers what GET does (status, type, length), less the body."""
    get, head = httpx.get(url + path, timeout=30, **kwargs), httpx.head(url + path, timeout=30, **kwargs)
    assert head.status_code == get.status_code and head.content == b"", (path, head.status_code, head.content)
    for header in ("content-type", "content-length"):
        assert head.headers.get(header) == get.headers.get(header), (path, header)
    return head


def test_probes_may_send_head(server):
    """Load balancers' and Kubernetes-style probes (and `curl -I`) send HEAD: it was a 405."""
    for path in ("/health", "/v1/models"):
        assert assert_head_is_get_without_body(server.url, path).status_code == 200
    options = httpx.options(server.url + "/health", timeout=30)  # vLLM answers a plain OPTIONS 405 too
    assert options.status_code == 405 and set(options.headers["allow"].split(", ")) == {"GET", "HEAD"}


@pytest.fixture(scope="module")
def strict_server(tiny_chat_model, tmp_path_factory):
    """An API key from the environment, and one waiting request at most, one running."""
    with running_server(tiny_chat_model, *engine_flags(max_num_seqs=1), "--max-waiting", "1",
                        log_dir=tmp_path_factory.mktemp("logs"), env={"PAGED_API_KEY": "s3cret"}) as s:
        yield s


def test_api_key_is_required_everywhere_but_health_and_metrics(strict_server):
    """vLLM's rule for /v1, /health and /metrics; the KV endpoints (which vLLM serves on a ZMQ
    socket of its own, not over HTTP) and /debug/kv are guarded like /v1."""
    for path in ("/v1/models", "/debug/kv", "/kv/events", "/kv/events?since=3", "/kv/blocks"):
        assert_error(strict_server.get(path), 401, "API key")
        assert_error(strict_server.get(path, headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(strict_server.get(path, headers={"Authorization": "s3cret"}), 401)
        assert strict_server.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert_error(strict_server.post("/v1/completions", json={"prompt": "x"}), 401)
    assert strict_server.get("/health").status_code == 200  # probes and scrapers need no key
    assert assert_head_is_get_without_body(strict_server.url, "/health").status_code == 200
    assert assert_head_is_get_without_body(strict_server.url, "/v1/models").status_code == 401
    assert strict_server.get("/metrics").status_code == 200


def test_a_full_queue_answers_503_with_retry_after(strict_server):
    """One request runs, one waits: a burst of eight long requests, arriving within milliseconds
    where each takes hundreds of steps, must see the rest refused at once rather than queued."""
    body = {"prompt": "long", "max_tokens": 300, "ignore_eos": True}

    async def main():
        async with httpx.AsyncClient(base_url=strict_server.url, headers={"Authorization": "Bearer s3cret"},
                                     timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(8)))

    responses = asyncio.run(main())
    refused = [r for r in responses if r.status_code == 503]
    assert refused and all(r.status_code == 200 for r in responses if r not in refused)
    assert_error(refused[0], 503, "busy", "--max-waiting 1")
    assert refused[0].headers["retry-after"] == "1"


def test_the_doctor_reads_debug_kv_with_the_key(strict_server, capsys, monkeypatch):
    """`paged doctor --api-key` (or $PAGED_API_KEY) audits a keyed server's blocks; without the
    key it says it cannot read /debug/kv (exit 2) rather than skip the audit as if there were none."""
    from paged.serve.doctor import main

    monkeypatch.delenv("PAGED_API_KEY", raising=False)
    assert main([strict_server.url, "--interval", "0", "--json"]) == 2
    assert "needs the server's API key" in capsys.readouterr().err
    main([strict_server.url, "--interval", "0", "--json", "--api-key", "s3cret"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["KV block audit: no leaks"]["status"] == "PASS"


def test_a_number_too_long_to_convert_is_400(server):
    """Python refuses to turn more than 4300 digits into an int (a ValueError, not a JSONDecodeError)."""
    body = b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}"
    assert_error(server.post("/v1/completions", content=body), 400, "not valid JSON", "digits")


@pytest.mark.parametrize(("path", "body", "where"), [
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", b'{"prompt": ["ok", "\\udc80"]}', "prompt[1]"),
    ("/v1/completions", b'{"prompt": "x", "stop": ["\\ud800"]}', "stop[0]"),
    ("/v1/completions", b'{"prompt": "x", "model": "\\ud800"}', "model"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages[0].content"),
])
def test_a_lone_surrogate_is_400_naming_where(server, path, body, where):
    """JSON may escape half a UTF-16 pair (`\\ud800`), which no UTF-8 text can hold: the tokenizer
    raised a TypeError (a 500), and an error message quoting it could not even be encoded."""
    assert_error(server.post(path, content=body), 400, where, "surrogate")


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_a_body_that_is_not_declared_json_is_400(server, content_type):
    """As vLLM (FastAPI validates only declared JSON): `curl -d` sends form encoding."""
    body = b'{"prompt": "x", "max_tokens": 1}'
    assert_error(server.post("/v1/completions", content=body, headers={"content-type": content_type}), 400,
                 content_type, "application/json")
    for ok in ("application/json; charset=utf-8", "application/vnd.api+json"):
        assert server.post("/v1/completions", content=body, headers={"content-type": ok}).status_code == 200


@pytest.mark.parametrize("path", ["/kv/events?since=abc", "/debug/steps?since=-1"])
def test_a_bad_query_parameter_is_400_in_openais_shape(server, path):
    assert_error(server.get(path), 400, "since", param="since")


def test_a_client_that_leaves_while_sending_its_body_is_no_server_error(server):
    """A body cut short is the client's doing: no 500 in the error counts, no traceback in the log."""
    import socket

    from .conftest import metric

    host, port = server.url.removeprefix("http://").split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
    assert server.post("/v1/completions", json={"prompt": "ok", "max_tokens": 1}).status_code == 200
    assert metric(server.get("/metrics").text, "paged:request_errors_total", status="500") is None
    assert "ClientDisconnect" not in server.log.read_text()


def test_a_misspelt_field_is_answered_and_named_in_the_log(server):
    """`"temprature": 0.5` gave a normal completion and no sign that the field was ignored; vLLM
    answers too, and logs a warning naming the ignored fields. Fields the server reads draw none."""
    from .conftest import wait_until

    warning = "The following fields were present in the request but ignored: "
    start = len(server.log.read_text())  # the server (and its log) serve the package's other tests too

    def warned() -> list[str]:
        return [x for x in server.log.read_text()[start:].splitlines() if warning in x]

    assert server.post("/v1/completions", json={"prompt": "ok", "max_tokens": 1, "temperature": 0.5, "user": "u",
                                                "max_completion_tokens": 1}).status_code == 200
    assert server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                                     "chat_template_kwargs": {}, "stream": False}).status_code == 200
    assert server.post("/v1/completions", json={"prompt": "ok", "max_tokens": 1, "temprature": 0.5}).status_code == 200
    assert server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                                     "top_kk": 3, "prompt": "x"}).status_code == 200
    wait_until(lambda: len(warned()) >= 2, "the server logs two warnings")
    assert warned() == [f"{warning}['temprature']", f"{warning}['prompt', 'top_kk']"]
