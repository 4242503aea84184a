"""`paged router` end to end over HTTP, in front of fake backends: each policy's choices, streams
through the official `openai` client, bad input, and a backend that dies and comes back.

A fake backend names itself in every answer's `system_fingerprint`, which is how a test sees
where a request went.
"""
from __future__ import annotations

import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from .conftest import metric, start_router, wait_router, wait_until


def complete(url: str, prompt="hi", max_tokens: int = 2, timeout_s: float = 30, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": "fake-model", "prompt": prompt,
                                                      "max_tokens": max_tokens, **extra}, timeout=timeout_s)


def served_by(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["system_fingerprint"]


def router_metric(url: str, name: str, **labels) -> float | None:
    return metric(httpx.get(f"{url}/metrics", timeout=5).text, name, **labels)


def test_round_robin_cycles_through_the_backends_in_order(shared):
    url = shared["round_robin"]
    before = [router_metric(url, "paged_router_routing_decisions_total", backend=b) or 0 for b in shared["backends"]]
    names = [served_by(complete(url)) for _ in range(6)]
    assert len(set(names[:3])) == 3 and names[3:] == names[:3]
    after = [router_metric(url, "paged_router_routing_decisions_total", backend=b) for b in shared["backends"]]
    assert [a - b for a, b in zip(after, before)] == [2, 2, 2]


def test_prefix_aware_keeps_a_prefix_on_one_backend(shared):
    """Two groups, each its prompts sharing a long prefix (one as token ids, one as chat text),
    in three rounds of one request per group at once. The first round spreads the groups (the
    first request, 2 s long, is still running when the second arrives, so least outstanding
    sends it elsewhere); later rounds must follow their prefix, where round robin would move
    them."""
    urls, url = shared["backends"], shared["prefix_aware"]
    ids_prefix = list(range(1000, 1064))
    text_prefix = "You are a helpful assistant who answers in French. " * 2

    def ids_request(i: int) -> str:
        return served_by(complete(url, ids_prefix + [2000 + i] * (i + 1), max_tokens=40 if i == 0 else 2))

    def chat_request(i: int) -> str:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": "fake-model", "max_tokens": 2,
            "messages": [{"role": "system", "content": text_prefix}, {"role": "user", "content": f"question {i}"}]})
        return served_by(r)

    def in_flight() -> float:
        return sum(router_metric(url, "paged_router_backend_outstanding", backend=u) for u in urls)

    served = {"ids": [], "chat": []}
    with ThreadPoolExecutor(2) as pool:
        for i in range(3):
            first = pool.submit(ids_request, i)
            if i == 0:  # the groups' first requests must overlap, for the second to go elsewhere
                wait_until(lambda: in_flight() == 1, "the first request in flight")
            second = pool.submit(chat_request, i)
            served["ids"].append(first.result())
            served["chat"].append(second.result())
    assert len(set(served["ids"])) == 1 and len(set(served["chat"])) == 1, served
    assert served["ids"][0] != served["chat"][0], served


def test_every_answer_names_the_backend_that_gave_it(shared):
    """`x-paged-backend`, whole or streamed: the backend's URL, the one that answered."""
    urls, url = shared["backends"], shared["round_robin"]
    by_name = dict(zip(("b0", "b1", "b2"), urls))
    for _ in range(3):
        r = complete(url)
        assert r.headers["x-paged-backend"] == by_name[served_by(r)]
    with httpx.stream("POST", f"{url}/v1/completions", timeout=30,
                      json={"model": "fake-model", "prompt": "hi", "max_tokens": 2, "stream": True}) as r:
        named = r.headers["x-paged-backend"]
        first = json.loads(next(line for line in r.iter_lines() if line.startswith("data: "))[len("data: "):])
    assert named == by_name[first["system_fingerprint"]]


def test_least_kv_follows_the_scraped_kv_usage(shared):
    urls, url = shared["backends"], shared["least_kv"]

    def set_usage(usages):
        for u, v in zip(urls, usages):
            httpx.post(f"{u}/fake/kv_usage", json={"value": v}, timeout=5)
        wait_until(lambda: all(router_metric(url, "paged_router_backend_kv_usage", backend=u) == v
                               for u, v in zip(urls, usages)), f"the router scraped KV usage {usages}")

    set_usage([0.5, 0.1, 0.9])
    assert {served_by(complete(url)) for _ in range(4)} == {"b1"}
    set_usage([0.05, 0.95, 0.9])
    assert {served_by(complete(url)) for _ in range(4)} == {"b0"}
    set_usage([0.0, 0.0, 0.0])


