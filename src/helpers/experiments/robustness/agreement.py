"""How far two head rankings agree, with the statistics patching and stability share: rank
correlation, top-k overlap against the overlap of random sets, bootstrap intervals over prompts,
and chance on a KV task."""

from __future__ import annotations

import numpy as np

from ... import benchmarks as bm
from ...stats import rank_correlation

# resamples of the prompts for the rankings' intervals (a fixed generator)
BOOTSTRAP = 1000


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho (`stats.rank_correlation`; nan where a side is constant or under 5 heads)."""
    return rank_correlation(x, y)[0]


def interval(values: np.ndarray) -> tuple[float, float]:
    """The 2.5% and 97.5% points of bootstrap values, nan where none is defined."""
    values = values[~np.isnan(values)]
    return (
        (float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975)))
        if len(values)
        else (np.nan, np.nan)
    )


def overlap_chance(n: int, k: int) -> tuple[float, float]:
    """The top-k overlap of two random orders of n heads: its mean k^2 / n and its 97.5% point
    (hypergeometric), the line an overlap must pass to beat chance."""
    from math import comb

    cdf = 0.0
    # the overlap is hypergeometric: k of n drawn, k of them "top" in the other order
    for x in range(k + 1):
        cdf += comb(k, x) * comb(n - k, k - x) / comb(n, k)
        if cdf >= 0.975 - 1e-12:
            break
    return k * k / n, float(x)


def base_chance(pairs: int, loaded) -> float:
    return bm.kv(loaded.name, loaded.tokenizer, pairs, 1, 0).chance


# the source the patching and stability verdicts cite
CHECK_SOURCE = "§3.4, Table 5 (heads found by zeroing on one prompt set); this book's check"
