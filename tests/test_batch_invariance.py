"""In the dtype the CPU chapters compute in (`models.cpu_dtype`: bfloat16 where the CPU has it
natively, else float32), an item's log-likelihoods must not depend on the items it is scored with
(`packing.batches`); in bfloat16 (the paper's models', and the CPU's where native) they must be as
close to float32 as lm-eval's own bfloat16 scores are (lm-eval runs one request per forward pass,
the shape no batching can keep)."""

import numpy as np
import pytest
import torch

import helpers
from helpers import evaluate, hooks, models, packing, registry, stats, tasks
from helpers.engine import SweepEngine
from helpers.specs import Spec

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def smol_native():
    """SmolLM2 as the book loads it, in the CPU's dtype."""
    loaded = helpers.load(registry.cast("cpu", "retrieval"))
    assert loaded.model.dtype == models.cpu_dtype()
    return loaded


@pytest.fixture(scope="module")
def smol_bf16():
    return helpers.load(registry.cast("cpu", "retrieval"), dtype=torch.bfloat16)


def mixed_prompts() -> list[helpers.Item]:
    """KV prompts of three sizes, so that rows of several widths share the set."""
    return (
        helpers.kv_items(8, 3, seed=3)
        + helpers.kv_items(2, 3, seed=3)
        + helpers.kv_items(5, 3, seed=3)
    )


def scorer(loaded, ablation=None):
    def run(items, batch_tokens=None):
        with Spec.parse(ablation).applied(loaded), torch.inference_mode():
            return helpers.choice_loglikelihoods(
                loaded.model, loaded.tokenizer, items, batch_tokens=batch_tokens
            )

    return run


def engine(loaded, ablation=None):
    def run(items, batch_tokens=None):
        flat = SweepEngine(
            loaded, loaded.tokenizer, items, batch_tokens=batch_tokens
        ).loglikelihoods([Spec.parse(ablation)])[0]
        bounds = np.cumsum([0] + [len(it.pairs) for it in items])
        return [flat[a:z] for a, z in zip(bounds[:-1], bounds[1:])]

    return run


@pytest.mark.parametrize("path", [scorer, engine])
@pytest.mark.parametrize("ablation", [None, "zero L16H0,L16H3"])
def test_an_items_scores_do_not_depend_on_the_items_beside_it(smol_native, path, ablation):
    items = mixed_prompts()
    budget = packing.default_batch_tokens(torch.device("cpu"))
    _, laid_out = packing.batches(packing.pack(items, smol_native.tokenizer, False), budget)
    # several batches, of several rows each: an item has neighbours, and they change below
    assert len(laid_out) > 1 and max(len(b.rows) for b in laid_out) > 1
    run = path(smol_native, ablation)
    together = run(items)
    reversed_ = run(items[::-1])[::-1]
    every_third = run(items[::3])
    for i, item in enumerate(items):
        np.testing.assert_array_equal(reversed_[i], together[i])
        if i % 3 == 0:
            np.testing.assert_array_equal(every_third[i // 3], together[i])
    for i in (0, 4, 8):  # one of each size
        np.testing.assert_array_equal(run([items[i]])[0], together[i])
    # The check can fail: rows that leaked into each other (planted here, the batch's rows mixed
    # after the first layer) are seen. Whether another batch shape rounds an item otherwise is the
    # CPU's business, not a control: an AMD EPYC's kernels gave bit-equal rows at every batch
    # budget, where an earlier machine's bfloat16 ones differed by more than 1e-3.
    leak = {(hooks.LAYER_OUT, 0): lambda x: x + 0.05 * x.mean(dim=0, keepdim=True)}
    with hooks.hooked(smol_native, leak):
        leaked, leaked_third = run(items), run(items[::3])
    assert max(np.abs(a - b).max() for a, b in zip(leaked_third, leaked[::3])) > 1e-3


def lm_eval_loglikelihoods(loaded, items) -> np.ndarray:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=1)
    requests = [
        Instance("loglikelihood", {}, pair, i)
        for i, pair in enumerate(p for it in items for p in it.pairs)
    ]
    return np.array([ll for ll, _ in lm.loglikelihood(requests, disable_tqdm=True)])


def ours(loaded, items) -> dict[str, np.ndarray]:
    with torch.inference_mode():
        plain = np.concatenate(helpers.choice_loglikelihoods(loaded.model, loaded.tokenizer, items))
    return {
        "scorer": plain,
        "engine": SweepEngine(loaded, loaded.tokenizer, items).loglikelihoods([Spec()])[0],
    }


# Where the CPU emulates bfloat16 (AVX2) the chapters compute in float32, where the scorers agree
# with lm-eval to 1e-4 (`test_evaluate`), and these comparisons would take most of an hour.
native_bfloat16 = pytest.mark.skipif(
    models.cpu_dtype() != torch.bfloat16,
    reason="bfloat16 is emulated on this CPU: its chapters compute in float32",
)


@native_bfloat16
def test_bfloat16_kv_scores_are_as_close_to_float32_as_lm_evals_own(smol, smol_bf16):
    """Measured on 100 prompts of 8 keys (seed 1), mean |bf16 - float32| over every choice:
    scorer 0.153, engine 0.151, lm-eval (one request per pass) 0.156 nats; largest 1.27, 1.14,
    1.16. SmolLM2's bfloat16 is that coarse whatever the shape: the bound is lm-eval's own."""
    items = helpers.kv_items(8, 24, seed=1)
    with torch.inference_mode():
        # float32
        exact = np.concatenate(helpers.choice_loglikelihoods(smol.model, smol.tokenizer, items))
    theirs = np.abs(lm_eval_loglikelihoods(smol_bf16, items) - exact)
    for name, got in ours(smol_bf16, items).items():
        error = np.abs(got - exact)
        assert error.mean() <= 1.25 * theirs.mean(), (name, error.mean(), theirs.mean())
        assert error.max() <= 1.5 * theirs.max(), (name, error.max(), theirs.max())
        # What the pages' near-tie counts rest on: bfloat16 moves an item's margin (gold minus
        # the best other choice) by less than BFLOAT16_MARGIN on 95% of items.
        moved = np.abs(margins(got, items) - margins(exact, items))
        assert np.quantile(moved, 0.95) < stats.BFLOAT16_MARGIN, (name, np.quantile(moved, 0.95))


def margins(flat: np.ndarray, items) -> np.ndarray:
    bounds = np.cumsum([0] + [len(it.pairs) for it in items])
    return evaluate.from_loglikelihoods(
        [flat[a:z] for a, z in zip(bounds[:-1], bounds[1:])], items
    ).margin


@native_bfloat16
def test_bfloat16_letter_scores_agree_with_lm_eval_within_the_measured_bound():
    """Qwen2.5-Coder-1.5B on the book's letter questions, both in bfloat16: measured on 100
    questions (seed 1), |ours - lm-eval| at most 0.19 nats (mean 0.033), no pick differs; float32
    against float32 they are equal to 1e-4 (`test_evaluate`)."""
    loaded = helpers.load(registry.cast("cpu", "letters"), dtype=torch.bfloat16)
    items = tasks.load_letters(n=16, seed=1)[0]
    theirs = lm_eval_loglikelihoods(loaded, items)
    bounds = np.cumsum([0] + [len(it.pairs) for it in items])
    picks = lambda flat: [int(np.argmax(flat[a:z])) for a, z in zip(bounds[:-1], bounds[1:])]
    for name, got in ours(loaded, items).items():
        assert np.abs(got - theirs).max() <= 0.25, name
        assert picks(got) == picks(theirs), name
