"""Step time over a grid of batch shapes: the cost profile the simulator's profiled model loads.

Every sample is a real engine step: a `SchedulerOutput` made by a real `Scheduler` from
synthetic requests, carried out by the engine's own runner (same model, kernels, sampler), so
the profile is what the engine does. The steps that only set a shape up (filling contexts,
leaving a prefix in the cache) are applied to the scheduler without running the model, so a
timed step reads whatever its blocks hold: before anything is timed, every block is written by
a real prefill (`_Profiler.fill_cache`), so that it reads what a serving engine reads (a step's
time depends on the values, not only on how many are read), and where (each set-up scheduler's
free blocks are shuffled, so a request's blocks are scattered over the cache as in an engine
that has served for a while). Every step
is set up first, then all are timed in rounds in random order, and a sample's time_s is the mean
of its timed rounds (`_Profiler.time_all` says why).

Features are the SchedulerOutput's aggregates, exactly as the simulator sees them:
num_prefill_tokens, prefill_attention_pairs, num_decode_tokens, decode_context_sum, num_seqs.
Output format "paged-step-profile/1":

    {"format", "model", "device", "dtype", "block_size", "num_gpu_blocks", "num_threads",
     "samples": [{"num_prefill_tokens", "prefill_attention_pairs", "num_decode_tokens",
                  "decode_context_sum", "num_seqs", "time_s"}, ...]}
"""
from __future__ import annotations

import json
import random
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from paged import CacheConfig, Request, SamplingParams, SchedulerConfig, SchedulerOutput
from paged.core.scheduler import Scheduler
from paged.output_paths import make_parent

from .engine import LLMEngine

FORMAT = "paged-step-profile/1"
FEATURES = ("num_prefill_tokens", "prefill_attention_pairs", "num_decode_tokens", "decode_context_sum", "num_seqs")
_PARAMS = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True)


@dataclass(slots=True)
class ProfileGrid:
    """The shapes to measure. Decode points whose contexts do not fit in the KV cache are skipped.

    Every decode batch (alone, or beside a prefill chunk) is measured once per spread in
    `decode_spreads`: its longest context is the grid's, and the others are evenly spaced down to
    (1 - spread) times it (`batch_contexts`). Why: in a continuous batch the requests joined at
    different times, so their contexts differ, and the engine's step time depends on more than the
    context sum the cost model sees (the CPU attention pads a group of contexts to its longest). A
    profile of equal contexts only measured a batch the engine hardly ever runs. Spreads 0.5 and 1
    bracket a real one: the decode batches of `experiments/sim_vs_real.py`'s replays had a mean
    context 0.45-0.62 of their longest (spread 1 gives 0.5, spread 0.5 gives 0.75, equal contexts 1).
    Fitted to spreads 0.5 and 1 instead of 0 and 1 (the same profile's samples), the model was 2.2-2.8%
    closer in total on each of three replays' steps and 4-6% closer on batches of 9-16.
    """

    prefill_chunks: tuple[int, ...] = (16, 64, 256, 512)
    prefill_contexts: tuple[int, ...] = (0, 512)  # tokens already in the cache (a prefix hit) before the chunk
    decode_batches: tuple[int, ...] = (1, 4, 16, 64)
    decode_contexts: tuple[int, ...] = (64, 256, 1024, 2048)  # a decode batch's longest context
    mixed_batches: tuple[int, ...] = (4, 16)  # decode requests beside one prefill chunk
    mixed_chunks: tuple[int, ...] = (64, 256)
    mixed_context: int = 256
    repeats: int = 3  # timed runs of each step (after one warm-up run); their mean is kept
    decode_spreads: tuple[float, ...] = (0.5, 1.0)

    def __post_init__(self) -> None:
        for name in ("prefill_chunks", "decode_batches", "mixed_batches", "mixed_chunks"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"ProfileGrid.{name}={values!r}: expected positive integers")
        if not self.decode_contexts or min(self.decode_contexts) < 2 or self.mixed_context < 2:
            raise ValueError(f"ProfileGrid: decode_contexts={self.decode_contexts!r}, mixed_context="
                             f"{self.mixed_context!r}: expected integers >= 2 (a prompt token and a sampled one)")
        if min(self.prefill_contexts, default=0) < 0 or self.repeats < 1:
            raise ValueError("ProfileGrid: prefill_contexts must be >= 0, repeats >= 1")
        if not self.decode_spreads or not all(0.0 <= s <= 1.0 for s in self.decode_spreads):
            raise ValueError(f"ProfileGrid.decode_spreads={self.decode_spreads!r}: expected numbers in [0, 1]")

    @property
    def max_num_batched_tokens(self) -> int:
        return max(max(self.prefill_chunks), max(self.mixed_chunks) + max(self.mixed_batches),
                   max(self.decode_batches))

    def batch_contexts(self, batch: int, longest: int) -> list[list[int]]:
        """The contexts of a decode batch of `batch` requests, longest `longest`, for each spread
        (each distinct batch once: a batch of one has no spread)."""
        batches = []
        for spread in self.decode_spreads:
            contexts = [max(2, round(longest * (1 - spread * i / max(batch - 1, 1)))) for i in range(batch)]
            if contexts not in batches:
                batches.append(contexts)
        return batches


