"""Figures in the paper's style: seaborn whitegrid, accuracy in percent, 95% bands, chance lines."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns


def style() -> None:
    sns.set_theme(style="whitegrid", context="notebook", palette="deep")


def accuracy_curves(table: pd.DataFrame, x: str, hue: str, title: str, xlabel: str,
                    chance: dict[str, float] | None = None, ax=None):
    """One line per `hue` value of accuracy vs `x`, each with its 95% interval as a band.
    `table` has columns x, hue, acc, lo, hi."""
    style()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    palette = dict(zip(table[hue].unique(), sns.color_palette("deep")))
    for name, part in table.groupby(hue, sort=False):
        part = part.sort_values(x)
        ax.plot(part[x], 100 * part.acc, marker="o", ms=3, label=name, color=palette[name])
        ax.fill_between(part[x], 100 * part.lo, 100 * part.hi, alpha=0.2, color=palette[name])
        if chance and name in chance:
            ax.axhline(100 * chance[name], ls="--", lw=1, color=palette[name], alpha=0.7)
    ax.set(xlabel=xlabel, ylabel="accuracy (%)", title=title, ylim=(0, 102))
    ax.legend(frameon=True, fontsize="small")
    return ax


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")
    return path
