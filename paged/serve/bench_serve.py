"""`paged bench serve`: replay a trace in real time against any OpenAI-compatible server.

    paged bench serve --url http://127.0.0.1:8000 --trace traces/azure_llm_2023_conv.csv \\
        --num-requests 200 --time-scale 0.5 --slo-ttft-s 1 --slo-tpot-s 0.1 --json out.json
    paged bench serve --url ... --shared-prefix 8,1024,64,128 --num-requests 500 --rate 10 --json out.json

The workload options are the simulator's (`python -m sim run`), so one command line selects the
same requests for a prediction and a measurement; as sim run caps requests to the model's context,
it caps them to the server's (the `max_model_len` its /v1/models publishes, or --max-model-len;
--no-cap sends them whole, to be refused). Prompts are token ids of the trace's lengths
(`paged.serve.prompts`: shared prefix ids become shared tokens), outputs the trace's lengths
(`max_tokens` with `ignore_eos`), sent open-loop at the trace's times through streamed
`/v1/completions` (`paged.serve.replay`). Requests are greedy unless --temperature, --top-p or --top-k
say otherwise, as `vllm bench serve` sends them: a server's own default, temperature 1, costs the
engine about 1 ms more per sampled token on a CPU than the greedy step profile timed.

The `--json` summary has the simulator's keys wherever they mean the same thing, computed by
the same functions (`paged.metrics_summary`): `num_requests`, `num_finished`, `num_capped`, `throughput_req_s`,
`input_tokens_per_s`, `output_tokens_per_s` (finished requests, over `wall_time_s`: from the
first send to the last answer), `ttft_s`, `tpot_s`, `e2e_s` (mean/p50/p90/p99 over finished
requests; TTFT and E2E from when the request was sent), `itl_s` (over every gap between two
streamed chunks), `prefix_cache_hit_rate` (the prompt tokens the server's usage reported cached, over
the requests it reported them for) and `goodput` (with --slo-ttft-s/--slo-tpot-s). Beyond them: `num_errors`
(requests that did not finish, with `errors`: how many of each message) and `send_lateness_s`
(how late requests were sent against their schedule: mean/p50/p90/p99/max).

The `--requests-csv` has a row per request, under the simulator's names where they mean the same:
`prefix_hit_tokens` is what the server's usage reports cached (`prompt_tokens_details.cached_tokens`,
-1 if it does not), and `backend` the one a `paged router` sent it to (its `x-paged-backend` header),
the simulator's `replica`.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter

import httpx
import numpy as np

from paged.core.validation import is_power_of_two
from paged.help_formatter import ArgumentParser, RawDescriptionHelpFormatter
from paged.metrics_summary import format_summary, goodput, jsonable, stats_of, tpot
from paged.output_paths import check_output_paths, written
from paged.workloads.options import add_workload_options, positive, workload_from_args
from paged.workloads.workload import Workload

from .prompts import PromptMaker
from .replay import ERROR, FINISHED, Records
from .replay_workers import replay_in_processes


def summarize(workload: Workload, rec: Records, wall_s: float, slo_ttft_s: float | None = None,
              slo_tpot_s: float | None = None) -> dict:
    done = rec.status == FINISHED
    ttft, e2e = rec.first_token_s - rec.sent_s, rec.finished_s - rec.sent_s
    per_token = tpot(rec.first_token_s, rec.finished_s, rec.num_generated)
    lateness = rec.sent_s - rec.scheduled_s
    itls = [rec.itl_s[i] for i in np.flatnonzero(done)]
    out = {
        "num_requests": len(workload),
        "num_finished": int(done.sum()),
        "num_errors": int((rec.status == ERROR).sum()),
        "num_capped": workload.num_capped,
        "wall_time_s": wall_s,
        "throughput_req_s": done.sum() / wall_s if wall_s else math.nan,
        "input_tokens_per_s": float(workload.num_prompt_tokens[done].sum() / wall_s) if wall_s else math.nan,
        "output_tokens_per_s": float(rec.num_generated[done].sum() / wall_s) if wall_s else math.nan,
        "ttft_s": stats_of(ttft[done]),
        "tpot_s": stats_of(per_token[done]),
        "e2e_s": stats_of(e2e[done]),
        "itl_s": stats_of(np.concatenate(itls) if itls else np.zeros(0)),
        "prefix_cache_hit_rate": prefix_cache_hit_rate(workload, rec),
        "send_lateness_s": {**stats_of(lateness), "max": float(np.nanmax(lateness)) if len(lateness) else math.nan},
        "errors": dict(Counter(e for e in rec.error if e).most_common(10)),
    }
    if slo_ttft_s is not None or slo_tpot_s is not None:
        out["goodput"] = goodput(done, ttft, per_token, math.inf if slo_ttft_s is None else slo_ttft_s,
                                 math.inf if slo_tpot_s is None else slo_tpot_s, wall_s)
    return out


def prefix_cache_hit_rate(workload: Workload, rec: Records) -> float:
    """Prompt tokens the server reported cached / prompt tokens, over the requests whose usage
    reported cached tokens (each counted once, as its answer says); NaN when none did: a server
    that does not report them is not a server that hits nothing."""
    reported = rec.cached_tokens >= 0
    prompt = workload.num_prompt_tokens[reported].sum()
    return float(rec.cached_tokens[reported].sum() / prompt) if prompt else math.nan


def requests_frame(workload: Workload, rec: Records):
    """One row per request, named as the simulator's `--requests-csv` where they mean the same."""
    import pandas as pd

    return pd.DataFrame({
        "request_id": np.arange(len(workload)), "arrival_s": rec.scheduled_s, "sent_s": rec.sent_s,
        "num_prompt_tokens": workload.num_prompt_tokens, "num_output_tokens": workload.num_output_tokens,
        "num_generated": rec.num_generated, "first_token_s": rec.first_token_s, "finished_s": rec.finished_s,
        "ttft_s": rec.first_token_s - rec.sent_s, "tpot_s": tpot(rec.first_token_s, rec.finished_s, rec.num_generated),
        "e2e_s": rec.finished_s - rec.sent_s,
        "max_itl_s": [x.max() if len(x) else np.nan for x in rec.itl_s],
        "prefix_hit_tokens": rec.cached_tokens, "backend": rec.backend,
        "status": ["finished" if s == FINISHED else "error" for s in rec.status], "error": rec.error,
    })


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="paged bench serve", description=__doc__.split("\n\n")[0],
                                formatter_class=RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--url", required=True, help="the server (or router), e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="one the server's /v1/models lists (default: its first)")
    add_workload_options(p)
    g = p.add_argument_group("prompts")
    g.add_argument("--vocab-size", type=int, default=32000, help="token ids stay below it: at most the model's")
    g.add_argument("--min-token-id", type=int, default=1000, help="token ids start here, above special tokens")
    g.add_argument("--block-size", type=int, default=16, help="tokens per id of a --shared-prefix group's prompt")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="cap longer requests to it, as sim run does (default: the max_model_len the server publishes "
                        "on /v1/models, as vLLM and paged serve do; none if it does not; --no-cap: no cap)")
    g = p.add_argument_group("sampling", "what every request asks for (vllm bench serve's options and defaults)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default) is greedy, as vllm bench serve sends unless told; a server's own default is 1")
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling's mass (default: not sent)")
    g.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens (default: not sent)")
    g = p.add_argument_group("output")
    g.add_argument("--json", default=None, help="write the summary (and the run's settings) as one JSON object")
    g.add_argument("--requests-csv", default=None, help="write the per-request records")
    g.add_argument("--slo-ttft-s", type=positive, default=None, help="goodput: TTFT target, in seconds")
    g.add_argument("--slo-tpot-s", type=positive, default=None, help="goodput: TPOT target, in seconds")
    g.add_argument("--timeout-s", type=positive, default=600.0,
                   help="seconds of the longest wait for a byte of an answer")
    g.add_argument("--workers", type=int, default=1,
                   help="processes sharing the replay: one times about 10k streamed tokens/s (see replay_workers)")
    g.add_argument("--no-progress", dest="progress_bar", action="store_false", help="no progress bar")
    return p


