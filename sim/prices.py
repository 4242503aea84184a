"""Default prices of one GPU-hour, in US dollars, for the search's cost columns.

Source: AWS EC2 on-demand list prices, us-east-1, Linux, as published in 2024, divided by the
instance's GPUs (the host's CPUs, memory and network come with them, as a GPU is rented):
- a100-80gb: p4de.24xlarge, 8 x A100-80GB SXM, $40.966/h  -> $5.12
- h100:      p5.48xlarge,   8 x H100 SXM,     $98.32/h   -> $12.29 (AWS cut P5 prices in 2025)
- l4:        g6.xlarge,     1 x L4,           $0.8048/h  -> $0.80
Prices change and differ across clouds (and reserved or spot capacity costs far less): pass
your own with `--gpu-hour-usd h100=2.99,...`. Hardware without a price here (h200, rtx-4090)
gets no cost columns unless given one.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from .hardware import get_hardware

GPU_HOUR_USD: dict[str, float] = {"a100-80gb": 40.966 / 8, "h100": 98.32 / 8, "l4": 0.8048}


def parse_prices(text: str, hardware: Iterable[str] = ()) -> dict[str, float]:
    """'h100=2.99,a100=1.79' -> {'h100': 2.99, 'a100-80gb': 1.79} (hardware names resolved).
    A GPU of `hardware` given as a spec file is priced under its spec's `name` (my-gpu=1.5), the
    name its rows go by, as well as under its path."""
    specs = {get_hardware(h).name for h in hardware}
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, price = part.partition("=")
        try:
            value = float(price)
        except ValueError:
            value = math.nan
        if not sep or not value > 0 or not math.isfinite(value):
            raise ValueError(f"--gpu-hour-usd {part!r}: expected HARDWARE=PRICE with a price > 0")
        name = name.strip()
        out[name.lower() if name.lower() in specs else get_hardware(name).name] = value
    return out


def gpu_hour_usd(hardware: str, overrides: dict[str, float] | None = None) -> float:
    """The price of one GPU-hour of `hardware` (NaN when unknown)."""
    name = get_hardware(hardware).name
    return (overrides or {}).get(name, GPU_HOUR_USD.get(name, math.nan))
