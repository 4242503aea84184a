"""`paged serve`: the OpenAI-compatible HTTP server, as `vllm serve`.

    paged serve --model smollm2-135m [--host 127.0.0.1] [--port 8000] [--api-key KEY]
                [--max-waiting N] [--served-model-name NAME ...] [engine options: --threads,
                --max-num-seqs, --max-model-len, --num-gpu-blocks, --kv-cache-memory-bytes,
                --enable-prefix-caching, ...]

Binds to 127.0.0.1 unless told otherwise: a model server open to the network should be a choice.
The API key may also come from $PAGED_API_KEY, which keeps it out of the process list.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

from paged.engine.engine import KVCacheTooSmall, LLMEngine
from paged.engine.engine_args import add_engine_args, engine_kwargs
from paged.help_formatter import ArgumentParser, HelpFormatter

from .kv_events import DEFAULT_CAPACITY
from .router_tokens import load_tokenizer_option, read_chat_template
from .server_process import check_listen_address

LARGER_CACHE = "--kv-cache-memory-bytes on CPU, --gpu-memory-utilization on CUDA"


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="paged serve", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="host name to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port number")
    p.add_argument("--api-key", default=os.environ.get("PAGED_API_KEY"),
                   help="clients must send Authorization: Bearer KEY (default: $PAGED_API_KEY; none: no check)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="the model name(s) used in the API; the first is the one responses carry (default: "
                        "--model as given)")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="answer 503 + Retry-After to a request whose sequences (prompts x n) would take "
                        "the waiting ones past this many (default: no limit)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, help="larger request bodies get 413, in bytes")
    p.add_argument("--chat-template", default=None, help="the file path to the chat template, or the template "
                                                          "itself (default: the model's own)")
    p.add_argument("--kv-events-capacity", type=int, default=DEFAULT_CAPACITY,
                   help="KV events kept for routers (GET /kv/events); one further behind resyncs from /kv/blocks")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="log level for uvicorn")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.max_waiting is not None and args.max_waiting < 1:
        p.error(f"--max-waiting {args.max_waiting}: expected at least 1")
    if args.max_body_bytes < 1:
        p.error(f"--max-body-bytes {args.max_body_bytes}: expected at least 1")
    if args.kv_events_capacity < 1:
        p.error(f"--kv-events-capacity {args.kv_events_capacity}: expected at least 1")
    return args


def max_model_len_note(engine: LLMEngine, given: int | None) -> str:
    """The startup log's word on max_model_len (as vLLM logs the one it uses): the value and where
    it came from, since one left out may have been cut to what the KV cache holds."""
    n = engine.scheduler.config.max_model_len
    if given is not None:
        return f"max_model_len={n} (--max-model-len)"
    model_max, cache = engine.model_config.max_model_len, engine.scheduler.cache_config
    if n == model_max:
        return f"max_model_len={n}: the model's maximum (--max-model-len to lower it)"
    return (f"max_model_len={n}: the model's maximum of {model_max} tokens, capped to what the KV cache holds "
            f"({cache.num_gpu_blocks} blocks of {cache.block_size}; a larger cache: {LARGER_CACHE})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import uvicorn

    from paged.engine import AsyncLLM

    from .app import ServeSettings, build_app

    try:  # a bad address, template, tokenizer, model or engine option: one line naming it, exit 2, before uvicorn
        check_listen_address(args.host, args.port)
        template = read_chat_template(args.chat_template)
        if args.tokenizer is not None:  # loaded once more by the engine: here, a bad one is named as such
            load_tokenizer_option(args.tokenizer)
        with warnings.catch_warnings():
            warnings.simplefilter("error", KVCacheTooSmall)  # the engine's API goes on; a server refuses, as vLLM
            engine = AsyncLLM(args.model, **engine_kwargs(args))
    except KVCacheTooSmall as e:
        print(f"paged serve: error: --max-model-len {e.max_model_len}: the KV cache holds {e.capacity} tokens "
              f"({e.num_gpu_blocks} blocks of {e.block_size}), too few for one sequence that long; expected at most "
              f"{e.capacity}, or a larger cache ({LARGER_CACHE}, --num-gpu-blocks)", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(f"paged serve: error: {e}", file=sys.stderr)
        return 2
    if args.log_level in ("info", "debug"):
        print(f"INFO:     {max_model_len_note(engine.engine, args.max_model_len)}", file=sys.stderr, flush=True)
    settings = ServeSettings(served_model_names=args.served_model_name or [args.model], api_key=args.api_key,
                             max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes, chat_template=template,
                             kv_events_capacity=args.kv_events_capacity)
    uvicorn.run(build_app(engine, settings), host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=5)
    return 0
