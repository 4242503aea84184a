"""A CPU engine flushes denormal floats to zero, so that its step time depends on the batch's shape and
not on the values it reads (`LLMEngine.__init__` says why). The test cannot time that; it checks the mode."""
import torch

from paged.engine import LLM

from .conftest import TINY


def denormals_survive() -> bool:
    return (torch.tensor([1e-30]) * torch.tensor([1e-10])).item() != 0.0  # 1e-40 is below float32's normal range


def test_a_cpu_engine_flushes_denormals(tiny_llama):
    was_flushing = not denormals_survive()
    try:
        torch.set_flush_denormal(False)
        assert denormals_survive()
        LLM(str(tiny_llama[0]), **TINY)
        assert not denormals_survive()
    finally:
        torch.set_flush_denormal(was_flushing)
