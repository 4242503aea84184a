"""`paged doctor`: the quantile it reads from histogram buckets, its tolerance of servers that
export less (SKIP, not a crash), and its verdicts on a healthy and a sick fake server."""
from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from paged.serve.doctor import main, run_checks
from paged.serve.scrape import Scrape, histogram_quantile


def test_histogram_quantile_interpolates_within_a_bucket_as_prometheus():
    buckets = {0.1: 50.0, 0.5: 90.0, 1.0: 99.0, 2.0: 100.0, math.inf: 100.0}
    assert histogram_quantile(0.5, buckets) == 0.1
    assert histogram_quantile(0.99, buckets) == 1.0
    assert math.isclose(histogram_quantile(0.7, buckets), 0.1 + 0.4 * 20 / 40)
    assert histogram_quantile(0.99, {1.0: 0.0, math.inf: 10.0}) == 1.0  # in +Inf: the highest finite bound
    assert math.isnan(histogram_quantile(0.99, {1.0: 0.0, math.inf: 0.0}))


def test_a_server_that_exports_nothing_of_it_is_skipped_not_failed():
    empty = Scrape("# TYPE up gauge\nup 1\n")
    checks = run_checks(empty, empty, 1.0, None)
    assert len(checks) == 8 and {c.status for c in checks} == {"SKIP"}


def test_counters_are_read_over_the_interval():
    def scrape(tokens: int, preemptions: int, finished: int) -> Scrape:
        return Scrape(f"vllm:generation_tokens_total {tokens}\nvllm:num_preemptions_total {preemptions}\n"
                      f"vllm:request_success_total {finished}\n")

    def statuses(after: Scrape) -> tuple[str, str]:
        by_name = {c.name: c.status for c in run_checks(scrape(1000, 5, 100), after, 2.0, None, gpus=2)}
        return by_name["> 500 output tokens/s per GPU"], by_name["preemptions < 1% of requests"]

    # (tokens - 1000) / 2 s / 2 GPUs against 500; (preemptions - 5) / (finished - 100) against 1%
    assert statuses(scrape(3000, 5, 150)) == ("WARN", "PASS")  # exactly 500 tokens/s is not above it
    assert statuses(scrape(3004, 6, 200)) == ("PASS", "PASS")
    assert statuses(scrape(3004, 7, 150)) == ("PASS", "WARN")


def doctor(url: str, capsys) -> tuple[int, dict[str, dict]]:
    code = main([url, "--interval", "0.3", "--json"])
    return code, {c["name"]: c for c in json.loads(capsys.readouterr().out)}


def test_verdicts_on_a_healthy_and_a_sick_server(backends, capsys):
    (healthy, _), = backends(["healthy"], "--kv-usage", "0.75")
    (sick, _), = backends(["sick"], "--kv-usage", "0.95", "--leaks", "2", "--token-delay-s", "0.04")
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda args: httpx.post(f"{args[0]}/v1/completions", timeout=30, json={
            "model": "fake-model", "prompt": "a b c d", "max_tokens": args[1]}), [(healthy, 4)] * 3 + [(sick, 30)] * 3))

    code, checks = doctor(healthy, capsys)
    statuses = {name: c["status"] for name, c in checks.items()}
    assert statuses["KV cache usage in 60-90%"] == "PASS"
    assert statuses["P99 E2E latency < 1 s"] == statuses["P99 TTFT < 1 s"] == "PASS"
    assert statuses["KV block audit: no leaks"] == statuses["fragmentation < 10%"] == "PASS"
    assert statuses["> 500 output tokens/s per GPU"] == "WARN" and code == 1  # no traffic in the interval

    code, checks = doctor(sick, capsys)
    assert code == 1
    assert checks["KV cache usage in 60-90%"]["status"] == "WARN" and "95%" in checks["KV cache usage in 60-90%"][
        "detail"]
    assert checks["P99 E2E latency < 1 s"]["status"] == "WARN"
    assert "since the server started" in checks["P99 E2E latency < 1 s"]["detail"]
    assert checks["KV block audit: no leaks"]["status"] == "WARN" and "2 leaked" in checks[
        "KV block audit: no leaks"]["detail"]


def test_an_unreachable_server_is_exit_status_2(capsys):
    from .conftest import free_port

    assert main([f"http://127.0.0.1:{free_port()}", "--interval", "0"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_router_is_named_with_the_backends_to_check_instead(cluster, capsys):
    """The README's `paged launch --port 8000` then `paged doctor http://127.0.0.1:8000` printed eight
    SKIPs (a router exports no vllm: metrics) and exited 0, with no word of why."""
    started, router = cluster(["b0", "b1"], "round_robin")
    assert main([router, "--interval", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"doctor: {router} is a paged router, which exports no engine metrics; point doctor at its backends: "
        + ", ".join(f"paged doctor {url}" for url, _ in started)]


def test_a_url_without_its_scheme_is_named(capsys):
    """127.0.0.1:8000 got httpx's "Request URL is missing an 'http://' or 'https://' protocol"."""
    with pytest.raises(SystemExit) as e:
        main(["127.0.0.1:8000"])
    assert e.value.code == 2
    assert "url 127.0.0.1:8000: expected a server's URL, such as http://127.0.0.1:8000" in capsys.readouterr().err


def test_against_the_real_server_it_reads_every_check_and_a_leak(server, model_name, capsys):
    """The real `paged serve` exports what doctor reads: no check is skipped for a missing
    metric, the audit of a healthy pool passes, and the same report with a leaked block warns."""
    from paged.serve.doctor import check_leaks

    for i in range(3):
        r = server.post("/v1/completions", json={"model": model_name, "prompt": [5, 6, 7, 8 + i], "max_tokens": 4})
        assert r.status_code == 200, r.text
    _, checks = doctor(server.url, capsys)
    skipped = {name: c["detail"] for name, c in checks.items() if c["status"] == "SKIP"}
    assert all(name.startswith("prefix cache hit rate") for name in skipped), skipped  # no prompt in 0.3 s
    assert checks["KV block audit: no leaks"]["status"] == "PASS"
    assert checks["fragmentation < 10%"]["status"] in ("PASS", "WARN")

    report = server.get("/debug/kv").json()
    report["audit"] = {**report["audit"], "ok": False, "leaked_blocks": [3]}
    leak = check_leaks(report)
    assert leak.status == "WARN" and "1 leaked" in leak.detail
