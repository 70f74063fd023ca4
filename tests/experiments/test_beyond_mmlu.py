"""Beyond MMLU (§6, Table 2): the run at smoke size through lm-eval (resumed from its store), the
pairing of lm-eval's per-item records, the random controls, every verdict both ways on
hand-built results, and bad parameters."""

import numpy as np
import pandas as pd
import pytest

from helpers import heads as hd
from helpers import lmeval
from helpers import verdicts as v
from helpers.errors import ConfigError
from helpers.experiments import beyond_mmlu as chapter
from helpers.heads import Head
from helpers.protocol import loading
from helpers.stats import Score


def test_run_at_smoke_size_scores_every_task_under_every_condition_and_resumes(monkeypatch):
    # SmolLM2 (a CPU model lm-eval drives; the book's smoke build runs Qwen) on two tasks, one with a filter.
    cfg = chapter.Config.for_profile(
        "cpu", smoke=True, model="smollm2-135m-instruct", n=2, tasks=["page_field", "choice_chat"]
    )
    calls, evaluate = [], lmeval.evaluate

    def spy(model, tasks, spec, **kw):
        calls.append((tuple(tasks), kw["apply_chat_template"]))
        return evaluate(model, tasks, spec, **kw)

    monkeypatch.setattr(lmeval, "evaluate", spy)
    result = chapter.run(cfg)
    assert len(result.top.heads) == 2 and len(result.controls) == 1
    # no control holds a top head
    assert not set(result.controls[0]) & set(hd.measured(result.top.table)[:4])
    assert set(result.scores) == {"page_field", "choice_chat"}
    for task, by_condition in result.scores.items():
        assert list(by_condition) == result.conditions
        for s in by_condition.values():
            # lm-eval's aggregate = the items' mean
            assert s.score.n == 2 and s.lm_eval == pytest.approx(s.score.acc)
    assert result.scores["choice_chat"][chapter.CLEAN].metric == "exact_match,remove_whitespace"
    assert {x.outcome for x in chapter.verdicts(result)} <= set(v.OUTCOMES) and len(
        chapter.verdicts(result)
    ) == 1 + 2 * 2
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]
    assert len(chapter.scores_table(result)) == 2 * len(result.conditions)
    assert result.scores["page_field"][chapter.CLEAN].metric == "contains,none"  # SWDE's
    assert (
        result.scores["page_field"][chapter.CLEAN].n_shot == 0
        and result.scores["choice_chat"][chapter.CLEAN].n_shot == 0
    )
    # a *_chat task in the chat template
    assert sorted(set(calls)) == [
        (("choice_chat",), True),
        (("page_field",), False),
    ]
    # Every cell is in the store: run again, and lm-eval is not called.
    monkeypatch.setattr(
        lmeval, "evaluate", lambda *a, **k: pytest.fail("a stored cell was computed again")
    )
    again = chapter.run(cfg)
    assert again.top.heads == result.top.heads and again.controls == result.controls
    assert {
        t: {c: s.score.correct.tolist() for c, s in by.items()} for t, by in again.scores.items()
    } == {
        t: {c: s.score.correct.tolist() for c, s in by.items()} for t, by in result.scores.items()
    }


def sample(doc_id, value, filter="none", metric="exact_match"):
    return {"doc_id": doc_id, "filter": filter, "metrics": [metric], metric: value}


def test_each_items_score_comes_from_lm_evals_records_in_doc_order_under_the_first_filter():
    # Records come in any order; gsm8k has two filters (strict-match first in its YAML)
    results = {
        "samples": {
            "gsm8k": [
                sample(1, 0.0, "strict-match"),
                sample(0, 1.0, "strict-match"),
                sample(1, 1.0, "flexible-extract"),
                sample(0, 1.0, "flexible-extract"),
            ]
        },
        "results": {
            "gsm8k": {"exact_match,strict-match": 0.5, "exact_match,flexible-extract": 1.0}
        },
        "n-shot": {"gsm8k": 5},
    }
    s = chapter.per_item(results, ["gsm8k"], "gsm8k")
    assert s.score.correct.tolist() == [True, False] and s.metric == "exact_match,strict-match"
    assert (s.lm_eval, s.n_shot) == (0.5, 5)
    # a group cut short: its subtasks' items one after the other, the pooled mean; other tasks' left out
    results = {
        "samples": {
            "bbh_b": [sample(0, 0.0, "get-answer")],
            "bbh_a": [sample(1, 1.0, "get-answer"), sample(0, 0.0, "get-answer")],
            "gsm8k": [sample(0, 1.0)],
        },
        "results": {},
        "n-shot": {},
    }
    s = chapter.per_item(results, ["bbh_b", "bbh_a"])
    assert s.score.correct.tolist() == [False, True, False] and s.lm_eval == pytest.approx(1 / 3)
    # SWDE's own metric
    s = chapter.per_item(
        {
            "samples": {"swde": [sample(0, 1, metric="contains")]},
            "results": {"swde": {"contains,none": 1.0}},
        },
        ["swde"],
        "swde",
    )
    assert s.metric == "contains,none" and s.score.correct.tolist() == [True]


