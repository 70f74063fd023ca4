"""The reference table: every row reads, and the corrections of issue 19 hold (which model the
66% belongs to, the heads of Fig. 4, the secondary summaries flagged, disagreeing ones both kept)."""

import pytest

from helpers.reference import paper, table


def test_every_row_reads_once_with_a_source_and_a_secondary_flag():
    rows = table()
    assert not rows.duplicated(["experiment", "model", "quantity"]).any()
    assert set(rows.secondary) == {"0", "1"} and (rows.source != "").all()
    secondary = rows[rows.secondary == "1"]
    assert secondary.source.str.contains("secondary summary").all()  # each says where it comes from


def test_the_66_percent_is_the_minimal_models_not_the_full_models():
    minimal = paper("layer_pruning", "mmlu_minimal_model", "llama-3.1-8b-instruct")
    assert minimal.number == 0.66 and "not the full model's" in minimal.note and not minimal.secondary
    with pytest.raises(KeyError, match="known: .*mmlu_minimal_model"):
        paper("layer_pruning", "mmlu_while_pruning", "llama-3.1-8b-instruct")
    summary = paper("head_zeroing", "mmlu_minimal_summary", "llama-3.1-8b-instruct")
    assert summary.number == pytest.approx(0.6632) and summary.secondary and str(summary) == "66.3% (secondary summary)"


def test_fig_4s_heads_as_the_release_and_a_summary_give_them():
    assert [str(h) for h in paper("kv_retrieval", "head_ablated", "llama-3.1-8b-instruct").heads] == ["L17H24"]
    summary = paper("kv_retrieval", "head_ablated_summary", "llama-3.1-8b-instruct")
    assert [str(h) for h in summary.heads] == ["L16H22", "L17H24"] and summary.secondary


def test_disagreeing_summaries_of_zamba2_are_both_recorded_and_flagged():
    nine = paper("hybrid_models", "heads_ablated", "zamba2-7b")
    six = paper("hybrid_models", "heads_ablated_other_summary", "zamba2-7b")
    assert (nine.integer, six.integer) == (9, 6) and nine.secondary and six.secondary
    assert "six" in nine.note and "nine" in six.note  # each points at the other
    knowledge = paper("hybrid_models", "knowledge_kept", "zamba2-7b")
    assert knowledge.secondary and knowledge.approx and str(knowledge) == "~70% (secondary summary)"
    llamba = paper("head_zeroing", "mmlu_kept_fraction_30_heads_removed", "llamba-8b")
    assert llamba.number == 0.95 and llamba.secondary
    assert paper("attention_maps", "fig5_models").value.split(";") == [
        "llama-3.1-8b-instruct", "llamba-8b", "falcon-mamba-7b-instruct"]