def sampling_fields(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """The request fields of --temperature, --top-p and --top-k (those given), checked as the server
    checks them, so a bad value stops the run here instead of failing every request."""
    if not 0 <= args.temperature < math.inf:
        parser.error(f"--temperature {args.temperature}: expected a finite number >= 0 (0 is greedy)")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        parser.error(f"--top-p {args.top_p}: expected a mass in (0, 1]")
    if args.top_k is not None and args.top_k < -1:
        parser.error(f"--top-k {args.top_k}: expected >= 0 (0 or -1 keeps every token)")
    given = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    return {k: v for k, v in given.items() if v is not None}


def served_models(url: str) -> dict[str, int | None]:
    """The models the server lists, each with the context it publishes (`max_model_len`, as vLLM and
    paged serve do; None where it does not); an unreachable or non-OpenAI URL is a usage error naming it."""
    try:
        r = httpx.get(f"{url}/v1/models", timeout=30)
        r.raise_for_status()
        models = {m["id"]: _context(m.get("max_model_len")) for m in r.json()["data"]}
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--url {url}: cannot list its models at /v1/models ({type(e).__name__}: {e}); expected "
                         "a running OpenAI-compatible server, such as http://127.0.0.1:8000") from None
    if not models:
        raise ValueError(f"--url {url}: its /v1/models lists no model; expected a server with one")
    return models


