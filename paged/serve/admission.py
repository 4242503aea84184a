"""`paged serve --max-waiting`: admission counted in the sequences a request queues.

A request queues one sequence per prompt and sample (a completion's list of prompts times `n`),
as vLLM's engine queues a request of n samples as n requests; counting requests instead let one
request of many prompts take a queue far past its limit. A request that would fit were the queue
empty but not now gets 503 with Retry-After (the server is busy: retrying later helps); one that
alone queues more than the limit gets 400, since no retry ever fits it.
"""
from __future__ import annotations

from .errors import APIError


def admit(num_waiting_seqs: int, num_prompts: int, n: int, max_waiting: int | None, retry_after_s: int) -> None:
    """Raise the APIError refusing a request of `num_prompts` x `n` sequences, if it must be refused."""
    if max_waiting is None:
        return
    adds = num_prompts * n
    if adds > max_waiting:
        raise APIError(400, f"this request queues {adds} sequences ({num_prompts} prompt{'s' * (num_prompts > 1)} "
                            f"x n={n}), more than --max-waiting {max_waiting} lets wait at once; send at most "
                            f"{max_waiting} (prompts x n) per request", "prompt" if num_prompts > 1 else "n")
    if num_waiting_seqs + adds > max_waiting:
        raise APIError(503, f"the server is busy: {num_waiting_seqs} sequences are waiting and this request adds "
                            f"{adds} (--max-waiting {max_waiting}); retry later",
                       headers={"Retry-After": str(retry_after_s)})