def test_streams_pass_through_to_the_openai_client(shared):
    client = openai.OpenAI(base_url=f"{shared['round_robin']}/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(model="fake-model", prompt="hi", max_tokens=5, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert [c.choices[0].text for c in chunks if c.choices] == [f"t{i} " for i in range(5)]
    assert chunks[-1].usage.completion_tokens == 5 and chunks[0].system_fingerprint in {"b0", "b1", "b2"}
    chat = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3, stream=True)
    deltas = [c.choices[0].delta.content for c in chat]
    assert deltas == ["t0 ", "t1 ", "t2 "]
    assert client.models.list().data[0].id == "fake-model"
    whole = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
    assert whole.choices[0].message.content == "t0 t1 t2 "


def test_bad_json_is_a_400_and_no_backend_a_503(shared):
    url, nowhere = shared["round_robin"], shared["nowhere"]
    before = router_metric(url, "paged_router_rejected_total", reason="bad_request") or 0
    r = httpx.post(f"{url}/v1/completions", content=b'{"prompt": "hi", ', timeout=10)
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.post(f"{url}/v1/completions", content=b"[1, 2]", timeout=10).status_code == 400
    assert router_metric(url, "paged_router_rejected_total", reason="bad_request") == before + 2
    assert httpx.get(f"{nowhere}/health", timeout=10).status_code == 503
    r = complete(nowhere)
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend"


def test_the_router_says_where_it_listens_and_logs_no_requests(shared):
    """At its default log level the router printed nothing at all (a terminal looked hung, `paged
    launch`'s router.log stayed empty): one line once it is ready, with its address, policy and
    backends, and still no line per request. The router without a backend names its only one out of service."""
    url = shared["round_robin"]
    assert complete(url).status_code == 200
    port = url.rsplit(":", 1)[1]
    lines = (shared["logs"] / f"router-round_robin-{port}.log").read_text().splitlines()
    backends = ", ".join(f"{b} (in service)" for b in shared["backends"])
    assert lines == [f"INFO:     paged router on http://127.0.0.1:{port}: policy round_robin, backends {backends}"]
    nowhere = shared["nowhere"]
    text = (shared["logs"] / f"router-least_outstanding-{nowhere.rsplit(':', 1)[1]}.log").read_text()
    assert text.startswith(f"INFO:     paged router on {nowhere}: policy least_outstanding, backends http")
    assert text.endswith("(out of service)\n")


def test_probes_may_send_head(shared):
    """HEAD /health and /v1/models (load balancers' probes, `curl -I`) were 405: now GET's status
    and headers without the body, also when no backend is in service."""
    for url, path, status in ((shared["round_robin"], "/health", 200), (shared["round_robin"], "/v1/models", 200),
                              (shared["nowhere"], "/health", 503), (shared["nowhere"], "/v1/models", 503)):
        get, head = httpx.get(url + path, timeout=10), httpx.head(url + path, timeout=10)
        assert (head.status_code, head.content) == (status, b"") and get.status_code == status, (path, head)
        assert head.headers["content-type"] == get.headers["content-type"], path
        assert head.headers["content-length"] == get.headers["content-length"], path


def test_every_refusal_is_an_openai_error_and_the_router_keeps_serving(shared):
    """JSON nested past the parser's recursion limit was a 500 with a traceback (and a dropped
    keep-alive connection); unknown routes and methods were FastAPI's {"detail": ...}."""
    url = shared["round_robin"]
    before = router_metric(url, "paged_router_rejected_total", reason="bad_request") or 0
    for method, path, body, status in [("POST", "/v1/completions", b"[" * 60_000, 400),
                                       ("POST", "/v1/chat/completions", b'{"max_tokens": ' + b"9" * 5000 + b"}", 400),
                                       ("GET", "/nope", None, 404), ("GET", "/v1/completions", None, 405),
                                       ("DELETE", "/health", None, 405)]:
        r = httpx.request(method, f"{url}{path}", content=body, timeout=10)
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
    assert router_metric(url, "paged_router_rejected_total", reason="bad_request") == before + 5
    assert served_by(complete(url)) in {"b0", "b1", "b2"}


