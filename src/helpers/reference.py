"""The paper's and the released code's numbers and settings, kept in `data/reference/paper.csv`
with the figure, table or file each comes from. The book compares runs against them and the
paper profile takes its settings from them (layers kept, heads, dictionary sizes, shots); it
never writes them as its own results. Imports nothing heavy (pandas).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import pandas as pd

from . import paths
from .heads import Head

UNREAD = "-"  # the value of a row whose number the paper prints but no stored source let us read


@dataclass(frozen=True)
class Reference:
    """One number or setting of the paper, as printed, with where it is printed. A value of
    "-" is a number the paper has (in `source`) that could not be read here: `note` says why."""

    value: str
    approx: bool  # read off a figure, or written with "~" / "about" in the text
    source: str
    note: str = ""
    secondary: bool = False  # from a secondary summary of the paper, not its body or the release

    @property
    def read(self) -> bool:
        """Whether the paper's value is known here (False for "-")."""
        return self.value != UNREAD

    @property
    def number(self) -> float:
        if not self.read:
            raise ValueError(
                f"the paper's value ({self.source}) could not be read here: {self.note}"
            )
        return float(self.value)

    @property
    def integer(self) -> int:
        return int(self.value)

    @property
    def heads(self) -> tuple[Head, ...]:
        """Heads written `L16H22;L17H24`; Falcon-Mamba's inner channels, written `L35C3186`, as
        heads of one channel (its adapter's heads)."""
        return tuple(Head.parse(v.replace("C", "H")) for v in self.value.split(";"))

    @property
    def integers(self) -> tuple[int, ...]:
        """A list written `2;4;8` or a range written `1..55`."""
        if ".." in self.value:
            lo, hi = self.value.split("..")
            return tuple(range(int(lo), int(hi) + 1))
        return tuple(int(v) for v in self.value.split(";"))

    def __str__(self) -> str:
        """As the comparison tables print it: `~66% (Fig. 2)`, `66.3% (§3.4)`, `L16H22 (§3.4)`,
        `not read (Table 2)`; a secondary summary's number says so: `66.3% (secondary summary)`."""
        if not self.read:
            return f"not read ({self.source})"
        try:
            number = float(self.value)
            text = (
                f"{number:.0%}" if self.approx else f"{number:.1%}" if number <= 1 else self.value
            )
        except ValueError:
            text = self.value
        return f"{'~' if self.approx else ''}{text} ({'secondary summary' if self.secondary else self.source})"


@cache
def table() -> pd.DataFrame:
    return pd.read_csv(
        paths.data() / "reference" / "paper.csv", comment="#", dtype=str, keep_default_na=False
    )


def paper(experiment: str, quantity: str, model: str = "") -> Reference:
    """The row of `experiment` and `quantity` (for `model`, where rows differ by model)."""
    rows = table()
    match = rows[(rows.experiment == experiment) & (rows.quantity == quantity)]
    if model:
        match = match[match.model == model]
    if len(match) != 1:
        known = rows[rows.experiment == experiment][["model", "quantity"]].drop_duplicates()
        raise KeyError(
            f"{len(match)} reference rows for {experiment}/{quantity}{'/' + model if model else ''}; "
            f"known: {', '.join(f'{m}/{q}' for m, q in known.itertuples(index=False))}"
        )
    row = match.iloc[0]
    return Reference(row.value, row.approx == "1", row.source, row.note, row.secondary == "1")


def paper_numbers(experiment: str | None = None) -> pd.DataFrame:
    """The rows of one experiment (all when None), as a table."""
    rows = table()
    if experiment is not None:
        known = sorted(rows.experiment.unique())
        if experiment not in known:
            raise KeyError(f"no reference numbers for {experiment!r}; known: {', '.join(known)}")
        rows = rows[rows.experiment == experiment]
    return rows.reset_index(drop=True)


def paper_heads(model: str) -> dict[str, tuple[Head, ...]] | None:
    """The release's Gather ("G") and Aggregate ("A") heads of `model` (data/reference), None
    where it names none (Falcon-Mamba's are inner channels: heads of one channel)."""
    try:
        return {
            "G": paper("head_zeroing", "gather_head", model).heads,
            "A": paper("head_zeroing", "aggregate_head", model).heads,
        }
    except KeyError:
        return None
