"""Reading a server's Prometheus exposition: the samples by name, counters summed over their
labels (a vLLM server labels each by model and engine), histograms as cumulative buckets, and a
quantile from those buckets as Prometheus' `histogram_quantile` computes it."""
from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One exposition. `value(name)` sums a sample over its label sets (None when absent);
    `buckets(name)` is a histogram's {upper bound: cumulative count}, summed likewise."""

    def __init__(self, text: str) -> None:
        self.samples: dict[str, list] = defaultdict(list)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.samples[s.name].append(s)

    def value(self, *names: str) -> float | None:
        """The first of `names` present, summed over its label sets."""
        for name in names:
            if name in self.samples:
                return float(sum(s.value for s in self.samples[name]))
        return None

    def max(self, *names: str) -> float | None:
        for name in names:
            if name in self.samples:
                return float(max(s.value for s in self.samples[name]))
        return None

    def buckets(self, histogram: str) -> dict[float, float]:
        out: dict[float, float] = defaultdict(float)
        for s in self.samples.get(f"{histogram}_bucket", ()):
            out[float(s.labels["le"])] += s.value
        return dict(out)


def bucket_delta(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    """The observations between two scrapes of one histogram."""
    return {le: n - before.get(le, 0.0) for le, n in after.items()}


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """The q-quantile (0..1) of cumulative buckets, interpolated linearly within its bucket as
    Prometheus does (the lowest bucket from 0; a quantile in the +Inf bucket is the highest
    finite bound). NaN without observations."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if not total:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = le, count
    return lower