def test_a_body_over_the_limit_is_413_before_it_is_read_whole(backends, procs):
    """The router held any body in memory to route it: a client could make it buffer gigabytes.
    Its --max-body-bytes (paged serve's default, 4 MiB) refuses more, declared or streamed."""
    started = backends(["b0"])
    url, proc = start_router(procs, [started[0][0]], "round_robin", "--max-body-bytes", "1000")
    wait_router(procs, url, proc, [started[0][0]])
    r = complete(url, prompt="z" * 2000)
    assert r.status_code == 413 and "1000" in r.json()["error"]["message"], r.text

    def chunked():  # no Content-Length
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"z" * 100
        yield b'"}'

    r = httpx.post(f"{url}/v1/completions", content=chunked(), timeout=10)
    assert r.status_code == 413 and "1000" in r.json()["error"]["message"], r.text
    assert served_by(complete(url, prompt="z" * 500)) == "b0"


def test_a_client_that_leaves_while_sending_its_body_is_no_router_error(shared):
    import socket

    url = shared["round_robin"]
    host, port = url.removeprefix("http://").split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
    assert served_by(complete(url)) in {"b0", "b1", "b2"}
    assert router_metric(url, "paged_router_rejected_total", reason="internal_error") is None
    log = next(shared["logs"].glob("router-round_robin-*.log"))
    assert "ClientDisconnect" not in log.read_text()


def test_clients_that_leave_give_their_place_back(shared):
    """A client that leaves mid-stream, or before a plain answer comes, no longer counts as in
    flight at its backend (least_outstanding and prefix_aware would avoid it forever)."""
    url = shared["round_robin"]
    with httpx.stream("POST", f"{url}/v1/completions", timeout=30, json={
            "model": "fake-model", "prompt": "hi", "max_tokens": 100, "stream": True}) as r:
        next(r.iter_lines())
    try:
        complete(url, max_tokens=100, timeout_s=0.3)
    except httpx.TimeoutException:
        pass
    wait_until(lambda: all(router_metric(url, "paged_router_backend_outstanding", backend=b) == 0
                           for b in shared["backends"]), "no request in flight")


