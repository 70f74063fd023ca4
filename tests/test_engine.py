"""The sweep engine gives what the plain scorer gives under the same spec, on every path: shared
rows (attention), flat rows (recurrent), specs side by side, any layer."""

import numpy as np
import pytest
import torch
from fakes import Tokenizer

import helpers
from helpers import screen
from helpers.adapters import unwrap
from helpers.engine import SweepEngine
from helpers.packing import pack, site_block
from helpers.specs import Spec


class CharTokenizer(Tokenizer):
    """A character-level tokenizer for the tiny random models' vocabularies."""

    def encode(self, s):
        return [3 + ord(c) % 40 for c in s]


@pytest.fixture(scope="module")
def kv(smol):
    # multi-token continuations (" 42")
    return helpers.kv_items(5, 6, seed=2, query="paper", form="spaced")


def plain(model, items, spec, tokenizer=None):
    """The plain scorer's log-likelihoods under `spec` (a Spec or its text)."""
    bare, _ = unwrap(model)
    with Spec.parse(spec).applied(model):
        tokenizer = tokenizer or model.tokenizer
        return np.concatenate(helpers.choice_loglikelihoods(bare, tokenizer, items))


@pytest.mark.parametrize("shared_rows", [True, False])
def test_engine_equals_scorer_under_zeroed_heads(smol, kv, shared_rows):
    engine = SweepEngine(smol, smol.tokenizer, kv, batch_tokens=300, shared_rows=shared_rows)
    specs = ["none", "zero L16H0", "zero L3H1,L3H2,L20H5", Spec(zero=[(29, 8)])]
    got = engine.loglikelihoods(specs)
    for spec, row in zip(specs, got):
        np.testing.assert_allclose(row, plain(smol, kv, spec), rtol=0, atol=2e-4)
    s = engine.score("zero L16H0")
    ref = helpers.score(smol.model, smol.tokenizer, kv, spec="zero L16H0")
    assert (s.acc, s.n) == (ref.acc, ref.n) and np.array_equal(s.correct, ref.correct)


def test_shared_rows_hold_all_choices_of_a_question(smol, kv):
    shared, flat = pack(kv, smol.tokenizer, True), pack(kv, smol.tokenizer, False)
    assert len(shared.ids) == len(kv) and len(flat.ids) > len(kv)
    assert shared.ids.numel() < flat.ids.numel() / 2
    assert len(shared.target) == len(flat.target)


def test_head_sweep_matches_single_ablations(smol, kv):
    engine = SweepEngine(smol, smol.tokenizer, kv)
    sweep = engine.head_sweep(layers=[16], progress=False)
    assert len(sweep) == 9
    for h in (0, 5, 8):
        single = engine.score(Spec(zero=[(16, h)]))
        assert sweep[16, h].acc == single.acc and np.array_equal(
            sweep[16, h].correct, single.correct
        )


@torch.inference_mode()
def test_engine_on_a_recurrent_model():
    from test_attention import tiny_mamba2

    model = tiny_mamba2()

    items = [
        helpers.Item((("ab:1 cd:2 ab:", "1"), ("ab:1 cd:2 ab:", "2x")), 0),
        helpers.Item((("xy", " z"), ("xyw", " z")), 1),
    ]
    engine = SweepEngine(model, CharTokenizer(), items, batch_tokens=64)
    assert engine.rows.allowed is None  # recurrent models read rows in order: no shared rows
    with pytest.raises(helpers.InterventionError, match="cannot share rows"):
        SweepEngine(model, CharTokenizer(), items, shared_rows=True)
    for spec in ("none", "zero L1H2"):
        ref = plain(model, items, spec, CharTokenizer())
        np.testing.assert_allclose(engine.loglikelihoods([spec])[0], ref, rtol=0, atol=1e-5)