class _Profiler:
    def __init__(self, engine: LLMEngine, grid: ProfileGrid) -> None:
        self.engine = engine
        self.grid = grid
        self.rng = random.Random(0)
        self.samples: list[dict] = []
        self.pending: list[tuple[Scheduler, SchedulerOutput]] = []  # steps set up, to time (`time_all`)
        self.skipped: list[str] = []
        self._ids = 0

    def fill_cache(self) -> None:
        """Write every KV block as serving would: prompts of random tokens prefilled for real, block after
        block, at most the grid's token budget a step.

        Why: the set-up steps are not run, so a timed step attends to blocks that hold whatever was last
        written there: zeros in a new engine. The time of a step depends on those values, not only on how
        many are read: the same decode states took 5-7% longer (thread CPU time) over the KV cache the
        requests of `experiments/sim_vs_real.py` had left than over a zeroed one (about a quarter of it
        denormal floats in the attention), and the profile came out that much faster than the replay. A CPU
        engine's step now flushes denormals to zero (`paged.engine.runner.denormals_flushed`), which removes
        that slow path; the fill stays, so that the profile reads what serving reads without assuming that
        nothing else in the values matters."""
        cache = self.engine.scheduler.cache_config
        size, max_model_len = cache.block_size, self.engine.scheduler.config.max_model_len
        per_step = max(1, self.grid.max_num_batched_tokens // size)
        per_request = max(1, (max_model_len - 1) // size)
        for first in range(0, cache.num_gpu_blocks, per_step):
            scheduler = self.scheduler(shuffle=False)
            scheduler.kv.pool.allocate_n(first)  # a fresh pool hands out blocks in order: these prompts get the next
            num_blocks = min(per_step, cache.num_gpu_blocks - first)
            for start in range(0, num_blocks, per_request):
                self.add(scheduler, self.tokens(min(size * min(per_request, num_blocks - start), max_model_len - 1)))
            self.engine.runner.execute_model(scheduler.schedule(0.0), scheduler.kv)

    def scheduler(self, setup_tokens: int = 0, shuffle: bool = True) -> Scheduler:
        """A fresh scheduler over the engine's KV tensors (its own empty pool and prefix cache), with a
        token budget of at least `setup_tokens`: set-up prompts then all prefill in one (unrun) step.
        Its free blocks are shuffled: a fresh pool would give each request blocks side by side, which
        an engine that has served for a while never reads (its requests' blocks are scattered over the
        cache); the same decode batches took 1-2% longer scattered (`experiments/sim_vs_real.py`)."""
        cache = self.engine.scheduler.cache_config
        budget = max(self.grid.max_num_batched_tokens, setup_tokens)
        scheduler = Scheduler(
            CacheConfig(num_gpu_blocks=cache.num_gpu_blocks, block_size=cache.block_size, watermark=0.0),
            SchedulerConfig(max_num_seqs=budget, max_num_batched_tokens=budget,
                            max_model_len=self.engine.scheduler.config.max_model_len))
        if shuffle:
            scheduler.kv.pool.shuffle_free_blocks(self.rng)  # the scattered block tables of a serving engine
        return scheduler

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(self.engine.model_config.vocab_size) for _ in range(n)]

    def add(self, scheduler: Scheduler, prompt: list[int], params: SamplingParams = _PARAMS) -> None:
        self._ids += 1
        scheduler.add_request(Request(f"p{self._ids}", prompt, sampling_params=params))

    @staticmethod
    def skip_step(scheduler: Scheduler, out: SchedulerOutput) -> None:
        """Apply a set-up step's outcome to the scheduler without running the model."""
        sampled = {r.request_id: [0] for r in (*out.decode_requests, *out.prefill_requests)}
        scheduler.update_from_output(out, sampled, 0.0)

    def keep(self, scheduler: Scheduler, out: SchedulerOutput) -> None:
        """Keep the step to time later, with every other (`time_all`)."""
        self.pending.append((scheduler, out))

    def time_all(self) -> None:
        """Time every kept step in rounds: one untimed round (warm-up), then `repeats` timed ones, each in a
        new random order; a step's time is its mean over the timed rounds.

        Why rounds in random order: a shared machine's speed drifts over the minutes a profile takes. Timed
        one shape after the other, the drift lands on whichever shapes ran during it, and the cost model's
        corrections by batch size learn it as a property of those sizes (a profile on a loaded machine had
        decode batches 14-16 70 ms slow and batch 13 not). Interleaved, every shape sees the same mix of the
        machine's states: drift scales the whole profile, it does not bend it. The steps' KV blocks overlap
        (each set-up had the pool to itself), which changes only the values read, never the time.

        Why the mean, not the median: the simulator adds step times up, so it needs each step's expected
        time. On a shared machine a step is now and then slowed by what runs on the other cores (25-35%
        for tens of seconds, in the replays of `experiments/sim_vs_real.py`); the median drops those
        rounds, the engine's real steps do not, and the profile came out a few percent fast."""
        engine, cuda = self.engine, self.engine.device.type == "cuda"
        times: list[list[float]] = [[] for _ in self.pending]
        order = list(range(len(self.pending)))
        for _ in range(self.grid.repeats + 1):
            self.rng.shuffle(order)
            for i in order:
                scheduler, out = self.pending[i]
                if cuda:
                    torch.cuda.synchronize(engine.device)
                start = time.perf_counter()
                engine.runner.execute_model(out, scheduler.kv)
                if cuda:
                    torch.cuda.synchronize(engine.device)
                times[i].append(time.perf_counter() - start)
        for (_, out), t in zip(self.pending, times, strict=True):
            sample = {name: getattr(out, name) for name in FEATURES}
            sample["time_s"] = statistics.fmean(t[1:])
            self.samples.append(sample)

    def decoders(self, contexts: list[int]) -> tuple[Scheduler, SchedulerOutput] | None:
        """A scheduler whose next step decodes one request at each of `contexts` tokens."""
        cache = self.engine.scheduler.cache_config
        what = f"decode batch {len(contexts)} x contexts {min(contexts)}..{max(contexts)}"
        if not self.fits(max(contexts) + 1, what):
            return None
        if sum(context // cache.block_size + 2 for context in contexts) > cache.num_gpu_blocks:
            self.skipped.append(f"{what}: does not fit in the KV cache")
            return None
        # Every prompt prefills in the first (unrun) step, so the next one decodes each request at exactly its
        # context. (With the grid's budget the prompts took several steps, and those prefilled first decoded
        # meanwhile: at a context near max_model_len one finished there, the batch was never reached, and the
        # loop never ended.) A batch that still cannot be made is skipped with a note, never waited for.
        scheduler = self.scheduler(setup_tokens=sum(contexts))
        for context in contexts:
            self.add(scheduler, self.tokens(context - 1))  # prefill, sample one: the next step attends to `context`
        for _ in range(len(contexts) + 1):
            out = scheduler.schedule(0.0)
            if not out.prefill_requests and len(out.decode_requests) == len(contexts):
                return scheduler, out
            if out.is_empty or len(scheduler.requests) < len(contexts):
                break
            self.skip_step(scheduler, out)
        self.skipped.append(f"{what}: the scheduler would not run it (a request finished or waits while setting up)")
        return None

    def fits(self, num_tokens: int, what: str) -> bool:
        max_model_len = self.engine.scheduler.config.max_model_len
        if num_tokens > max_model_len:
            self.skipped.append(f"{what}: {num_tokens} tokens exceed max_model_len={max_model_len}")
            return False
        return True

    def run(self) -> None:
        grid = self.grid
        for context in grid.prefill_contexts:
            for chunk in grid.prefill_chunks:
                if not self.fits(context + chunk, f"prefill chunk {chunk} after context {context}"):
                    continue
                scheduler = self.scheduler()
                prefix = self.tokens(context)
                if context:
                    # A request over the prefix leaves its blocks in the prefix cache when it finishes.
                    self.add(scheduler, prefix + self.tokens(1), SamplingParams(max_tokens=1, ignore_eos=True))
                    while scheduler.has_unfinished_requests():
                        self.skip_step(scheduler, scheduler.schedule(0.0))
                self.add(scheduler, prefix + self.tokens(chunk))
                self.keep(scheduler, scheduler.schedule(0.0))
        for batch in grid.decode_batches:
            for context in grid.decode_contexts:
                for contexts in grid.batch_contexts(batch, context):
                    made = self.decoders(contexts)
                    if made is not None:
                        self.keep(*made)
        for batch in grid.mixed_batches:
            for chunk in grid.mixed_chunks:
                if not self.fits(chunk, f"chunk {chunk}"):
                    continue
                for contexts in grid.batch_contexts(batch, grid.mixed_context):
                    made = self.decoders(contexts)
                    if made is None:
                        continue
                    scheduler, out = made
                    self.skip_step(scheduler, out)
                    self.add(scheduler, self.tokens(chunk))
                    out = scheduler.schedule(0.0)
                    if len(out.decode_requests) == batch and out.num_prefill_tokens == chunk:
                        self.keep(scheduler, out)
                    else:  # a decode reached max_model_len in the step before (context max_model_len - 1)
                        self.skipped.append(f"chunk {chunk} beside {batch} decodes at {grid.mixed_context}: "
                                            f"ran {len(out.decode_requests)} decodes, {out.num_prefill_tokens} tokens")


def profile(engine: LLMEngine, grid: ProfileGrid | None = None, log=sys.stderr) -> dict:
    """Measure the grid on the engine; returns the profile as a JSON-ready dict."""
    profiler = _Profiler(engine, grid or ProfileGrid())
    # a line as each phase starts: together they take minutes, and printed nothing before
    print(f"profile: prefilling all {engine.scheduler.cache_config.num_gpu_blocks:,} KV blocks ...", file=log)
    profiler.fill_cache()
    profiler.run()
    print(f"profile: timing {len(profiler.pending)} steps, {profiler.grid.repeats + 1} rounds (one warm-up) ...",
          file=log)
    profiler.time_all()
    for note in profiler.skipped:
        print(f"profile: skipped {note}", file=log)
    device = engine.device
    return {
        "format": FORMAT,
        "model": engine.model_name,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(engine.dtype).removeprefix("torch."),
        "block_size": engine.scheduler.block_size,
        # the KV cache profiled: `sim run --cost-model` suggests it (and the model) to simulate this engine
        "num_gpu_blocks": engine.scheduler.cache_config.num_gpu_blocks,
        "num_threads": torch.get_num_threads(),
        "samples": profiler.samples,
    }


def write_profile(result: dict, path: str) -> None:
    with open(make_parent(path), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
