"""data/reference/paper.csv as `helpers.reference` reads it: every row well formed, and a number
the paper prints but no stored source let us read ("-") says so instead of passing for a value."""

import pytest

from helpers import reference
from helpers.reference import Reference


def test_every_row_is_well_formed():
    rows = reference.table()
    assert list(rows.columns) == ["experiment", "model", "quantity", "value", "approx", "source", "note"]
    assert set(rows.approx) <= {"0", "1"}
    assert (rows.value != "").all() and (rows.source != "").all() and (rows.quantity != "").all()
    assert not rows.duplicated(["experiment", "model", "quantity"]).any()
    unread = rows[rows.value == reference.UNREAD]
    assert unread.note.str.startswith("not read").all(), "a '-' row's note says why its number could not be read"


def test_an_unread_number_says_where_it_is_printed_and_refuses_to_be_a_number():
    ref = reference.paper("beyond_mmlu", "gsm8k_clean", "llama-3.1-8b-instruct")
    assert not ref.read and str(ref) == "not read (Table 2)"
    with pytest.raises(ValueError, match=r"\(Table 2\) could not be read here: not read: "):
        ref.number
    assert Reference("0.66", False, "abstract").read and Reference("0.66", False, "abstract").number == 0.66


def test_section_6_has_both_conditions_of_every_task_for_each_model():
    rows = reference.paper_numbers("beyond_mmlu")
    for model in ("llama-3.1-8b-instruct", "llamba-8b", "falcon-mamba-7b-instruct"):
        quantities = set(rows[rows.model == model].quantity)
        assert quantities == {f"{task}_{cond}" for task in ("gsm8k", "bbh", "arc_challenge_chat", "swde")
                              for cond in ("clean", "top_heads_ablated")}
