"""`paged doctor URL`: the article's health checks of a running server, each PASS or WARN with why
(SKIP when the server does not export what a check reads).

    paged doctor http://127.0.0.1:8000 --interval 5

It reads `/metrics` twice, `--interval` seconds apart (rates and tail latencies are over that
window; latencies fall back to everything since the server started when no request finished in
it), and `/debug/kv` (with `--api-key`, or $PAGED_API_KEY, when the server has a key). Metric
names are vLLM's, so it checks a vLLM server too:
`vllm:kv_cache_usage_perc` (`vllm:gpu_cache_usage_perc` before v1), the histograms
`vllm:e2e_request_latency_seconds` and `vllm:time_to_first_token_seconds`, the counters
`vllm:generation_tokens_total`, `vllm:request_success_total`, `vllm:num_preemptions_total`,
`vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total`, and this project's gauge
`paged:kv_cache_fragmentation`. Thresholds: `paged.health`.

`GET /debug/kv` (this project's server, `paged.serve.debug_kv.kv_report`; optional) answers:

    {"pool": {"num_blocks", "block_size", "free", "cached", "used", "fragmentation", "allocations", "frees"},
     "requests": [{"request_id", "sequence", "status", "num_tokens", "num_computed_tokens", "block_table"}, ...],
     "audit": {"ok": bool, "mismatched_ref_counts": [{"block", "ref_cnt", "holders"}, ...],
               "leaked_blocks": [block id, ...], "orphan_tables": [request id, ...]}}

`pool`: the GPU block pool, where free (no reference; `cached` of them still hold a prefix-cache
entry) + used (referenced) = num_blocks, and fragmentation is the share of allocated slots
holding no token; `requests`: who holds which blocks; `audit`: every block's reference count
checked against the live block tables that hold it (`leaked_blocks`: referenced by no live table).

Exit status: 0 when nothing warns, 1 when a check warns, 2 when the server cannot be read (or is
`paged router`, which runs no engine: doctor names its backends, the servers to check).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import httpx

from paged import health
from paged.help_formatter import ArgumentParser, HelpFormatter

from .backends import KV_USAGE_METRICS, is_server_url
from .scrape import Scrape, bucket_delta, histogram_quantile

E2E = "vllm:e2e_request_latency_seconds"
ROUTER_GAUGE = "paged_router_backend_healthy"  # paged router exports it, one sample per backend
TTFT = "vllm:time_to_first_token_seconds"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # PASS, WARN or SKIP
    detail: str


def _band(name: str, ok: bool, detail: str) -> Check:
    return Check(name, "PASS" if ok else "WARN", detail)


def _delta(before: Scrape, after: Scrape, name: str) -> float | None:
    a, b = after.value(name), before.value(name)
    return None if a is None else a - (b or 0.0)


def check_kv_usage(before: Scrape, after: Scrape) -> Check:
    name = "KV cache usage in 60-90%"
    values = [v for v in (before.max(*KV_USAGE_METRICS), after.max(*KV_USAGE_METRICS)) if v is not None]
    if not values:
        return Check(name, "SKIP", f"the server exports none of {list(KV_USAGE_METRICS)}")
    usage = sum(values) / len(values)
    lo, hi = health.KV_BAND
    if usage < lo:
        why = "the cache idles: the server could take more concurrent requests (more load, or fewer replicas)"
    elif usage > hi:
        why = "close to full: new requests wait and running ones get preempted (more replicas or KV memory)"
    else:
        why = "memory is used and has headroom"
    return _band(name, lo <= usage <= hi, f"{usage:.0%}: {why}")


def check_p99(before: Scrape, after: Scrape, histogram: str, what: str) -> Check:
    name = f"P99 {what} < {health.P99_LATENCY_S:g} s"
    total = after.buckets(histogram)
    if not total:
        return Check(name, "SKIP", f"the server exports no {histogram} histogram")
    window = bucket_delta(total, before.buckets(histogram))
    buckets, when = (window, "in the interval") if max(window.values()) > 0 else (total, "since the server started")
    n = int(max(buckets.values()))
    if not n:
        return Check(name, "SKIP", "no request has finished yet")
    p99 = histogram_quantile(0.99, buckets)
    why = "" if p99 < health.P99_LATENCY_S else ": users wait; look at queueing (KV usage, batch size) first"
    return _band(name, p99 < health.P99_LATENCY_S, f"{p99:.3g} s over {n} requests {when} (from the histogram's "
                                                   f"buckets){why}")


def check_tokens_per_s(before: Scrape, after: Scrape, interval_s: float, gpus: int) -> Check:
    name = f"> {health.TOKENS_PER_S_PER_GPU:g} output tokens/s per GPU"
    tokens = _delta(before, after, "vllm:generation_tokens_total")
    if tokens is None:
        return Check(name, "SKIP", "the server exports no vllm:generation_tokens_total")
    rate = tokens / interval_s / gpus
    why = "" if rate > health.TOKENS_PER_S_PER_GPU else ": the GPU is underused (too little load, or small batches)"
    return _band(name, rate > health.TOKENS_PER_S_PER_GPU,
                 f"{rate:,.0f} tokens/s per GPU over {interval_s:.1f} s on {gpus} GPU(s){why}")


def check_preemptions(before: Scrape, after: Scrape) -> Check:
    name = f"preemptions < {health.PREEMPTION_RATE:.0%} of requests"
    preempted = _delta(before, after, "vllm:num_preemptions_total")
    finished = _delta(before, after, "vllm:request_success_total")
    if preempted is None or finished is None:
        return Check(name, "SKIP", "the server exports no vllm:num_preemptions_total or vllm:request_success_total")
    if not finished:
        return _band(name, not preempted, f"{preempted:.0f} preemptions and no request finished in the interval")
    rate = preempted / finished
    why = ": the KV cache is too small for the batch (fewer max_num_seqs, or more memory)" if rate > \
        health.PREEMPTION_RATE else ""
    return _band(name, rate <= health.PREEMPTION_RATE,
                 f"{preempted:.0f} preemptions for {finished:.0f} finished requests ({rate:.1%}){why}")


def check_fragmentation(after: Scrape, kv: dict | None) -> Check:
    name = f"fragmentation < {health.FRAGMENTATION:.0%}"
    pool = (kv or {}).get("pool") or {}
    value = pool.get("fragmentation", after.value("paged:kv_cache_fragmentation"))
    if value is None:
        return Check(name, "SKIP", "neither /debug/kv nor paged:kv_cache_fragmentation says")
    why = ": blocks too large for the requests' lengths (a smaller block_size)" if value >= health.FRAGMENTATION \
        else ""
    return _band(name, value < health.FRAGMENTATION, f"{value:.1%} of allocated KV slots hold no token{why}")


def check_prefix_hits(before: Scrape, after: Scrape) -> Check:
    name = f"prefix cache hit rate > {health.PREFIX_HIT_RATE:.0%}"
    queries = _delta(before, after, "vllm:prefix_cache_queries_total")
    hits = _delta(before, after, "vllm:prefix_cache_hits_total")
    if queries is None or hits is None:
        return Check(name, "SKIP", "the server exports no vllm:prefix_cache_queries_total / _hits_total")
    if not queries:
        return Check(name, "SKIP", "no prompt was looked up in the interval")
    rate = hits / queries
    why = (": prompts share little, or a router spreads requests away from their cached prefixes (prefix_aware)"
           if rate <= health.PREFIX_HIT_RATE else "")
    return _band(name, rate > health.PREFIX_HIT_RATE, f"{rate:.1%} of prompt tokens found cached{why}")


def check_leaks(kv: dict | None) -> Check:
    name = "KV block audit: no leaks"
    if kv is None:
        return Check(name, "SKIP", "the server has no /debug/kv")
    audit, pool = kv.get("audit") or {}, kv.get("pool") or {}
    problems = []
    if "ok" not in audit:
        problems.append("no audit in /debug/kv")
    elif not audit["ok"]:
        problems.append(f"the audit found {len(audit.get('leaked_blocks') or [])} leaked block(s), "
                        f"{len(audit.get('mismatched_ref_counts') or [])} reference count(s) off and "
                        f"{len(audit.get('orphan_tables') or [])} table(s) of no live request")
    parts = [pool.get(k) for k in ("free", "used", "num_blocks")]
    if None not in parts and parts[0] + parts[1] != parts[2]:
        problems.append(f"free {parts[0]} + used {parts[1]} != {parts[2]} blocks")
    if problems:
        return Check(name, "SKIP" if problems == ["no audit in /debug/kv"] else "WARN", "; ".join(problems))
    return Check(name, "PASS", f"every block's reference count matches its holders ({pool.get('used', '?')} of "
                               f"{pool.get('num_blocks', '?')} blocks in use)")


def run_checks(before: Scrape, after: Scrape, interval_s: float, kv: dict | None, gpus: int = 1) -> list[Check]:
    return [check_kv_usage(before, after), check_p99(before, after, E2E, "E2E latency"),
            check_p99(before, after, TTFT, "TTFT"), check_tokens_per_s(before, after, interval_s, gpus),
            check_preemptions(before, after), check_fragmentation(after, kv), check_prefix_hits(before, after),
            check_leaks(kv)]


class RouterURL(ValueError):
    """The URL is `paged router`'s, which runs no engine: every check would SKIP (the README's own
    example, `paged launch --port 8000` then `paged doctor http://127.0.0.1:8000`, printed eight
    SKIPs and exited 0), so doctor names the backends to point it at instead."""

    def __init__(self, url: str, backends: list[str]) -> None:
        super().__init__(f"{url} is a paged router, which exports no engine metrics; point doctor at its "
                         f"backends: {', '.join(f'paged doctor {b}' for b in backends)}")


def router_backends(scrape: Scrape) -> list[str] | None:
    """The backends' URLs if the scrape is `paged router`'s (its own gauge, one sample per backend:
    `paged.serve.router_metrics`), else None."""
    samples = scrape.samples.get(ROUTER_GAUGE)
    return None if samples is None else [s.labels["backend"] for s in samples]


def read_server(url: str, interval_s: float, api_key: str | None = None) -> tuple[Scrape, Scrape, float, dict | None]:
    """Two scrapes of /metrics `interval_s` apart (and the time between them), and /debug/kv
    (None when the server has none); a ValueError when the server refuses `api_key` there, a
    RouterURL (before the interval) when it is a router."""
    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(timeout=10.0) as client:
        def scrape() -> Scrape:
            r = client.get(f"{url}/metrics")
            r.raise_for_status()
            return Scrape(r.text)

        t0, before = time.monotonic(), scrape()
        if (backends := router_backends(before)) is not None:
            raise RouterURL(url, backends)
        time.sleep(interval_s)
        after, t1 = scrape(), time.monotonic()
        r = client.get(f"{url}/debug/kv", headers=headers)
        if r.status_code == 401:
            raise ValueError(f"{url}/debug/kv needs the server's API key: --api-key or $PAGED_API_KEY")
        kv = r.json() if r.status_code == 200 else None
    return before, after, t1 - t0, kv


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="paged doctor", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--interval", type=float, default=5.0,
                   help="seconds between the two scrapes of /metrics, over which rates and tail latencies are "
                        "read; 0: back to back")
    p.add_argument("--gpus", type=int, default=1, help="GPUs behind the server, for output tokens/s per GPU")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--api-key", default=os.environ.get("PAGED_API_KEY"),
                   help="the server's --api-key, sent for /debug/kv (default: $PAGED_API_KEY; none: no key)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not args.interval >= 0:  # 0: the two scrapes back to back (rates over the time they took)
        p.error(f"--interval {args.interval}: expected seconds >= 0")
    if args.gpus < 1:
        p.error(f"--gpus {args.gpus}: expected at least 1")
    if not is_server_url(args.url):
        p.error(f"url {args.url}: expected a server's URL, such as http://127.0.0.1:8000")
    url = args.url.rstrip("/")
    try:
        before, after, interval_s, kv = read_server(url, args.interval, args.api_key)
    except RouterURL as e:
        print(f"doctor: {e}", file=sys.stderr)
        return 2
    except (httpx.HTTPError, ValueError) as e:
        print(f"doctor: cannot read {url}: {e}", file=sys.stderr)
        return 2
    checks = run_checks(before, after, interval_s, kv, args.gpus)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            print(f"{c.status:<5} {c.name}: {c.detail}")
    return 1 if any(c.status == "WARN" for c in checks) else 0

