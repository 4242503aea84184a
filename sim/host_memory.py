"""Will a run fit in this machine's memory? An estimate taken before simulating, so that a
setting that would exhaust it (a hundred million KV blocks, a time series sampled every
nanosecond) is refused at once with the setting named, instead of swapping the machine to a
halt or being killed by the kernel an hour in.

The figures are what the simulator's own structures take per item, measured with tracemalloc
on CPython 3.12 and rounded up: one `Block` object and its places in the pool's lists, one
time-series row (a tuple of 8 floats in a list, then a numpy row).
"""
from __future__ import annotations

import os

BYTES_PER_BLOCK = 128
BYTES_PER_SAMPLE = 400


def available_bytes() -> int:
    """Memory the kernel says a new allocation can have (MemAvailable), else the physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(num_gpu_blocks: int, replicas: int, min_run_s: float, interval_s: float) -> int:
    """Raise ValueError when the KV pools or the time series (one sample per interval and
    replica, over at least `min_run_s`: a lower bound of the run's length) would take more than
    half the memory available: the rest is for the requests, the results and the machine's
    other work. Return the most samples a replica's time series may hold within that half,
    which `TimeSeries` enforces whatever the run's length turns out to be."""
    free = available_bytes() // 2
    blocks = BYTES_PER_BLOCK * num_gpu_blocks * replicas
    if blocks > free:
        raise ValueError(f"num_gpu_blocks={num_gpu_blocks:,} x {replicas} replica(s) would take about "
                         f"{blocks / 2**30:.1f} GiB of this machine's memory ({BYTES_PER_BLOCK} bytes a block), "
                         f"half of what is available is {free / 2**30:.1f} GiB: expected at most "
                         f"{free // (BYTES_PER_BLOCK * replicas):,} blocks (--num-gpu-blocks, or a larger "
                         "--block-size)")
    free -= blocks
    samples = (min_run_s / interval_s + 1) * replicas
    if samples * BYTES_PER_SAMPLE > free:
        raise ValueError(f"timeseries_interval_s={interval_s:g}: the run lasts at least {min_run_s:,.3g} s (its "
                         f"arrivals, and the steps its requests need), so the time series would hold at least "
                         f"{samples:,.0f} samples, about {samples * BYTES_PER_SAMPLE / 2**30:,.1f} GiB (half of what "
                         f"is available is {free / 2**30:.1f} GiB): expected an interval of at least "
                         f"{min_run_s * replicas * BYTES_PER_SAMPLE / free:.3g} s (--timeseries-interval-s)")
    return max(2, free // (BYTES_PER_SAMPLE * replicas))
