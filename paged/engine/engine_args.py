"""The engine's settings as command-line options, shared by `python -m paged.engine` and `paged serve`.

Each option is a field of `EngineConfig` under vLLM's flag name; an option left out keeps the
config's default (None here), so the config alone decides defaults and checks values.
"""
from __future__ import annotations

import argparse
import dataclasses

from .engine_config import EngineConfig

# field -> (type, help); flags are the field names with dashes
_OPTIONS = {
    "tokenizer": (str, "a Hugging Face folder whose tokenizer to use instead of the model's"),
    "dtype": (str, "auto, float32, bfloat16 or float16"),
    "device": (str, "auto, cpu or cuda[:N]"),
    "seed": (int, "seed of the requests that bring none"),
    "block_size": (int, "tokens per KV block"),
    "kv_cache_memory_bytes": (int, "KV cache budget on CPU"),
    "gpu_memory_utilization": (float, "fraction of the GPU the engine may fill (CUDA)"),
    "num_gpu_blocks": (int, "KV blocks, overriding both budgets"),
    "swap_space": (float, "host memory for swapped KV blocks, GiB"),
    "max_num_seqs": (int, "sequences in a step"),
    "max_num_batched_tokens": (int, "tokens in a step"),
    "max_model_len": (int, "prompt + output tokens of one sequence (default: what the model and the cache hold)"),
    "preemption_mode": (str, "recompute or swap"),
    "policy": (str, "scheduling policy: fcfs, priority, sjf, edf, lpm"),
    "threads": (int, "torch CPU threads (default: half the CPUs this process may use, at least 1)"),
    "kv_cache_dtype": (str, "how K/V are stored: auto (the model's dtype), fp16, int8, fp8 (e4m3) or int4"),
    "swap_compression": (str, "swapped KV blocks LZ4-compressed in host memory: lz4 or lz4-shuffle"),
}
_SWITCHES = {
    "enable_prefix_caching": "reuse the KV blocks of shared prompt prefixes",
    "enable_chunked_prefill": "split long prompts across steps",
}


def add_engine_args(parser: argparse.ArgumentParser, **defaults) -> None:
    """--model and every engine option; `defaults` replace the config's for this command."""
    parser.add_argument("--model", required="model" not in defaults, default=defaults.get("model"),
                        help="Hugging Face folder, .gguf file, or smollm2-135m")
    for name, (kind, help_) in _OPTIONS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=defaults.get(name), help=help_)
    for name, help_ in _SWITCHES.items():
        parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction,
                            default=defaults.get(name), help=help_)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineConfig fields (other than the model) that the command line set."""
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    return {name: v for name in (*_OPTIONS, *_SWITCHES) if name in fields and (v := getattr(args, name)) is not None}
