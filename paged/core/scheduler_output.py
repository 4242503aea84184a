"""What one scheduling step decided, for the driver (simulator or engine) to carry out."""
from __future__ import annotations

from dataclasses import dataclass, field

from .request import Request


@dataclass(slots=True)
class SchedulerOutput:
    """Decode requests compute one token each at position `num_computed_tokens`; prefill
    requests compute `prefill_num_tokens[i]` tokens from theirs (a prompt chunk, a recompute
    after preemption, or a first step after a fork). A request samples when its chunk reaches
    `num_tokens`; decode requests always do. Copies and swaps are done before the forward.

    The aggregate figures are what a cost model needs; they are kept by the scheduler so the
    simulator never walks the batch.
    """

    decode_requests: list[Request]
    prefill_requests: list[Request]
    prefill_num_tokens: list[int]
    num_decode_tokens: int = 0
    decode_context_sum: int = 0  # sum of context lengths attended by the decode tokens
    num_prefill_tokens: int = 0
    prefill_attention_pairs: int = 0  # sum over prefill tokens of the context each attends to
    preempted: list[Request] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    next_wakeup: float | None = None  # set when nothing runs until then (static batching timeout)

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens

    @property
    def num_decode_requests(self) -> int:
        """Decode requests that give their client a token: those listed, or all the decode tokens
        of a step whose scheduler lists none (`Scheduler.list_decode_requests` off; it pads nothing).
        A listing scheduler's decode step always lists one: a static batch with no live member left
        ends before its next step (`StaticBatchScheduler.schedule`), so its padding never counts."""
        return len(self.decode_requests) or self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return self.num_decode_requests + len(self.prefill_requests)

    @property
    def is_empty(self) -> bool:
        return not self.num_decode_requests and not self.prefill_requests