def ranking(heads, accs, clean=0.9, held=(0.9, 0.5)):
    table = pd.DataFrame(
        [
            dict(
                layer=h.layer,
                head=h.head,
                estimate=-1.0 + i,
                acc=a,
                lo=a - 0.05,
                hi=a + 0.05,
                n=200,
            )
            for i, (h, a) in enumerate(zip(heads, accs))
        ]
    )
    return chapter.TopHeads(
        tuple(heads[:2]),
        table,
        at(clean),
        0.01,
        "made up",
        at(held[0], 400),
        at(held[1], 400, offset=3),
    )


def test_random_controls_are_distinct_sets_of_the_same_size_away_from_the_top_heads():
    heads = [Head(3, 0), Head(4, 1), Head(3, 2), Head(4, 3)]
    top = ranking(heads, [0.1, 0.2, 0.3, 0.4])
    drawn = chapter.controls(top, {l: 6 for l in range(8)}, 5, seed=0)
    assert len(drawn) == len(set(drawn)) == 5 and {len(c) for c in drawn} == {2}
    assert all(h.layer in (3, 4) and h not in heads for c in drawn for h in c)
    assert drawn == chapter.controls(top, {l: 6 for l in range(8)}, 5, seed=0)  # from the seed
    assert drawn != chapter.controls(top, {l: 6 for l in range(8)}, 5, seed=1)
    # the top heads' layers hold too few other heads: all layers
    assert any(
        h.layer not in (3, 4)
        for c in chapter.controls(top, {l: 2 for l in range(8)}, 3, 0)
        for h in c
    )


def at(acc, n=100, offset=0):
    return Score.of(np.roll(np.arange(n) < round(acc * n), offset))


def made_up(tasks, clean, top, controls, held=(0.9, 0.5)):
    """A run whose tasks score `clean`, `top` and `controls` (one value per task or a list), and
    whose top heads take held-out KV prompts from held[0] to held[1]."""
    cfg = chapter.Config.for_profile("paper", tasks=list(tasks))
    heads = [Head(16, 22), Head(17, 24), Head(16, 3), Head(17, 5)]
    table = ranking(heads, [0.5, 0.6, 0.7, 0.8], held=held)
    drawn = [(Head(16, 10 + i), Head(17, 10 + i)) for i in range(len(controls))]
    scores = {}
    for t in tasks:
        scores[t] = {
            chapter.CLEAN: at(clean),
            chapter.TOP: at(top, offset=2),
            **{chapter.control(i): at(c, offset=i) for i, c in enumerate(controls)},
        }
        scores[t] = {
            k: chapter.TaskScore(s, "exact_match,none", s.acc, 0) for k, s in scores[t].items()
        }
    return chapter.Result(cfg, table, drawn, scores, {}, {})


def test_table_2_is_reproduced_where_the_top_heads_lower_every_task_below_every_control():
    result = made_up(["gsm8k", "swde"], clean=0.7, top=0.3, controls=[0.7, 0.68])
    premise, *claims = chapter.verdicts(result)
    assert (
        premise.kind == v.CHECK
        and premise.outcome == v.REPRODUCED
        and "400 held-out prompts" in premise.evidence
    )
    assert [x.outcome for x in claims] == [v.REPRODUCED] * 4 and v.overall(
        chapter.verdicts(result)
    ) == v.REPRODUCED
    assert "below every random control (2 draws)" in claims[1].evidence


def test_top_heads_no_more_harmful_than_random_heads_are_not_a_bottleneck():
    result = made_up(["gsm8k"], clean=0.7, top=0.3, controls=[0.7, 0.3])
    _, lowers, beyond = chapter.verdicts(result)
    assert lowers.outcome == v.REPRODUCED and beyond.outcome == v.NOT_REPRODUCED
    # the headline holds, a claim that rests on it fails
    assert v.overall(chapter.verdicts(result)) == v.PARTLY
    _, lowers, beyond = chapter.verdicts(made_up(["gsm8k"], clean=0.7, top=0.7, controls=[0.7]))
    assert lowers.outcome == beyond.outcome == v.NOT_REPRODUCED
    assert (
        v.overall(chapter.verdicts(made_up(["gsm8k"], clean=0.7, top=0.7, controls=[0.7])))
        == v.NOT_REPRODUCED
    )