def _context(value) -> int | None:
    """A published max_model_len, if it is a usable one (a positive integer)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 2 else None


def first_model(url: str) -> str:
    """The first model the server lists (what a request without a model gets)."""
    return next(iter(served_models(url)))


def chosen_model(url: str, model: str | None) -> tuple[str, int | None]:
    """--model, or the server's first, with the max_model_len the server publishes for it (None:
    none); one it does not serve is refused now, not request by request (each would fail with
    404, and the replay would end with nothing measured and exit status 0)."""
    served = served_models(url)  # asked even with --model: an unreachable URL fails now
    if model is not None and model not in served:
        raise ValueError(f"--model {model}: {url} does not serve it; expected one of {list(served)}")
    model = model or next(iter(served))
    return model, served[model]


def context(args: argparse.Namespace, published: int | None, url: str) -> int | None:
    """The context requests are capped to, as sim run caps them to the model's: --max-model-len,
    else the max_model_len the server publishes (a longer request would only be refused, HTTP 400);
    None: no cap (--no-cap, or a server that publishes none, which is said once)."""
    if not args.cap_lengths:
        return None
    if args.max_model_len is None and published is None:
        print(f"note: {url} publishes no max_model_len on /v1/models: requests are sent uncapped "
              "(--max-model-len caps them)", file=sys.stderr)
    return args.max_model_len if args.max_model_len is not None else published


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    parser = build_parser()
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: expected >= 1")
    if not is_power_of_two(args.block_size):
        parser.error(f"--block-size {args.block_size}: expected a power of two >= 1, the servers' block size")
    if args.max_model_len is not None and args.max_model_len < 2:
        parser.error(f"--max-model-len {args.max_model_len}: expected at least 2 (a prompt token and an output one)")
    sampling = sampling_fields(args, parser)
    try:
        check_output_paths([("--json", args.json, ".json"), ("--requests-csv", args.requests_csv, ".csv")])
        model, published = chosen_model(url, args.model)
        max_model_len = context(args, published, url)
        workload = workload_from_args(args, max_model_len, args.block_size)
        prompt = PromptMaker(workload, args.vocab_size, args.min_token_id, args.seed)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with tqdm(total=len(workload), desc="requests", unit="req", file=sys.stderr, disable=not args.progress_bar) as bar:
        rec, wall_s = replay_in_processes(url, model, workload, prompt, args.workers, args.timeout_s, bar.update,
                                          sampling)
    summary = summarize(workload, rec, wall_s, args.slo_ttft_s, args.slo_tpot_s)
    print(format_summary({k: v for k, v in summary.items() if k != "errors"}))
    for message, count in summary["errors"].items():
        print(f"error x{count}: {message}")
    try:  # checked before the replay, but a disk may fill or a folder go during it
        if args.json:
            source = {"trace": str(args.trace)} if args.trace is not None else {"shared_prefix": args.shared_prefix}
            settings = {"url": url, "model": model, "max_model_len": max_model_len, "vocab_size": args.vocab_size,
                        "min_token_id": args.min_token_id, "seed": args.seed, "sampling": sampling}
            doc = {**summary, "workload": {**source, "name": workload.name}, "config": settings}
            with written("--json", args.json) as path:
                path.write_text(json.dumps(jsonable(doc), indent=2) + "\n")
        if args.requests_csv:
            with written("--requests-csv", args.requests_csv) as path:
                requests_frame(workload, rec).to_csv(path, index=False)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
