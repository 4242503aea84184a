"""The article's thresholds of a healthy serving deployment, shared by the simulated study
(`experiments/health.py`) and the checks of a running server (`paged doctor`)."""
KV_BAND = (0.60, 0.90)  # KV cache usage: below, memory idles; above, preemption is near
P99_LATENCY_S = 1.0  # P99 latency of a chat request
TOKENS_PER_S_PER_GPU = 500.0  # output tokens per second per GPU
FAILURE_RATE = 0.001  # requests that do not finish
PREEMPTION_RATE = 0.01  # preemptions per finished request: each one recomputes or swaps a request's KV
FRAGMENTATION = 0.10  # allocated KV slots holding no token: paging keeps it to part of a block a request
PREFIX_HIT_RATE = 0.10  # below it, prompts share little or are spread away from their cached prefix
