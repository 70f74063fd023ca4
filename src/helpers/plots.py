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


def head_heatmap(values, title: str, label: str, ax=None, center: float | None = None):
    """A layers x heads heatmap (rows: layers) of `values`, a DataFrame indexed by layer with
    one column per head; missing cells stay blank."""
    style()
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.45 * values.shape[1], 0.6 + 0.28 * values.shape[0]))
    sns.heatmap(values, ax=ax, cmap="rocket" if center is None else "vlag", center=center,
                cbar_kws={"label": label}, linewidths=0.2, linecolor="white")
    ax.set(xlabel="head", ylabel="layer", title=title)
    return ax


def attention_figure(maps: dict[str, "np.ndarray"], seg, title: str):
    """For each head: its attention (or hidden attention) over the prompt as a heatmap with
    token labels and segment boundaries, and the final position's row as bars, coloured by
    segment role (answer segment in red)."""
    import numpy as np

    style()
    n = len(maps)
    fig, axes = plt.subplots(2, n, figsize=(6.5 * n, 9), gridspec_kw={"height_ratios": [3, 1]}, squeeze=False)
    bounds = [e + 0.5 for e in seg.ends]
    start = max(0, int(np.flatnonzero(seg.segment >= 0)[0]) - 2)  # crop the header
    ticks = list(range(start, len(seg)))
    for k, (name, a) in enumerate(maps.items()):
        ax = axes[0, k]
        sub = np.abs(a[start:, start:])
        ax.imshow(sub / (sub.max(axis=1, keepdims=True) + 1e-12), cmap="Blues", aspect="auto")
        for b in bounds:
            ax.axhline(b - start, color="0.6", lw=0.5)
            ax.axvline(b - start, color="0.6", lw=0.5)
        ax.set_xticks(range(len(ticks)), [seg.labels[t] for t in ticks], rotation=90, fontsize=6)
        ax.set_yticks(range(len(ticks)), [seg.labels[t] for t in ticks], fontsize=6)
        ax.set_title(f"{name} (rows scaled to their maximum)")
        ax.grid(False)
        colours = ["tab:red" if seg.segment[t] == seg.target else ("tab:blue" if seg.segment[t] >= 0 else "0.6")
                   for t in ticks]
        axes[1, k].bar(range(len(ticks)), a[-1, start:], color=colours)
        axes[1, k].set_xticks(range(len(ticks)), [seg.labels[t] for t in ticks], rotation=90, fontsize=6)
        axes[1, k].set_ylabel("from the final position")
    fig.suptitle(title)
    return fig
