"""Figures in the paper's manner: seaborn whitegrid, accuracy in percent with 95% bands, chance
as a labelled dotted line, legends beside or below the data (never over it), and no text below
9 pt at the size the book shows a figure (about 7 inches across a laptop's text column)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

WIDTH = 7.0  # inches: the text column of the rendered book at 100%
MIN_FONT = 9


def style() -> None:
    sns.set_theme(
        style="whitegrid",
        context="notebook",
        palette="deep",
        rc={
            "font.size": 11,
            "axes.titlesize": 12,
            "axes.labelsize": 11,
            "xtick.labelsize": 10,
            "ytick.labelsize": 10,
            "legend.fontsize": 10,
            "legend.title_fontsize": 10,
            "figure.dpi": 110,
            "savefig.dpi": 150,
            "savefig.bbox": "tight",
        },
    )


def legend_below(ax, ncols: int = 3) -> None:
    """The axes' legend under the plot, where it covers nothing."""
    handles, labels = ax.get_legend_handles_labels()
    # Below the x label: half an inch under the axes, however short they are.
    height = ax.get_position().height * ax.figure.get_figheight()
    ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -max(0.16, 0.5 / height)),
        ncols=min(ncols, len(labels)),
        frameon=False,
    )


def accuracy_curves(
    table: pd.DataFrame,
    x: str,
    hue: str,
    title: str,
    xlabel: str,
    chance: dict[str, float] | None = None,
    ax=None,
):
    """One line per `hue` value of accuracy against `x`, each with its 95% interval as a band,
    and a dotted chance line per distinct chance level. `table` has columns x, hue, acc, lo, hi."""
    style()
    if ax is None:
        _, ax = plt.subplots(figsize=(WIDTH, 4.2))
    palette = dict(zip(table[hue].unique(), sns.color_palette("deep")))
    for name, part in table.groupby(hue, sort=False):
        part = part.sort_values(x)
        ax.plot(part[x], 100 * part.acc, marker="o", ms=3, label=name, color=palette[name])
        ax.fill_between(part[x], 100 * part.lo, 100 * part.hi, alpha=0.2, color=palette[name])
    for level, names in _by_level(chance or {}).items():
        ax.axhline(
            100 * level,
            ls=":",
            lw=1.2,
            color="0.35",
            label=f"chance, {' and '.join(names)} ({level:.0%})",
        )
    ax.set(xlabel=xlabel, ylabel="accuracy (%)", title=title, ylim=(0, 102))
    legend_below(ax)
    return ax


def _by_level(chance: dict[str, float]) -> dict[float, list[str]]:
    levels: dict[float, list[str]] = {}
    for name, level in chance.items():
        levels.setdefault(round(level, 4), []).append(name)
    return levels


def head_heatmap(
    values: pd.DataFrame,
    title: str,
    label: str,
    ax=None,
    center: float | None = None,
    limits: tuple[float, float] | None = None,
):
    """A layers x heads heatmap (rows: layers) of `values`, a DataFrame indexed by layer with one
    column per head; missing cells stay blank. Rows are at least 0.3 inch tall so that layer
    labels never overlap."""
    style()
    if ax is None:
        _, ax = plt.subplots(
            figsize=(min(WIDTH, 1.6 + 0.4 * values.shape[1]), 0.9 + 0.3 * values.shape[0])
        )
    vmin, vmax = limits or (None, None)
    sns.heatmap(
        values,
        ax=ax,
        cmap="rocket" if center is None else "vlag",
        center=center,
        vmin=vmin,
        vmax=vmax,
        cbar_kws={"label": label},
        linewidths=0.2,
        linecolor="white",
    )
    ax.set(xlabel="head", ylabel="layer", title=title)
    ax.tick_params(axis="y", rotation=0)
    return ax


def grouped_bars(
    table: pd.DataFrame,
    group: str,
    bar: str,
    title: str,
    chance: dict[str, float] | None = None,
    ax=None,
):
    """Accuracy bars with 95% error bars: one group of bars per `group` value (e.g. task), one bar
    per `bar` value (e.g. condition), the legend below; `chance` maps a group to its chance."""
    style()
    groups, bars = list(dict.fromkeys(table[group])), list(dict.fromkeys(table[bar]))
    if ax is None:
        _, ax = plt.subplots(figsize=(WIDTH, 4.2))
    width = 0.8 / len(bars)
    for k, name in enumerate(bars):
        part = table[table[bar] == name].set_index(group).reindex(groups)
        x = np.arange(len(groups)) + (k - (len(bars) - 1) / 2) * width
        ax.bar(
            x,
            100 * part.acc,
            width,
            label=name,
            yerr=[100 * (part.acc - part.lo), 100 * (part.hi - part.acc)],
            capsize=2,
        )
    for i, g in enumerate(groups):
        if chance and g in chance:
            ax.hlines(
                100 * chance[g],
                i - 0.45,
                i + 0.45,
                colors="0.2",
                linestyles=":",
                lw=1.5,
                label="chance" if i == 0 else None,
            )
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set(ylabel="accuracy (%)", ylim=(0, 105), title=title)
    legend_below(ax, ncols=2)
    return ax


def attention_figure(a: np.ndarray, seg, title: str, max_tokens: int = 48):
    """One head's attention (or |hidden attention|) over a prompt's last `max_tokens` tokens, as
    a heatmap with token labels and segment boundaries (rows scaled to their maximum, so that
    faint rows stay visible), above the final position's row as bars coloured by segment (the
    answer's segment in red)."""
    style()
    T = len(seg)
    start = max(0, T - max_tokens)
    ticks = list(range(start, T))
    labels = [seg.labels[t] for t in ticks]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(WIDTH, 9.2), gridspec_kw={"height_ratios": [3.2, 1]}
    )
    sub = np.abs(a[start:, start:])
    top.imshow(sub / (sub.max(axis=1, keepdims=True) + 1e-12), cmap="Blues", aspect="auto")
    for e in seg.ends:
        if e >= start:
            top.axhline(e - start + 0.5, color="0.55", lw=0.6)
            top.axvline(e - start + 0.5, color="0.55", lw=0.6)
    for ax in (top, bottom):
        ax.set_xticks(range(len(ticks)), labels, rotation=90, fontsize=MIN_FONT)
    top.set_yticks(range(len(ticks)), labels, fontsize=MIN_FONT)
    top.grid(False)
    top.set_title(title)
    colours = [
        "tab:red" if seg.segment[t] == seg.target else "tab:blue" if seg.segment[t] >= 0 else "0.6"
        for t in ticks
    ]
    bottom.bar(range(len(ticks)), a[-1, start:], color=colours)
    bottom.set_ylabel("from the final\nposition")
    bottom.set_xlim(-0.5, len(ticks) - 0.5)
    fig.tight_layout()
    return fig


def save(fig, path: Path) -> Path:
    fig.savefig(path)
    return path