def test_a_task_below_its_floor_or_heads_that_do_not_carry_retrieval_cannot_test_the_claim():
    # exact match on open answers: 3 of 100 right clears chance (0) but not the 5% floor
    assert {
        x.outcome
        for x in chapter.verdicts(made_up(["gsm8k"], clean=0.03, top=0.0, controls=[0.03]))[1:]
    } == {v.NOT_TESTABLE}
    # letters: 30% does not clear ARC's 25% guessing rate with its interval; BBH's floor is 50%
    assert {
        x.outcome for x in chapter.verdicts(made_up(["arc_challenge_chat"], 0.3, 0.0, [0.3]))[1:]
    } == {v.NOT_TESTABLE}
    assert chapter.floor("bbh_cot_fewshot_navigate") == chapter.floor("bbh") == 0.5
    # the top heads zeroed together leave held-out KV as it was: whatever the tasks do, not testable
    result = made_up(["gsm8k"], clean=0.7, top=0.3, controls=[0.7], held=(0.9, 0.9))
    premise, *claims = chapter.verdicts(result)
    assert premise.outcome == v.NOT_REPRODUCED and {x.outcome for x in claims} == {v.NOT_TESTABLE}
    assert all("not shown to be retrieval heads" in x.evidence for x in claims)
    assert v.overall(chapter.verdicts(result)) == v.NOT_TESTABLE
    assert "not shown to carry retrieval" in chapter.premise_note(result)


def test_the_table_2_comparison_says_the_papers_numbers_were_not_read():
    table = chapter.comparison(made_up(["gsm8k", "bbh"], clean=0.7, top=0.3, controls=[0.7]))
    rows = dict(zip(table[""], table.paper))
    assert rows["gsm8k, clean"] == rows["bbh, top heads zeroed"] == "-"
    assert rows["Table 2's numbers"].startswith("- : not read")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tasks=[]), "tasks must list lm-eval task names"),
        (dict(tasks="gsm8k"), "tasks must be a list of lm-eval task names"),
        (dict(tasks=["gsm8k", "gsm8k"]), "lists gsm8k more than once"),
        (dict(model="toy-transformer"), "toy zoo"),
        (dict(model="llamba-8b", profile="paper"), "the book's Llamba"),
        (dict(ranking="exact"), "ranking must be one of 'shared', 'screen'"),
        (dict(n_heads=0), "n_heads must be at least 1"),
        (dict(profile="paper", kv_pairs=16), "kv_pairs sets the cheap ranking's prompts"),
        (dict(kv_pairs=0), r"kv_pairs must be at least 1, got 0 \(None: the shared ranking's\)"),
        (dict(kv_pairs=500), "a KV dictionary for qwen2.5-coder-1.5b-instruct holds at most"),
    ],
)
def test_bad_parameters_fail_before_any_model_loads(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        chapter.Config.for_profile(**{"profile": "cpu", **kwargs})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tasks=["gsm8kk"]), "lm-eval knows no task 'gsm8kk'.*close names: gsm8k"),
        (dict(tasks=["bbh"], bbh_subtasks=28), "bbh_subtasks must be at most the 27 subtasks"),
    ],
)
def test_unknown_tasks_fail_before_the_model_loads(monkeypatch, kwargs, message):
    monkeypatch.setattr(
        loading, "load", lambda name: pytest.fail("the model loaded before the tasks were checked")
    )
    with pytest.raises(ConfigError, match=message):
        chapter.run(chapter.Config.for_profile("cpu", smoke=True, **kwargs))


def test_a_chat_task_on_a_model_without_a_chat_template_is_refused_before_any_head_is_ranked(
    monkeypatch,
):
    from types import SimpleNamespace

    assert (
        chapter.chat("arc_challenge_chat")
        and chapter.chat("choice_chat")
        and not chapter.chat("gsm8k")
    )
    plain = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=None))
    monkeypatch.setattr(loading, "load", lambda name: plain)
    monkeypatch.setattr(
        chapter, "top_heads", lambda *a: pytest.fail("ranked heads for a task it cannot run")
    )
    cfg = chapter.Config.for_profile("cpu", smoke=True, tasks=["page_field", "choice_chat"])
    with pytest.raises(
        ConfigError, match="choice_chat run in the model's chat template, but .* has none"
    ):
        chapter.run(cfg)
