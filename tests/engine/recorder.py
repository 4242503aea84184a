"""Watch the SchedulerOutputs an engine carries out, to prove a feature was really exercised."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepLog:
    steps: int = 0
    preempted: int = 0
    swapped_out: int = 0
    swapped_in: int = 0
    copied: int = 0
    partial_chunks: int = 0  # prompt chunks that stopped before the prompt's end
    max_decode_batch: int = 0


def record_steps(llm) -> StepLog:
    """Wrap the engine's runner so each step's output is tallied in the returned log."""
    runner = llm.llm_engine.runner
    execute = runner.execute_model
    log = StepLog()

    def recording(out, kv):
        log.steps += 1
        log.preempted += len(out.preempted)
        log.swapped_out += len(out.blocks_to_swap_out)
        log.swapped_in += len(out.blocks_to_swap_in)
        log.copied += len(out.blocks_to_copy)
        log.max_decode_batch = max(log.max_decode_batch, len(out.decode_requests))
        log.partial_chunks += sum(req.num_computed_tokens + n < req.num_prompt_tokens
                                  for req, n in zip(out.prefill_requests, out.prefill_num_tokens, strict=True))
        return execute(out, kv)

    runner.execute_model = recording
    return log


def assert_all_blocks_free(llm_or_engine) -> None:
    """No request left in the engine or its scheduler, and every device and host block free."""
    engine = getattr(llm_or_engine, "llm_engine", llm_or_engine)
    scheduler = engine.scheduler
    assert not scheduler.requests, f"unfinished requests left: {list(scheduler.requests)}"
    assert not engine.requests
    kv = scheduler.kv
    assert kv.num_free_blocks == kv.pool.num_blocks, f"{kv.pool.num_blocks - kv.num_free_blocks} blocks still held"
    if kv.cpu_pool is not None:
        assert kv.cpu_pool.num_free_blocks == kv.cpu_pool.num_blocks
