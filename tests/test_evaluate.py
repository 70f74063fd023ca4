import numpy as np
import pytest
import torch

import helpers
from helpers.packing import encode_pair
from helpers.stats import mean_of, wilson

PAIRS = [
    ("The capital of France is", " Paris"),
    ("The capital of France is", " a city in Europe"),
    ("Memorize the following dictionary:\nriver:42\nlamp:7\nriver:", "42"),
    # trailing space moves to the continuation
    (
        "Question: What is frozen water called?\nAnswer: ",
        "ice",
    ),
]


def direct(model, tok, ctx, cont):
    """One unbatched forward pass of context+continuation; sum the continuation's log-probs."""
    c, t = encode_pair(tok, ctx, cont)
    logits = model(torch.tensor([c + t])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return sum(logp[len(c) - 1 + i, tok_id].item() for i, tok_id in enumerate(t))


def loglikelihoods(smol, pairs, **kw):
    """The scorer's log-likelihood of each (context, continuation) pair, one item per pair."""
    items = [helpers.Item((pair,), 0) for pair in pairs]
    return np.concatenate(helpers.choice_loglikelihoods(smol.model, smol.tokenizer, items, **kw))


@torch.inference_mode()
def test_loglikelihoods_equal_direct_computation(smol):
    got = loglikelihoods(smol, PAIRS, batch_tokens=64)
    want = [direct(smol.model, smol.tokenizer, c, x) for c, x in PAIRS]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_loglikelihoods_equal_lm_evals(smol):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=smol.model, tokenizer=smol.tokenizer, batch_size=4)
    reqs = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(PAIRS)]
    want = [ll for ll, _ in lm.loglikelihood(reqs, disable_tqdm=True)]
    got = loglikelihoods(smol, PAIRS)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_trailing_space_is_moved_unless_verbatim(smol):
    tok = smol.tokenizer
    assert encode_pair(tok, "Answer: ", "ice") == encode_pair(tok, "Answer:", " ice")
    assert encode_pair(tok, "Answer: ", "ice", verbatim=True) != encode_pair(tok, "Answer:", " ice")


def test_smollm2_adds_no_bos(smol):
    # lm-eval adds a BOS only when the tokenizer does; SmolLM2's GGUF tokenizer does not.
    assert smol.tokenizer.encode("hello")[0] != smol.tokenizer.bos_token_id


def test_score_reports_interval(smol):
    items = helpers.load_knowledge("cpu", n=6)[helpers.tasks.CPU_KNOWLEDGE]
    s = helpers.score(smol.model, smol.tokenizer, items)
    assert s.n == 6 and s.lo <= s.acc <= s.hi and s.correct.shape == (6,)


def test_wilson_known_answers():
    lo, hi = wilson(0, 10)
    assert lo == 0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))


def test_mean_of_tasks_known_answer():
    m, lo, hi = mean_of([0.5, 1.0], [100, 100])
    # Each variance at (k + 2) / (n + 4): the task at 100% is not exact.
    variance = 0.5 * 0.5 / 104 + (102 / 104) * (2 / 104) / 104
    assert m == 0.75 and hi - m == pytest.approx(1.96 * variance**0.5 / 2, rel=1e-3)
    # one task: its own Wilson interval, not [100%, 100%]
    assert mean_of([1.0], [4]) == (
        1.0,
        *wilson(4, 4),
    )


def test_mean_over_tasks_is_the_unweighted_mean_per_group():
    import pandas as pd

    table = pd.DataFrame(
        [dict(layer=3, acc=0.5, n=100), dict(layer=3, acc=1.0, n=50), dict(layer=4, acc=0.2, n=10)]
    )
    rows = helpers.mean_over_tasks(table, by="layer").set_index("layer")
    assert rows.acc[3] == 0.75 and rows.n[3] == 150 and rows.acc[4] == 0.2
    assert (rows.lo[3], rows.hi[3]) == pytest.approx(mean_of([0.5, 1.0], [100, 50])[1:])
