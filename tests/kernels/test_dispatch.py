"""Which backend runs, and the public API the engine and the contract checker rely on."""

import os
import subprocess
import sys

import pytest
import torch

import kernels
from kernels.dispatch import resolve_backend
from tests.kernels.test_checks import attention_args

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_is_triton_on_gpus_and_torch_on_cpus(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_backend("auto", CUDA) == "triton"
    assert resolve_backend("auto", CPU) == "torch"


def test_auto_uses_the_interpreter_when_asked(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("auto", CPU) == "triton"


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_explicit_backend_wins(backend):
    assert resolve_backend(backend, CPU) == backend
    assert resolve_backend(backend, CUDA) == backend


def test_contract_example(monkeypatch):
    """The call the contract checker makes, on a plain CPU: the torch path, no Triton needed."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = attention_args()
    out = kernels.paged_attention(*args.values())
    assert out.shape == (3, 4, 16) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.equal(out, kernels.paged_attention(*args.values(), backend="torch"))
    torch.testing.assert_close(out, kernels.paged_attention(*args.values(), backend="triton"))


def test_import_does_not_load_triton():
    code = "import sys, kernels; assert 'triton' not in sys.modules, 'import kernels pulled in triton'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_triton_interpret_set_before_import():
    """The usual Triton workflow: TRITON_INTERPRET=1 in the environment, so `auto` runs Triton on the CPU."""
    code = """
import torch, kernels
from kernels import dispatch
from tests.kernels.test_checks import attention_args
assert dispatch.resolve_backend("auto", torch.device("cpu")) == "triton"
args = attention_args().values()
torch.testing.assert_close(kernels.paged_attention(*args), kernels.paged_attention(*args, backend="torch"))
"""
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TRITON_INTERPRET": "1"})


def test_validate_false_skips_the_checks(monkeypatch):
    """Engines check a step's metadata once and skip the host reads for the other layers."""
    from kernels import checks, dispatch

    def refuse(*args, **kwargs):
        raise AssertionError("checked")

    monkeypatch.setattr(checks, "check_paged_attention", refuse)
    monkeypatch.setattr(checks, "check_reshape_and_cache", refuse)
    q, kc, vc = torch.randn(3, 4, 16), torch.randn(4, 8, 2, 16), torch.randn(4, 8, 2, 16)
    bt = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    sl, qsl = torch.tensor([10, 5], dtype=torch.int32), torch.tensor([0, 1, 3], dtype=torch.int32)
    dispatch.reshape_and_cache(torch.randn(3, 2, 16), torch.randn(3, 2, 16), kc, vc,
                               torch.tensor([0, 9, 17]), validate=False)
    assert dispatch.paged_attention(q, kc, vc, bt, sl, qsl, 0.25, validate=False).shape == (3, 4, 16)
    with pytest.raises(AssertionError, match="checked"):
        dispatch.paged_attention(q, kc, vc, bt, sl, qsl, 0.25)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_strided_index_tensors_are_read_by_their_values(backend):
    """A slice or a transpose of an index tensor means what its values say, on every backend."""
    from kernels import reference

    args = attention_args()
    want = reference.paged_attention(*args.values())
    strided = {
        **args,
        "block_table": torch.tensor([[2, 1], [0, 3]], dtype=torch.int32).t(),  # == [[2, 0], [1, 3]]
        "seq_lens": torch.tensor([10, 0, 5, 0], dtype=torch.int32)[::2],
        "query_start_loc": torch.tensor([0, 9, 1, 9, 3], dtype=torch.int32)[::2],
    }
    assert not any(strided[k].is_contiguous() for k in ("block_table", "seq_lens", "query_start_loc"))
    torch.testing.assert_close(kernels.paged_attention(*strided.values(), backend=backend), want)

    key, value = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    slots = torch.tensor([5, 0, -1, 0, 31, 0])[::2]
    caches = [torch.zeros(4, 8, 2, 16) for _ in range(2)]
    kernels.reshape_and_cache(key, value, *caches, slots, backend=backend)
    assert torch.equal(caches[0].view(32, 2, 16)[5], key[0]) and torch.equal(caches[1].view(32, 2, 16)[31], value[2])
    assert caches[0].view(32, 2, 16)[0].abs().sum() == 0
