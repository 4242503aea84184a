"""GET /debug/kv: the block pool, every live request's block table, and an audit of the two.

The audit is the invariant that makes paged memory safe: a block's reference count equals the
number of live block tables that hold it (plus the copies in flight within a step, none between
steps, which is when this runs). A block with references that no live table holds is leaked: it
will never be free again. A table whose request the scheduler no longer knows is leaked too.
"""
from __future__ import annotations

from collections import Counter

from paged.engine import LLMEngine


def kv_report(engine: LLMEngine) -> dict:
    """Run between steps (AsyncLLM.inspect): nothing moves while it reads."""
    scheduler = engine.scheduler
    kv = scheduler.kv
    pool = kv.pool
    live = scheduler.requests
    holders = Counter(b.block_id for rid, table in kv.tables.items() if rid in live for b in table.blocks)
    mismatched = [{"block": b.block_id, "ref_cnt": b.ref_cnt, "holders": holders[b.block_id]}
                  for b in pool.blocks if b.ref_cnt != holders[b.block_id]]
    stats = scheduler.stats()
    requests = []
    for rid, table in kv.tables.items():
        seq = live.get(rid)
        if seq is None:
            continue
        requests.append({"request_id": engine.owner(seq), "sequence": seq.index, "status": seq.status.name.lower(),
                         "num_tokens": seq.num_tokens, "num_computed_tokens": seq.num_computed_tokens,
                         "block_table": table.block_ids})
    return {
        # free: blocks with no reference, of which cached: those still holding a prefix-cache entry
        "pool": {"num_blocks": pool.num_blocks, "block_size": kv.block_size, "free": pool.num_free_blocks,
                 "cached": sum(b.ref_cnt == 0 and b.block_hash is not None for b in pool.blocks),
                 "used": pool.num_used_blocks, "fragmentation": stats.fragmentation,
                 "allocations": pool.num_allocations, "frees": pool.num_frees},
        "requests": requests,
        "audit": {"ok": not mismatched and all(rid in live for rid in kv.tables),
                  "mismatched_ref_counts": mismatched,
                  "leaked_blocks": [m["block"] for m in mismatched if m["ref_cnt"] > 0 and m["holders"] == 0],
                  "orphan_tables": [rid for rid in kv.tables if rid not in live]},
    }

