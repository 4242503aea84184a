"""On a CPU an engine step flushes denormal floats to zero, so that its time depends on the batch's shape and
not on the values it reads, and leaves the thread's mode as it found it, so that the rest of the process keeps
IEEE floats (`paged.engine.runner.denormals_flushed` says why). The test cannot time that; it checks the mode
inside the step and after it: in a thread that existed before the engine (as a server's worker threads may),
and with the mode already on."""
import threading

import torch

from paged.engine import LLM, SamplingParams
from paged.engine.runner import flushing_denormals

from .conftest import TINY


def engine_recording_the_mode(tiny_llama):
    llm = LLM(str(tiny_llama[0]), **TINY)
    runner, during = llm.llm_engine.runner, []
    execute = runner._execute

    def recording(out, kv):
        during.append(flushing_denormals())
        return execute(out, kv)

    runner._execute = recording
    return llm, during


def test_a_step_flushes_denormals_in_its_own_thread_and_restores_the_mode(tiny_llama):
    seen = {}
    go, done = threading.Event(), threading.Event()

    def worker():
        torch.set_flush_denormal(False)
        seen["before"] = flushing_denormals()
        go.wait(60)
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
        seen["after"] = flushing_denormals()
        done.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    llm, during = engine_recording_the_mode(tiny_llama)
    go.set()
    assert done.wait(60), "the worker thread's steps did not finish"
    assert seen == {"before": False, "after": False}
    assert during and all(during)


def test_a_step_leaves_the_mode_on_where_it_was_on(tiny_llama):
    llm, during = engine_recording_the_mode(tiny_llama)
    torch.set_flush_denormal(True)
    try:
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=1))
        assert flushing_denormals() and during == [True]
    finally:
        torch.set_flush_denormal(False)
