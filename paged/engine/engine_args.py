"""The engine's settings as command-line options, shared by `python -m paged.engine` and `paged serve`.

Each option is a field of `EngineConfig` under vLLM's flag name; an option left out keeps the
config's default (None here), so the config alone decides defaults and checks values.
"""
from __future__ import annotations

import argparse
import dataclasses

from .engine_config import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    EngineConfig,
)

# field -> (type, help, the default when the config's is None: what the engine picks instead);
# vLLM's wording where the option is vLLM's.
_OPTIONS = {
    "tokenizer": (str, "name or path of the model whose tokenizer to use, as --model takes it (a known "
                        "name, a Hugging Face folder or a GGUF file)", "the model's"),
    "dtype": (str, "data type for model weights and activations: auto (float32 on CPU; bfloat16, or float16 "
                   "where the GPU has no bfloat16), float32, bfloat16 or float16", None),
    "device": (str, "device type for execution: auto (cuda if there is one), cpu or cuda[:N]", None),
    "seed": (int, "random seed of the requests that bring none", None),
    "block_size": (int, "size of a contiguous cache block in number of tokens, a power of two", None),
    "kv_cache_memory_bytes": (int, "on CPU, size of the KV cache in bytes (on CUDA, --gpu-memory-utilization "
                                   "sizes it)", f"{DEFAULT_CPU_KV_CACHE_BYTES >> 20} MiB"),
    "gpu_memory_utilization": (float, "on CUDA, the fraction of GPU memory the engine may fill, weights "
                                      "included, from 0 to 1", None),
    "num_gpu_blocks": (int, "number of KV cache blocks, overriding both memory budgets; tests use it to "
                            "force preemption", "what the memory budget holds"),
    "swap_space": (float, "size of the CPU swap space for preempted KV blocks, in GiB; 0 with --preemption-mode "
                          "swap: as large as the KV cache", None),
    "max_num_seqs": (int, "maximum number of sequences to be processed in a single iteration",
                     f"{DEFAULT_MAX_NUM_SEQS}, at most --max-num-batched-tokens"),
    "max_num_batched_tokens": (int, "maximum number of tokens to be processed in a single iteration",
                               f"{DEFAULT_MAX_NUM_BATCHED_TOKENS}; at least --max-model-len without chunked prefill"),
    "max_model_len": (int, "model context length (prompt and output), in tokens",
                      "the model's maximum, capped to what the KV cache holds"),
    "preemption_mode": (str, "how a preempted sequence gets its KV cache back: recompute or swap", None),
    "policy": (str, "scheduling policy: fcfs, priority, sjf, edf or lpm", None),
    "threads": (int, "torch CPU threads", "half the CPUs this process may use, at least 1"),
    "kv_cache_dtype": (str, "data type for KV cache storage: auto (the model's dtype), fp16, int8, fp8 (e4m3) or "
                            "int4", None),
    "swap_compression": (str, "hold swapped KV blocks LZ4-compressed in host memory: lz4 or lz4-shuffle",
                         "uncompressed"),
}
_SWITCHES = {
    "enable_prefix_caching": "whether to enable prefix caching: reuse the KV cache blocks of shared prompt prefixes",
    "enable_chunked_prefill": "whether prefills can be chunked to fit the remaining max_num_batched_tokens",
}
_CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def _shown(name: str, value) -> str:
    """A default as the help prints it: bytes in MiB, so that one option's default reads alike in
    every command (a command's own default was printed as 1073741824, the engine's as 256 MiB)."""
    return f"{value >> 20} MiB" if name.endswith("_bytes") and value % (1 << 20) == 0 else str(value)


def _help(name: str, help_: str, derived: str | None, defaults: dict, why: str | None) -> str:
    """The help with the default this command runs with: its own (and `why`, where it differs from
    the engine's), else the config's, else what the engine derives (these options' argparse default is
    None, so argparse cannot show it)."""
    default = defaults[name] if name in defaults else _CONFIG_DEFAULTS[name]
    shown = derived if default is None else _shown(name, default)
    return f"{help_} (default: {shown}{'; ' + why if why else ''})"


def add_engine_args(parser: argparse.ArgumentParser, why: dict[str, str] | None = None, **defaults) -> None:
    """--model and every engine option; `defaults` replace the config's for this command, and `why`
    says, by option, why this command's default differs from the engine's."""
    why = why or {}
    parser.add_argument("--model", required="model" not in defaults, default=defaults.get("model"),
                        help="name or path of the model to use: a Hugging Face folder, a .gguf file, or smollm2-135m")
    for name, (kind, help_, derived) in _OPTIONS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=defaults.get(name),
                            help=_help(name, help_, derived, defaults, why.get(name)))
    for name, help_ in _SWITCHES.items():
        parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction,
                            default=defaults.get(name), help=_help(name, help_, None, defaults, why.get(name)))


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineConfig fields (other than the model) that the command line set."""
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    return {name: v for name in (*_OPTIONS, *_SWITCHES) if name in fields and (v := getattr(args, name)) is not None}