def _stream(url: str, started: threading.Event, max_tokens: int) -> tuple[list[str], list[dict]]:
    """(the texts, the errors) of a streamed completion, setting `started` at its first event."""
    texts, errors = [], []
    with httpx.stream("POST", f"{url}/v1/completions", timeout=30,
                      json={"model": "fake-model", "prompt": "hi", "max_tokens": max_tokens, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            started.set()
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                return texts, errors
            event = json.loads(data)
            (errors.append(event["error"]) if "error" in event else texts.append(event["choices"][0]["text"]))
    raise AssertionError(f"the stream ended without data: [DONE] (texts {texts}, errors {errors})")


def test_a_request_that_cannot_connect_is_sent_elsewhere(backends, procs):
    """Before the router's next probe (a minute away here) notices a backend is gone, the
    requests it sends there fail to connect and go to another backend: all succeed."""
    started = backends(["b0", "b1"])
    url, proc = start_router(procs, [u for u, _ in started], "round_robin", "--health-interval-s", "60")
    wait_router(procs, url, proc, [u for u, _ in started])
    procs.stop(started[1][1], signal.SIGKILL)
    assert [served_by(complete(url)) for _ in range(4)] == ["b0"] * 4
    assert router_metric(url, "paged_router_errors_total", backend=started[1][0], reason="connect") == 1


def test_a_backend_killed_mid_run(cluster, backends, procs):
    """A stream in flight on the killed backend ends with an error event then [DONE] (its client
    has had part of an answer: it cannot be retried), never hangs; a plain request there, which
    has had nothing yet, is sent once more, to a survivor, and succeeds (it was a 502: a replica
    dying failed every request waiting on it, and, on a kept-alive connection, the first request
    sent as it died); the others finish; later requests all succeed on the survivors; the backend
    rejoins when it is restarted."""
    started, url = cluster(["b0", "b1", "b2"], "round_robin", ["--token-delay-s", "0.05"])
    urls = [u for u, _ in started]
    outstanding = [lambda u=u: router_metric(url, "paged_router_backend_outstanding", backend=u) for u in urls]
    with ThreadPoolExecutor(5) as pool:
        streams = []
        for _ in range(3):  # one stream per backend, each running before the next is sent
            first_event = threading.Event()
            streams.append(pool.submit(_stream, url, first_event, 60))
            wait_until(first_event.is_set, "the stream's first event")
        plain = []
        for i in (0, 1):  # then one plain request on b0 and one on b1
            plain.append(pool.submit(complete, url, max_tokens=60))
            wait_until(lambda i=i: outstanding[i]() == 2, f"two requests in flight on b{i}")
        procs.stop(started[1][1], signal.SIGKILL)
        results = [s.result() for s in streams]
        answers = [p.result() for p in plain]
    on_dead = [r for r in results if r[1]]
    assert len(on_dead) == 1 and on_dead[0][1][0]["code"] == "backend_failed" and len(on_dead[0][0]) < 60
    assert all(texts == [f"t{i} " for i in range(60)] and not errors for texts, errors in results if not errors)
    assert served_by(answers[0]) == "b0" and served_by(answers[1]) in {"b0", "b2"}
    assert router_metric(url, "paged_router_errors_total", backend=urls[1], reason="retried") == 1

    after = [served_by(complete(url)) for _ in range(9)]
    assert set(after) <= {"b0", "b2"}
    assert router_metric(url, "paged_router_backend_healthy", backend=urls[1]) == 0

    backends(["b1"], "--token-delay-s", "0.05", ports=[int(urls[1].rsplit(":", 1)[1])])
    wait_until(lambda: router_metric(url, "paged_router_backend_healthy", backend=urls[1]) == 1, "b1 rejoins")
    assert "b1" in {served_by(complete(url)) for _ in range(6)}




def test_a_backend_that_hangs_fails_its_requests_in_flight(cluster, procs):
    """A stopped backend keeps its connections open, so nothing breaks by itself: the router takes
    it out at its first failed probe and fails what is in flight there after three, long before
    the read timeout: a stream with an error event then [DONE]; a plain request, which has had
    nothing yet, is sent once more, to the other backend."""
    started, url = cluster(["b0", "b1"], "round_robin", ["--token-delay-s", "0.05"],
                           ["--health-timeout-s", "0.5", "--read-timeout-s", "600"])
    hung = started[0][1]
    with ThreadPoolExecutor(3) as pool:
        first_event = threading.Event()
        stream = pool.submit(_stream, url, first_event, 100)  # b0
        wait_until(first_event.is_set, "the stream's first event")
        on_b1 = pool.submit(complete, url, max_tokens=60)
        wait_until(lambda: router_metric(url, "paged_router_backend_outstanding", backend=started[1][0]) == 1,
                   "a request in flight on b1")
        on_b0 = pool.submit(complete, url, max_tokens=100)
        wait_until(lambda: router_metric(url, "paged_router_backend_outstanding", backend=started[0][0]) == 2,
                   "two requests in flight on b0")
        hung.send_signal(signal.SIGSTOP)
        try:  # (a bound on the wait, for a router that would wait for its read timeout)
            texts, errors = stream.result(timeout=60)
            assert errors and errors[0]["code"] == "backend_failed" and len(texts) < 100
            assert served_by(on_b0.result(timeout=60)) == "b1" and served_by(on_b1.result()) == "b1"
            assert {served_by(complete(url)) for _ in range(4)} == {"b1"}
        finally:
            procs.stop(hung, signal.SIGKILL)


def test_a_kv_aware_router_without_a_tokenizer_says_text_and_chat_go_by_load():
    """Without --tokenizer kv_aware cannot hash text or chat prompts and routes them by load: said
    in its start-up line, so that nobody takes it for cache-aware routing of chats."""
    from paged.serve.router import RouterConfig, startup_line

    def line(**config) -> str:
        return startup_line("http://127.0.0.1:8000", RouterConfig(["http://127.0.0.1:9"], **config), [])

    assert "no --tokenizer: text and chat prompts are routed by load alone" in line(policy="kv_aware")
    assert "load alone" not in line(policy="kv_aware", tokenizer="smollm2-135m")
    assert "load alone" not in line(policy="prefix_aware")
