"""The atlas: the run at smoke size, the stores it shares with head zeroing, and its verdicts both
ways on hand-built rows."""

import os
from pathlib import Path

import pytest

from helpers import registry
from helpers import verdicts as v
from helpers.errors import ConfigError
from helpers.experiments import atlas as chapter
from helpers.experiments import head_zeroing
from helpers.heads import Head
from helpers.protocol.head_screen import NONE, LayerScan, attention_of
from helpers.stats import Score, TaskMean

TOY = "toy-transformer"  # the code path of the real models, with a walk and a screen of seconds


def lines(folder: Path) -> dict[str, list[str]]:
    return {p.name: p.read_text().splitlines() for p in folder.rglob("*.jsonl")}


def test_run_at_smoke_size_fills_a_row_per_task_and_adds_nothing_to_head_zeroings_stores():
    head_zeroing.run(head_zeroing.Config.for_profile("cpu", smoke=True, model=TOY))
    folder = Path(os.environ["GA_RESULTS"]) / "head_zeroing"
    before = lines(folder)
    result = chapter.run(chapter.Config.for_profile("cpu", smoke=True, models=[TOY]))
    after = lines(folder)
    # The letters' walk, scan and screen are head zeroing's cells: read, not measured again; what
    # the atlas adds to those stores is its KV row's (head zeroing ran letters only).
    assert all(after[k][: len(lines_)] == lines_ for k, lines_ in before.items())
    added = [line for k, lines_ in after.items() for line in lines_[len(before.get(k, [])) :]]
    assert added and all('"kind": "kv"' in line and '"mcq"' not in line for line in added)
    assert [(r.model, r.task) for r in result.rows] == [(TOY, "kv"), (TOY, "mmlu")]
    for row in result.rows:
        assert row.measured or row.reason
        if row.measured and row.top is not None:
            assert set(row.conditions) == {NONE, chapter.TOP, chapter.TOP_FIVE, chapter.LAYER}
            assert len({s.n for s in row.conditions.values()}) == 1  # the same check prompts
            assert row.top == row.top_five[0] and 0 <= row.layer < row.kept
    note = chapter.power_note(result)
    for row in result.rows:
        if row.measured and row.top is not None:
            assert f"{row.label}: n = {row.clean.n}" in note
    assert list(chapter.protocol_table(result).model) == [f"{TOY} (toy)"] * 2  # marked as a toy
    assert chapter.subject(result) == f"{TOY} (toy) on the cpu profile"
    measured = [r for r in result.rows if r.measured and r.top is not None]
    assert len(chapter.zeroing_table(result)) == len(measured)
    assert len(chapter.verdicts(result)) == 4
    assert {x.outcome for x in chapter.verdicts(result)} <= set(v.OUTCOMES)
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]


def test_the_atlas_takes_attention_models_each_once():
    with pytest.raises(ConfigError, match="more than once"):
        chapter.Config.for_profile("cpu", smoke=True, models=[TOY, TOY])
    with pytest.raises(ConfigError, match="toy-mamba2"):
        chapter.Config.for_profile("cpu", smoke=True, models=["toy-mamba2"])


def test_at_smoke_size_the_atlas_runs_the_smallest_model_unless_told_otherwise():
    full = chapter.Config.for_profile("cpu").models
    assert full == (*registry.ATLAS["cpu"], *chapter.TOYS["cpu"]) and len(full) == 5
    assert chapter.Config.for_profile("cpu", smoke=True).models == full[:1]
    assert chapter.Config.for_profile("cpu", smoke=True, models=[TOY]).models == (TOY,)
    assert chapter.Config.for_profile("paper", smoke=True).models == registry.ATLAS["paper"]


# --- verdicts on hand-built rows -----------------------------------------------------------------


def score(right: int, n: int = 200) -> Score:
    return Score.of([True] * right + [False] * (n - right))


def row(clean=160, top=50, knowledge_top=150, whole=170, knowledge_clean=150) -> chapter.Row:
    """Letters with chance 25%: `clean` of 200 right with no head zeroed, `top` with the most
    harmful head zeroed; knowledge (one cloze task) likewise."""
    k = lambda right: TaskMean.of([score(right)], [0.25])
    # the zeroed items are a subset of the clean ones' right answers: a paired loss
    return chapter.Row(
        "m",
        "mmlu",
        24,
        0.25,
        score(whole),
        18,
        conditions={
            NONE: score(clean),
            chapter.TOP: score(top),
            chapter.TOP_FIVE: score(top),
            chapter.LAYER: score(top),
        },
        knowledge={NONE: k(knowledge_clean), chapter.TOP: k(knowledge_top)},
        top=Head(16, 2),
        top_five=(Head(16, 2),),
        layer=16,
    )


def test_one_head_is_reproduced_when_the_head_takes_the_task_to_chance_and_not_when_it_does_little():
    assert chapter.one_head(row(top=50))[0] == v.REPRODUCED
    assert chapter.one_head(row(top=155))[0] == v.NOT_REPRODUCED
    at_chance = chapter.Row("m", "mmlu", 24, 0.25, score(52), reason="at chance")
    assert chapter.one_head(at_chance) == (v.NOT_TESTABLE, "at chance")


def test_knowledge_kept_is_judged_only_where_the_head_hurts_and_can_come_out_either_way():
    assert chapter.knowledge_kept(row(top=50, knowledge_top=150))[0] == v.REPRODUCED
    assert chapter.knowledge_kept(row(top=50, knowledge_top=90))[0] == v.NOT_REPRODUCED
    assert chapter.knowledge_kept(row(top=160, knowledge_top=90))[0] == v.NOT_TESTABLE


def test_the_top_heads_share_is_of_the_whole_layers_loss_and_says_when_the_layer_costs_nothing():
    r = row(clean=160, top=100)
    conditions = {**r.conditions, chapter.LAYER: score(40), chapter.TOP_FIVE: score(70)}
    r = chapter.Row(**{**r.__dict__, "conditions": conditions})
    assert chapter.share(r, chapter.TOP) == "50%" and chapter.share(r, chapter.TOP_FIVE) == "75%"
    flat = chapter.Row(**{**r.__dict__, "conditions": {**conditions, chapter.LAYER: score(158)}})
    assert chapter.share(flat, chapter.TOP).startswith("- (the layer's loss is 1.0 points")


def test_the_critical_layer_costs_the_task_most_beyond_knowledge_among_those_that_keep_it():
    # L0 costs the task most but knowledge as much; L2 costs the task less and knowledge nothing.
    task = {NONE: score(160), attention_of(0): score(40), attention_of(1): score(158)}
    task[attention_of(2)] = score(90)
    knowledge = {NONE: score(150), attention_of(0): score(30), attention_of(1): score(150)}
    knowledge[attention_of(2)] = score(150)
    scan = LayerScan(task, {"cloze": knowledge}, 0.25, True)
    assert chapter.critical_layer(scan) == 2
    # L0 costs the task beyond knowledge more than L2 does, but it surely breaks knowledge too
    knowledge[attention_of(0)] = score(110)
    task[attention_of(0)] = score(20)
    scan = LayerScan(task, {"cloze": knowledge}, 0.25, True)
    assert scan.specific(0) > scan.specific(2) and scan.breaks_knowledge(0)
    assert scan.that_matter() == [2, 0] and chapter.critical_layer(scan) == 2
    # where no layer surely matters, the one that costs the task most
    flat = {NONE: score(160), **{attention_of(l): score(158 + l) for l in range(3)}}
    assert chapter.critical_layer(LayerScan(flat, {}, 0.25, True)) == 0