@torch.inference_mode()
def test_engine_packs_gemma3_rows_under_both_kinds_of_attention():
    # Shared rows put a choice's tokens at its own positions behind the context: a sliding layer's
    # window must count those positions, not the row's columns.
    from test_adapters import tiny_gemma3

    model = tiny_gemma3()
    items = [
        helpers.Item((("ab:1 cd:2 ef:3 ab:", "1"), ("ab:1 cd:2 ef:3 ab:", "2x")), 0),
        helpers.Item((("gh:4 ij:5 gh:", " 4"), ("gh:4 ij:5 gh:", " 5"), ("gh:4 ij:5 gh:", "6")), 1),
    ]
    engine = SweepEngine(model, CharTokenizer(), items, batch_tokens=64, shared_rows=True)
    assert engine.rows.allowed is not None  # choices share their context's row
    specs = ["none", "zero L0H1", "zero L1H0,L1H3"]
    rows = engine.loglikelihoods(specs)
    for spec, row in zip(specs, rows):
        np.testing.assert_allclose(
            row, plain(model, items, spec, CharTokenizer()), rtol=0, atol=1e-5
        )
    assert not np.allclose(rows[0], rows[1]) and not np.allclose(rows[0], rows[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("view", ["attention", "mamba"])
@torch.inference_mode()
def test_engine_drives_zamba2_hybrid_layers(view, dtype):
    # A hybrid layer reads the token embeddings beside the stream (it raised a raw TypeError).
    from test_adapters import tiny_zamba2

    model = tiny_zamba2()
    adapter = helpers.adapter_for(model)
    for layer in adapter.hybrid_layers:  # heads that move the scores more than bfloat16's rounding
        adapter.head_site(layer).weight.normal_(0, 0.5)
        adapter.block(layer).linear.weight.normal_(0, 0.5)
    model.to(dtype)
    adapter = adapter if view == "attention" else adapter.mamba_heads()
    items = [
        helpers.Item((("ab:1 cd:2 ab:", "1"), ("ab:1 cd:2 ab:", "2x")), 0),
        helpers.Item((("xy", " z"), ("xyw", " z")), 1),
    ]
    engine = SweepEngine(adapter, CharTokenizer(), items, batch_tokens=64)
    rows = engine.loglikelihoods(["none", "zero L3H0,L3H2"])
    for spec, row in zip(["none", "zero L3H0,L3H2"], rows):
        with Spec.parse(spec).applied(adapter):
            ref = np.concatenate(helpers.choice_loglikelihoods(model, CharTokenizer(), items))
        np.testing.assert_allclose(row, ref, rtol=0, atol=1e-5)
    assert not np.allclose(rows[0], rows[1])  # the ablation reached the hybrid layer
    hidden = torch.randn(1, 5, 32, dtype=dtype)
    # a Mamba layer runs alone
    assert adapter.run_layer(adapter.block(2), hidden).shape == hidden.shape
    with pytest.raises(helpers.InterventionError, match="hybrid layer reads the token embeddings"):
        adapter.run_layer(adapter.block(3), hidden)


@torch.inference_mode()
def test_both_scorers_read_a_float32_residual_through_a_bfloat16_head():
    # Falcon-Mamba's `residual_in_fp32`: in bfloat16 its backbone returns float32 hidden states.
    from test_attention import tiny_mamba1

    model = tiny_mamba1("falcon_mamba").to(torch.bfloat16)
    assert model.config.residual_in_fp32
    items = [
        helpers.Item((("ab:1 cd:2 ab:", "1"), ("ab:1 cd:2 ab:", "2x")), 0),
        helpers.Item((("xy", " z"), ("xyw", " z")), 1),
    ]
    ref = np.concatenate(helpers.choice_loglikelihoods(model, CharTokenizer(), items))
    got = SweepEngine(model, CharTokenizer(), items, batch_tokens=64).loglikelihoods(["none"])[0]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_attribution_is_the_derivative_of_the_margin(smol, kv, alpha):
    """attribution[l, h] = -d(mean gold margin)/d(scale of head h's output), taken with every
    head of layer l scaled by alpha: compare with a finite difference through the plain scorer.
    alpha < 1 costs a forward and backward pass per layer: there the model is cut to 17 layers."""
    engine = SweepEngine(smol, smol.tokenizer, kv)
    within = Spec() if alpha == 1 else Spec(keep_layers=range(17))
    attribution = screen.attribution(engine, within, alpha=alpha, progress=False)
    assert len(attribution) == (30 if alpha == 1 else 17) * 9
    assert not any(smol.adapter.head_site(l)._forward_pre_hooks for l in range(30))

    def margin(layer, head, scale):
        dim = smol.adapter.head_dim(layer)

        def hook(module, args):
            x = args[0] * alpha
            x[..., head * dim : (head + 1) * dim] *= scale / alpha
            return (x,)

        handle = smol.adapter.head_site(layer).register_forward_pre_hook(hook)
        try:
            with within.applied(smol):
                flat = np.concatenate(helpers.choice_loglikelihoods(smol.model, smol.tokenizer, kv))
        finally:
            handle.remove()
        return engine.margins(flat).mean().item()

    eps = 1e-2
    for layer, head in [(16, 0), (5, 3)]:
        finite = (margin(layer, head, alpha - eps) - margin(layer, head, alpha + eps)) / (2 * eps)
        assert attribution[layer, head] == pytest.approx(finite, rel=0.05, abs=1e-4)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_the_checkpointed_screen_gives_the_same_numbers(smol, alpha, monkeypatch):
    """The CPU screen recomputes each layer's activations in the backward pass instead of keeping
    them (a row of MMLU questions behind a shared prefix is up to 2,048 tokens): the estimates
    are the same to the bit, with several questions per row and several rows and batches."""
    from helpers import benchmarks as bm

    items = bm.letter_mcq("smollm2-135m-instruct", smol.tokenizer, "cpu", 6, seed=3).items
    engine = SweepEngine(smol, smol.tokenizer, items, batch_tokens=200)
    # rows hold several questions
    assert len(engine.batches) > 1 and len(set(engine.rows.row.tolist())) < len(items)
    layers = Spec(keep_layers=range(3))  # a pruned model: that path too, and quick
    kept = screen.attribution(engine, layers, alpha=alpha, progress=False, checkpoint=False)
    recomputed = screen.attribution(engine, layers, alpha=alpha, progress=False, checkpoint=True)
    assert kept == recomputed and any(v != 0 for v in kept.values())
    # By default only a batch whose graph would exceed the budget is recomputed.
    sizes = [b.width * len(b.rows) for b in engine.batches]
    monkeypatch.setattr(
        screen, "GRAPH_BYTES", min(sizes) * screen.graph_bytes_per_token(smol.model)
    )
    decided = [screen.needs_checkpoint(engine, b) for b in engine.batches]
    assert decided == [n > min(sizes) for n in sizes] and True in decided and False in decided
    assert screen.attribution(engine, layers, alpha=alpha, progress=False) == kept
    assert not any(smol.adapter.head_site(l)._forward_pre_hooks for l in range(30))


def test_kept_and_removed_layers_equal_the_plain_scorer_under_the_spec(smol, kv):
    engine = SweepEngine(smol, smol.tokenizer, kv)
    minimal = Spec(keep_layers=range(22))
    with helpers.keep_layers(smol, range(22)):  # the primitive the spec enters
        ref = np.concatenate(helpers.choice_loglikelihoods(smol.model, smol.tokenizer, kv))
    np.testing.assert_allclose(engine.loglikelihoods([minimal])[0], ref, rtol=0, atol=2e-4)
    removed = engine.layer_sweep([5, 17], within=minimal, progress=False)
    ref = helpers.score(smol.model, smol.tokenizer, kv, spec="keep 0..21; remove 17")
    assert np.array_equal(removed[17].correct, ref.correct)
    # specs that run different layers in one call: each as alone
    specs = [minimal.zeroing(helpers.Head(16, 0)), "remove 3", "zero L16H0; keep 0..21; remove 17"]
    for spec, row in zip(specs, engine.loglikelihoods(specs)):
        np.testing.assert_allclose(row, plain(smol, kv, spec), rtol=0, atol=2e-4)
    with pytest.raises(helpers.InterventionError, match="do not run"):
        engine.loglikelihoods(["zero L25H0; keep 0..21"])


def test_score_by_depth_equals_the_pruned_model(smol, kv):
    engine = SweepEngine(smol, smol.tokenizer, kv)
    depths = [4, 17, 30]
    ours = engine.score_by_depth(depths)
    for d in depths:
        with helpers.prune_top(smol, d):
            ref = helpers.score(smol.model, smol.tokenizer, kv)
        assert np.array_equal(ours[d].correct, ref.correct)


def test_few_shot_questions_share_their_prefix_exactly(smol):
    items = helpers.load_mmlu("cpu", k=5, n=12, seed=0)  # several questions per subject
    rows = pack(items, smol.tokenizer, True, max_row_tokens=900)
    assert len(rows.ids) < len(items)  # questions of a subject share a row behind one 5-shot prefix
    # A budget of about one row a pass: a larger one fills each pass with rows of pad tokens
    # (`packing.batches`), 6x the tokens here.
    engine = SweepEngine(smol, smol.tokenizer, items, batch_tokens=320)
    for spec in ("none", "zero L16H0"):
        np.testing.assert_allclose(
            engine.loglikelihoods([spec])[0], plain(smol, items, spec), rtol=0, atol=2e-4
        )


def test_score_each_walks_the_residual_stream_upwards_whatever_the_order_given(smol, kv):
    # The clean model, then a head of L20, then one of L18: in that order the cached stream above
    # L20 serves neither L20 nor L18, and each would rerun the model from the embedding.
    ablations = {"none": Spec(), "L20H1": Spec.parse("zero L20H1"), "L18H6": "zero L18H6"}
    engine = SweepEngine(smol, smol.tokenizer, kv, batch_tokens=256)
    runs = []
    real = engine.adapter.run_layer
    engine.adapter.run_layer = lambda block, *a, **k: runs.append(block) or real(block, *a, **k)
    try:
        each = engine.score_each(ablations)
    finally:
        del engine.adapter.run_layer
    n = smol.adapter.n_layers
    # the stream to L18 once, then L18.. (with its head zeroed), L20.. and the clean L18.. on top
    assert len(runs) == len(engine.batches) * (18 + (n - 18) + (n - 20) + 2 + (n - 20))
    assert list(each) == list(ablations)  # in the order given
    for name, spec in ablations.items():
        ref = helpers.score(smol.model, smol.tokenizer, kv, spec=spec)
        assert np.array_equal(each[name].correct, ref.correct), name


def test_score_each_scores_ablations_as_the_model_scores_them_one_at_a_time(smol, kv):
    engine = SweepEngine(smol, smol.tokenizer, kv, batch_tokens=2048)
    # room for several copies in every batch, so that ablations of different layers share passes
    assert min(engine.fits(i) for i in range(len(engine.batches))) > 1
    ablations = {
        "none": "none",
        "L16H0 and L18H6": "zero L16H0,L18H6",
        **{f"L16H{h}": f"zero L16H{h}" for h in range(1, 5)},
        **{f"L{l}H2": f"zero L{l}H2" for l in (3, 17, 27)},
        "L16H1 in 0..19": "zero L16H1; keep 0..19",  # another layer list in the same call
    }
    each = engine.score_each(ablations)
    for name, spec in ablations.items():
        ref = helpers.score(smol.model, smol.tokenizer, kv, spec=spec)
        assert np.array_equal(each[name].correct, ref.correct), name
        np.testing.assert_allclose(each[name].margin, ref.margin, rtol=0, atol=2e-4, err_msg=name)


def test_a_pass_builds_its_mask_and_rotary_embeddings_once_and_scores_as_if_per_layer(
    smol, kv, monkeypatch
):
    from helpers import adapters

    engine = SweepEngine(smol, smol.tokenizer, kv, batch_tokens=300)
    ablations = ["none", "zero L3H1", "zero L20H5"]
    built = []
    real = adapters.positions_and_mask
    monkeypatch.setattr(adapters, "positions_and_mask", lambda *a: built.append(1) or real(*a))
    once = engine.loglikelihoods(ablations)
    # one build per pass: the residual up to layer 3 and every copy's pass from there, per batch
    passes = len(built)
    assert 0 < passes <= 4 * len(engine.batches) < smol.adapter.n_layers
    # the same numbers as building them in every layer (the adapter's inputs, recomputed each call)
    monkeypatch.setattr(
        adapters.LlamaAdapter,
        "pass_inputs",
        lambda self, h, p, a: (
            lambda full, mask: (full, mask, self.model.base_model.rotary_emb(h, position_ids=full))
        )(*real(h, p, a)),
    )
    engine._residuals.clear()
    np.testing.assert_array_equal(engine.loglikelihoods(ablations), once)


def test_the_head_reads_a_batchs_sites_in_blocks_of_the_budgets_size(smol, kv):
    """A batch's scored positions go through the vocabulary projection in blocks whose size the
    budget sets (`packing.site_block`: about a site per 8 tokens), the last block filled with
    zeros: small blocks, several a batch, give the log-likelihoods one block does."""
    assert [site_block(b) for b in (1, 128, 256, 300, 512, 65536)] == [16, 16, 32, 64, 64, 64]
    engine = SweepEngine(smol, smol.tokenizer, kv, batch_tokens=256)
    assert {b.block for b in engine.batches} == {32}
    whole = engine.loglikelihoods(["none", "zero L16H0"])
    assert max(len(b.sites) for b in engine.batches) > 4  # so that a block of 4 splits a batch
    for b in engine.batches:
        b.block = 4
    np.testing.assert_allclose(
        engine.loglikelihoods(["none", "zero L16H0"]), whole, rtol=0, atol=1e-5
    )
