"""One engine step: a `SchedulerOutput` becomes tensors, a forward pass, and sampled tokens.

The batch is flat: decode requests first (one token each), then prefill chunks. A sequence's
new tokens are at positions `num_computed_tokens ...` of its token list; its block table gives
their slots, and its context after the step is `seq_lens`. A request samples when its chunk
reaches its last token (decode requests always do); a parallel-sampling request finishing its
prompt for the first time samples `n` tokens from that one row, which the scheduler hands to
the `n` sequences it forks.

Block moves come first, in the order that keeps every read before the write that could
overwrite it: swap-out (the freed device blocks may be reused in this very step), swap-in,
copy-on-write.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from paged import KVCacheManager, Request, SchedulerOutput

from .attention_layer import AttentionMetadata
from .cache_engine import CacheEngine
from .sampler import Sampler, SampleRow


def flushing_denormals() -> bool:
    """Whether this thread flushes denormal floats to zero (torch has a setter, no getter)."""
    return (torch.tensor([1e-30]) * torch.tensor([1e-10])).item() == 0.0  # 1e-40 is a float32 denormal


@contextmanager
def denormals_flushed():
    """Flush denormal floats to zero in this thread for the block, then restore what was there.

    Why: on a CPU they take a slow microcode path, so a step's time depended on the values in the KV
    cache and activations (softmax underflow makes them), not only on the batch's shape: replays ran
    their steps 10-17% slower than a profile of the same shapes (`experiments/sim_vs_real.py`,
    `deploy_check.py`); flushed, 4-7%, about the machine's own drift. (A GPU does not slow down on
    them.) The mode belongs to a thread, and a server steps in worker threads (`AsyncLLM`), so each
    step sets it where it runs; it is restored after, because the rest of the process must keep IEEE
    floats (numpy in a simulator beside the engine; hypothesis refuses to run without subnormals)."""
    was = flushing_denormals()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(was)


@dataclass(slots=True)
class InputBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # flat token index of each row that samples
    sample_rows: list[SampleRow]
    sample_seq_ids: list[str]  # the sequence (scheduler request id) each sample row is for


def token_slice(req: Request, start: int, end: int) -> list[int]:
    """Tokens start..end-1 of the request's prompt + output, without building the whole list."""
    prompt, p = req.prompt_token_ids, req.num_prompt_tokens
    if end <= p:
        return prompt[start:end]
    return (prompt[start:] if start < p else []) + req.output_token_ids[max(0, start - p):end - p]


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cache: CacheEngine, sampler: Sampler, device: torch.device) -> None:
        self.model = model
        self.cache = cache
        self.sampler = sampler
        self.device = device
        for layer, caches in zip(model.attention_layers, cache.layer_caches(), strict=True):
            layer.key_cache, layer.value_cache, layer.k_scale, layer.v_scale = caches

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput, kv: KVCacheManager) -> dict[str, list[int]]:
        """Carry out the step: move blocks, run the model, sample. Returns request id -> sampled tokens."""
        if self.device.type != "cpu":
            return self._execute(out, kv)
        with denormals_flushed():
            return self._execute(out, kv)

    def _execute(self, out: SchedulerOutput, kv: KVCacheManager) -> dict[str, list[int]]:
        self.cache.swap_out(out.blocks_to_swap_out)
        self.cache.swap_in(out.blocks_to_swap_in)
        self.cache.copy(out.blocks_to_copy)
        if out.is_empty:
            return {}
        batch = self.prepare_inputs(out, kv)
        hidden = self.model(batch.input_ids, batch.positions, batch.meta)
        if not batch.sample_rows:
            return {}  # only prompt chunks with more to come
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        sampled: dict[str, list[int]] = {}
        for seq_id, token in zip(batch.sample_seq_ids, self.sampler(logits, batch.sample_rows), strict=True):
            sampled.setdefault(seq_id, []).append(token)
        return sampled

    def prepare_inputs(self, out: SchedulerOutput, kv: KVCacheManager) -> InputBatch:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        tables: list[list[int]] = []
        seq_lens: list[int] = []
        query_start_loc = [0]
        logits_indices: list[int] = []
        rows: list[SampleRow] = []
        seq_ids: list[str] = []
        work = [(req, 1) for req in out.decode_requests]
        work += zip(out.prefill_requests, out.prefill_num_tokens, strict=True)
        for req, n in work:
            start = req.num_computed_tokens
            end = start + n
            table = kv.block_table(req)
            input_ids += token_slice(req, start, end)
            positions += range(start, end)
            slots += table.slot_mapping(start, end)
            tables.append(table.block_ids)
            seq_lens.append(end)
            query_start_loc.append(len(input_ids))
            if end < req.num_tokens:
                continue  # a prompt chunk with more to come: nothing to sample
            parent = req.parent
            logits_index = len(logits_indices)
            logits_indices.append(len(input_ids) - 1)
            if req.sampling_params.n > 1 and parent is None and req.num_output_tokens == 0:
                indices = range(req.sampling_params.n)  # the scheduler forks here: one token per sequence
            else:
                indices = (req.index,)
            root = req.request_id if parent is None else parent.request_id
            params = req.sampling_params
            banned = req.stop_token_ids if req.num_output_tokens < params.min_tokens else frozenset()
            for i in indices:
                rows.append(SampleRow(logits_index, root, i, params, banned))
                seq_ids.append(req.request_id)
        width = max(len(t) for t in tables)
        device = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_table=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=device),
        )
        return InputBatch(torch.tensor(input_ids, device=device), torch.tensor(positions, device=device), meta,
                          torch.tensor(logits_indices, dtype=torch.int64, device=device), rows, seq_ids)
