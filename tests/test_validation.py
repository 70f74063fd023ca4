"""Every public entry point checks its arguments before any work and raises one error type per
kind of mistake, naming what is valid: `InterventionError` for interventions and adapters,
`ConfigError` for task loaders and model configurations. Numpy and torch integers are integers;
booleans are not. Empty interventions are exact no-ops. Each case here was found on a version
that failed it (a tensor-size error deep in a forward pass, a silent reordering, ...)."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM

import helpers
from helpers import ConfigError, InterventionError, tasks
from helpers.attention import attention_maps, mask_attention, mask_last_row
from helpers.llamba import LlambaConfig
from test_adapters import tiny_pair, tiny_zamba2
from test_attention import tiny_mamba2


def tiny_llama(layers=4, dtype=torch.float32):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=60, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(config).to(dtype).eval()


@torch.inference_mode()
def logits(model, ids):
    return model(ids).logits


IDS = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))


# --- adapters ---------------------------------------------------------------------------------------

def test_a_channel_group_must_divide_the_channels_at_construction():
    torch.manual_seed(0)
    model = MambaForCausalLM(MambaConfig(vocab_size=50, hidden_size=19, num_hidden_layers=2, state_size=4,
                                         expand=2, use_mambapy=False)).eval()  # 38 channels per layer
    with pytest.raises(InterventionError, match=r"group=4.*divide.*38 channels.*\[1, 2, 19, 38\]"):
        helpers.adapters.MambaAdapter(model, group=4)
    with pytest.raises(InterventionError, match="group=0"):
        helpers.adapters.MambaAdapter(model, group=0)
    adapter = helpers.adapters.MambaAdapter(model, group=np.int64(2))
    assert adapter.group == 2 and adapter.n_heads(0) == 19
    plain = logits(model, IDS)
    with helpers.zero_heads(adapter, {1: [18]}):  # the last group: channels 36 and 37
        assert not torch.equal(logits(model, IDS), plain)
    assert torch.equal(logits(model, IDS), plain)


def test_numpy_and_torch_integers_are_indices_and_booleans_are_not():
    adapter = helpers.adapter_for(tiny_llama())
    assert adapter.check_layer(np.int64(2)) == 2 and type(adapter.check_layer(torch.tensor(2))) is int
    assert adapter.check_heads(np.int32(1), [np.int64(3), torch.tensor(0)]) == [3, 0]
    assert adapter.check_heads(1, np.int64(3)) == [3]
    for bad in (True, 2.0, "2", None, torch.tensor([2])):
        with pytest.raises(InterventionError, match="layers 0..3"):
            adapter.check_layer(bad)
    with pytest.raises(InterventionError, match=r"\[True\] not valid.*heads 0..3"):
        adapter.check_heads(1, [True])
    with pytest.raises(InterventionError, match=r"\[4\] out of range.*heads 0..3"):
        adapter.check_heads(1, [4])
    with pytest.raises(InterventionError, match=r"head\(s\) \[2\] of layer 1 listed more than once"):
        adapter.check_heads(1, [2, 0, 2])


def test_something_that_is_not_a_model_is_named():
    with pytest.raises(InterventionError, match="got str"):
        helpers.zero_heads("smollm2-135m-instruct", {0: [0]})


# --- zero_heads ---------------------------------------------------------------------------------------

def test_zero_heads_takes_a_numpy_head_and_rejects_booleans_and_none_by_name():
    model = tiny_llama()
    with helpers.zero_heads(model, {2: [1]}):
        python = logits(model, IDS)
    with helpers.zero_heads(model, {np.int64(2): [np.int64(1)]}):
        assert torch.equal(logits(model, IDS), python)
    for heads, says in [([True], r"\[True\] not valid"), (None, "got None"), (2.5, "list of them, got 2.5"),
                        ({0: 1}, "a head index or a list")]:
        with pytest.raises(InterventionError, match=says):
            helpers.zero_heads(model, {2: heads})  # at the call, before any `with`
    with pytest.raises(InterventionError, match=r"\{layer: \[head, ...\]\}"):
        helpers.zero_heads(model, [2, 1])


def test_empty_head_lists_are_exact_no_ops_but_their_layer_is_still_checked():
    model = tiny_llama()
    plain = logits(model, IDS)
    for empty in ({}, {1: []}, {1: ()}, {1: np.array([], dtype=int)}, {1: range(0)}):
        with helpers.zero_heads(model, empty):
            assert torch.equal(logits(model, IDS), plain)
    with pytest.raises(InterventionError, match="layers 0..3"):
        helpers.zero_heads(model, {9: []})


# --- layer lists --------------------------------------------------------------------------------------

def test_keep_layers_rejects_repeats_and_disorder_instead_of_sorting_them():
    model = tiny_llama()
    with pytest.raises(InterventionError, match=r"\[3\] listed more than once"):
        helpers.keep_layers(model, [3, 1, 3])
    with pytest.raises(InterventionError, match=r"increasing order.*got \[3, 1\], write \[1, 3\]"):
        helpers.keep_layers(model, [3, 1])
    with pytest.raises(InterventionError, match=r"a list of layer indices, got 2 \(for one layer write \[2\]\)"):
        helpers.keep_layers(model, 2)
    with pytest.raises(InterventionError, match="at least one layer"):
        helpers.keep_layers(model, [])
    with helpers.keep_layers(model, np.array([1, 3])):
        assert helpers.adapter_for(model).n_layers == 2


def test_remove_layers_checks_its_list_and_an_empty_one_changes_nothing():
    model = tiny_llama()
    plain = logits(model, IDS)
    with helpers.remove_layers(model, []):
        assert torch.equal(logits(model, IDS), plain)
    with pytest.raises(InterventionError, match="all 4 layers"):
        helpers.remove_layers(model, [0, 1, 2, 3])
    with pytest.raises(InterventionError, match="increasing order"):
        helpers.remove_layers(model, [2, 0])
    with pytest.raises(InterventionError, match="layers 0..3"):
        helpers.remove_layers(model, [4])


def test_prune_top_takes_an_integer_count_not_a_float_or_a_boolean():
    model = tiny_llama()
    for bad in (2.5, True, 0, 5, "2"):
        with pytest.raises(InterventionError, match=r"integer in 1..4"):
            helpers.prune_top(model, bad)
    with helpers.prune_top(model, np.int64(2)):
        assert helpers.adapter_for(model).n_layers == 2


def test_swap_layers_checks_the_donor_and_an_empty_list_changes_nothing():
    teacher, student = tiny_pair()
    plain = logits(student, IDS)
    with helpers.swap_layers(student, teacher, []):
        assert torch.equal(logits(student, IDS), plain)
    with pytest.raises(InterventionError, match=r"donor \(llama\) has layers 0..1: it has no layer \[2\]"):
        helpers.swap_layers(student, helpers.adapter_for(tiny_llama(layers=2)).model, [2])
    with pytest.raises(InterventionError, match=r"llama model in torch.bfloat16 on cpu into a llamba model in torch.float32"):
        helpers.swap_layers(student, tiny_llama(layers=3, dtype=torch.bfloat16), [1])
    with pytest.raises(InterventionError, match="more than once"):
        helpers.swap_layers(student, teacher, [1, 1])


# --- attention maps and masks -------------------------------------------------------------------------

def test_attention_maps_checks_ids_and_layers():
    model = tiny_llama()
    with pytest.raises(InterventionError, match=r"\[batch, T\].*ids\[None\]"):
        attention_maps(model, IDS[0], [1])
    with pytest.raises(InterventionError, match=r"0..59"):
        attention_maps(model, IDS + 100, [1])
    with pytest.raises(InterventionError, match="more than once"):
        attention_maps(model, IDS, [1, 1])
    assert attention_maps(model, IDS, []) == {}
    assert list(attention_maps(model, IDS, [np.int64(3), 0])) == [3, 0]


def test_mask_attention_with_no_heads_is_an_exact_no_op():
    """It used to switch the layer to eager attention anyway (logits moved by ~1e-7)."""
    model = tiny_llama()
    T = IDS.shape[1]
    plain = logits(model, IDS)
    with mask_attention(model, 1, [], torch.ones(T, T, dtype=torch.bool)):
        assert torch.equal(logits(model, IDS), plain)
    ssm = tiny_mamba2()
    plain = logits(ssm, IDS)
    with mask_attention(ssm, 1, [], torch.eye(T)):
        assert torch.equal(logits(ssm, IDS), plain)


def test_a_mask_of_the_wrong_shape_is_rejected_when_the_intervention_starts():
    model = tiny_llama()
    for mask, says in [(torch.ones(3, 7, 7), "one pattern per head: 2, not 3"),
                       (torch.ones(7, 6), r"\[T, T\] or \[heads, T, T\].*\[7, 6\]"),
                       (torch.ones(7), r"\[T, T\] or \[heads, T, T\]"),
                       (torch.full((7, 7), 0.5), "booleans"),
                       (np.ones((7, 7), dtype=bool), "torch tensor")]:
        with pytest.raises(InterventionError, match=says):
            mask_attention(model, 1, [0, 1], mask)


@pytest.mark.parametrize("kind", ["attention", "ssm"])
def test_a_mask_for_another_length_names_both_lengths_at_the_forward_pass(kind):
    model = tiny_llama() if kind == "attention" else tiny_mamba2()
    plain = logits(model, IDS)
    with mask_attention(model, 1, [0], torch.ones(5, 5, dtype=torch.bool)):
        with pytest.raises(InterventionError, match=r"mask is for T=5 tokens, but the input has T=7"):
            logits(model, IDS)
    assert torch.equal(logits(model, IDS), plain)


def test_mask_last_row_checks_length_and_layers():
    model = tiny_zamba2()
    plain = logits(model, IDS)
    with mask_last_row(model, IDS.shape[1], layers=[]):
        assert torch.equal(logits(model, IDS), plain)
    for length in (0, 2.5, True):
        with pytest.raises(InterventionError, match="positive integer"):
            mask_last_row(model, length)
    with pytest.raises(InterventionError, match=r"attention layers are \[1, 3\]"):
        mask_last_row(model, 7, layers=[2])
    with pytest.raises(InterventionError, match="no attention layers"):
        mask_last_row(tiny_mamba2(), 7)


# --- tasks and configurations ---------------------------------------------------------------------------

def test_kv_items_rejects_counts_below_one_instead_of_returning_nothing():
    for n in (0, -5, 2.0, True):
        with pytest.raises(ConfigError, match=r"n \(prompts\) must be an integer >= 1"):
            tasks.kv_items(8, n)
    with pytest.raises(ConfigError, match="1..100"):
        tasks.kv_items(True, 1)
    with pytest.raises(ConfigError, match="'paper' or 'repeat'"):
        tasks.kv_items(3, 1, query="nope")
    assert tasks.kv_items(np.int64(3), np.int64(2), seed=np.int64(1)) == tasks.kv_items(3, 2, seed=1)


@pytest.mark.parametrize("load", [tasks.load_mmlu, tasks.load_knowledge])
def test_task_loaders_reject_an_unknown_profile_before_reaching_for_the_hub(load, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("reached for the hub"))
    with pytest.raises(ConfigError, match="unknown profile 'gpu'; profiles: cpu, paper, paper-3b"):
        load("gpu")
    with pytest.raises(ConfigError, match=r"n \(items drawn\) must be an integer >= 1"):
        load("cpu", n=0)


def test_an_item_with_its_gold_outside_its_choices_is_rejected():
    pairs = (("a", " b"), ("a", " c"))
    with pytest.raises(ConfigError, match=r"0..1, got 2"):
        tasks.Item(pairs, 2)
    assert tasks.Item(pairs, np.int64(1)) == tasks.Item(pairs, 1)


def test_llamba_config_states_its_head_constraint_at_config_time():
    with pytest.raises(ConfigError, match=r"n_v_heads=32 must divide d_inner = expand \* d_model = 45"):
        LlambaConfig(d_model=45)
    with pytest.raises(ConfigError, match="n_v_heads=6 must be a multiple of n_qk_heads=4"):
        LlambaConfig(d_model=48, ssm_cfg={"n_v_heads": 6, "n_qk_heads": 4})
