"""Intervention specs: the text form and the JSON record read back to the same spec, bad text
names the fix, and a spec checks itself against a model before anything runs."""

import json

import pytest
import torch

import helpers
from helpers.errors import ConfigError, InterventionError
from helpers.heads import Head
from helpers.specs import Spec, layers_text


@pytest.mark.parametrize(
    "text, spec",
    [
        ("none", Spec()),
        ("zero L16H0", Spec(zero=[Head(16, 0)])),
        ("zero L3H2,L16H0; keep 0..17; remove 5", Spec.of("L16H0,L3H2", "0..17", "5")),
        ("mean L2H1", Spec(mean={2: [1]})),
        ("resample L2H1,L2H3", Spec(resample=[(2, 1), (2, 3)])),
        ("patch L0H0; zero L1H1", Spec(patch=[(0, 0)], zero=[(1, 1)])),
        ("keep 0..3,8", Spec(keep_layers=[0, 1, 2, 3, 8])),
        ("remove 0,2", Spec(remove_layers=(0, 2))),
    ],
)
def test_a_spec_reads_back_from_its_text_and_its_record(text, spec):
    assert Spec.parse(text) == spec
    assert Spec.parse(str(spec)) == spec
    record = json.loads(json.dumps(spec.record()))  # as a store or provenance holds it
    assert Spec.from_record(record) == spec == Spec.parse(record)
    assert record["text"] == str(spec)
    assert hash(Spec.parse(text)) == hash(spec)  # a dict key, a cell's condition


def test_the_text_form_is_stable_whatever_order_the_heads_are_given_in():
    assert str(Spec(zero=["L16H0", "L3H2", "L3H1"])) == "zero L3H1,L3H2,L16H0"
    assert str(Spec.parse("keep 0..17;  zero L16H0")) == "zero L16H0; keep 0..17"
    assert layers_text([0, 1, 2, 5, 7, 8]) == "0..2,5,7..8"


@pytest.mark.parametrize(
    "text, says",
    [
        ("zero L16", "write it as 'L16H22'"),
        ("zero L1H1,L1H1", "more than once"),
        ("zero L1H1; mean L1H1", "removed two ways"),
        ("zeros L1H1", "each part is one of zero, mean, resample, patch, keep, remove"),
        ("keep 0-3", "write them as 0..17"),
        ("keep 0..3; keep 1", "says 'keep' twice"),
    ],
)
def test_bad_text_names_the_fix(text, says):
    with pytest.raises(ConfigError, match=says):
        Spec.parse(text)


def test_a_layer_dict_is_not_taken_for_a_spec():
    with pytest.raises(ConfigError, match=r"not \{layer: \[heads\]\}.*Spec\(zero="):
        Spec.parse({16: [0]})
    assert Spec(zero={16: [0]}) == Spec.parse("zero L16H0")


def test_layers_run_and_the_checks_against_a_model():
    from test_validation import tiny_llama

    model = tiny_llama(layers=4)
    assert Spec.parse("keep 0..3; remove 1").check(model) == [0, 2, 3]
    assert Spec.parse("remove 1").check(model) == [0, 2, 3]
    assert Spec().check(model) == [0, 1, 2, 3]
    for text, says in [
        ("zero L1H9", r"head \[9\] out of range"),
        ("remove 4", "layers 0..3"),
        ("zero L3H0; keep 0..2", "layers do not run"),
        ("keep 0..2; remove 3", "not among the kept layers"),
        ("keep 2,0", "increasing order"),
    ]:
        with pytest.raises(InterventionError, match=says):
            Spec.parse(text).check(model)
    with pytest.raises(InterventionError, match="measured by the sweep engine"):
        with Spec.parse("mean L1H0").applied(model):
            pass


@torch.inference_mode()
def test_applying_a_spec_changes_the_model_inside_the_block_and_restores_it_exactly():
    from test_validation import tiny_llama

    model = tiny_llama(layers=4)
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    before = model(ids).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    spec = Spec.parse("zero L0H0,L2H1; keep 0..2; remove 1")
    with spec.applied(model):
        inside = model(ids).logits
        assert len(helpers.adapter_for(model).layers) == 2
    with helpers.zero_heads(model, {0: [0], 2: [1]}), helpers.keep_layers(model, [0, 2]):
        assert torch.equal(model(ids).logits, inside)  # the primitives it enters
    assert not torch.allclose(inside, before)
    assert torch.equal(model(ids).logits, before)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
