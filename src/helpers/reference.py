"""The paper's and the released code's reference numbers, kept in `data/reference/paper.csv`
with the figure or table each comes from."""

from __future__ import annotations

import pandas as pd

from . import paths


def paper_numbers(experiment: str | None = None) -> pd.DataFrame:
    table = pd.read_csv(paths.data() / "reference" / "paper.csv", comment="#")
    if experiment is not None:
        known = sorted(table.experiment.unique())
        if experiment not in known:
            raise KeyError(f"no reference numbers for {experiment!r}; known: {', '.join(known)}")
        table = table[table.experiment == experiment]
    return table.reset_index(drop=True)
