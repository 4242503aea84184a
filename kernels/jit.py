"""One Triton kernel, two ways to run it: compiled for GPU tensors, interpreted for CPU tensors.

Why not plain ``@triton.jit``: Triton decides between compiling and interpreting once, when the
decorator runs, from the ``TRITON_INTERPRET`` environment variable. Whether a process could run
the kernels on CPU tensors would then depend on who imported Triton first and what the
environment said at that moment, and a test suite that set the variable for its kernel tests
would push every other CPU caller in the same process onto the (very slow) interpreter. Holding
both forms of each kernel and choosing by the tensors' device removes that order dependence:
CPU tensors always go to the interpreter, GPU tensors to the compiler (which still honours
``TRITON_INTERPRET=1``, as Triton users expect).

One wrinkle: Triton's own library functions (``tl.max``, ``tl.sum``, ``tl.zeros``) are themselves
``@triton.jit`` functions, compiled-only unless ``TRITON_INTERPRET`` was set at import. During an
interpreted launch, :func:`_library_interpreted` lets them run as Python, as they would have in an
interpreter-mode process, and undoes the interpreter's patches of ``triton.language`` after each
call (Triton's own nested-call path leaves them in place, harmless in an interpreter-only
process but fatal to any kernel compiled later in this one). This leans on
``triton.runtime.interpreter``, which is not public API: the machinery ``TRITON_INTERPRET=1``
uses, as of the pinned Triton 3.8.
"""

import contextlib

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction, _patch_lang
from triton.runtime.jit import JITFunction

# Keyed by the library function's Python function: a JITFunction's own hash compiles a cache key.
_interpreted_library: dict = {}


def _call_interpreted(jit_function, *args, **kwargs):
    fn = jit_function.fn
    if fn not in _interpreted_library:
        _interpreted_library[fn] = InterpretedFunction(fn)
    patches = _patch_lang(fn)
    try:
        return _interpreted_library[fn].rewrite()(*args, **kwargs)
    finally:
        patches.restore()


@contextlib.contextmanager
def _library_interpreted():
    """While active, calling a compiled-mode ``@triton.jit`` function runs it in the interpreter."""
    compiled_call = JITFunction.__call__
    JITFunction.__call__ = _call_interpreted
    try:
        yield
    finally:
        JITFunction.__call__ = compiled_call


class _InterpretedLauncher:
    def __init__(self, fn):
        self.interpreted = InterpretedFunction(fn)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            with _library_interpreted():
                return self.interpreted[grid](*args, **kwargs)

        return launch


class Kernel:
    """Decorator used in place of ``@triton.jit``; ``kernel.on(device)[grid](...)`` launches it."""

    def __init__(self, fn):
        self.compiled = triton.jit(fn)
        self.interpreted = _InterpretedLauncher(fn)

    def on(self, device: torch.device):
        return self.interpreted if device.type == "cpu" else self.compiled

    def interprets(self, device: torch.device) -> bool:
        """Whether launches on ``device`` run in an interpreter (where ``tl.dot`` must not see bfloat16)."""
        return device.type == "cpu" or isinstance(self.compiled, InterpretedFunction)
