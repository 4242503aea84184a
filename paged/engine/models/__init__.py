"""Model registry: Hugging Face architecture name -> the module that runs it on the paged cache."""
from __future__ import annotations

from .llama import LlamaForCausalLM
from .model_config import ARCHITECTURES, ModelConfig

# Mistral and Qwen2 are Llama with other defaults (a sliding window, a q/k/v bias): `ModelConfig` says which.
MODEL_REGISTRY = dict.fromkeys(ARCHITECTURES, LlamaForCausalLM)


def get_model_class(config: ModelConfig):
    return MODEL_REGISTRY[config.architecture]


__all__ = ["MODEL_REGISTRY", "ModelConfig", "LlamaForCausalLM", "get_model_class"]
