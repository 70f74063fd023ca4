"""Every public entry point checks its arguments before any work and raises one error type per
kind of mistake, naming what is valid: `InterventionError` for interventions and adapters,
`ConfigError` for task loaders and model configurations. Numpy and torch integers are integers;
booleans are not. Empty interventions are exact no-ops. Each case here was found on a version
that failed it (a tensor-size error deep in a forward pass, a silent reordering, ...)."""

import time

import numpy as np
import pytest
import torch
from test_adapters import tiny_pair, tiny_zamba2
from test_attention import tiny_mamba2
from transformers import LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM

import helpers
from helpers import ConfigError, InterventionError, tasks
from helpers.attention import attention_maps, mask_attention, mask_last_row
from helpers.experiments import attention_maps as maps_chapter  # attention_maps is the function
from helpers.experiments import (
    head_zeroing,
    hybrid_models,
    hybrid_swap,
    kv_retrieval,
    layer_pruning,
    layer_removal,
    masking,
    ssm_vs_attention,
)
from helpers.llamba import LlambaConfig
from helpers.protocol import checks, distilled, loading
from helpers.specs import Spec


def tiny_llama(layers=4, dtype=torch.float32):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


@torch.inference_mode()
def logits(model, ids):
    return model(ids).logits


IDS = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))


# --- adapters ---------------------------------------------------------------------------------------


def test_a_channel_group_must_divide_the_channels_at_construction():
    torch.manual_seed(0)
    # 38 channels per layer
    model = MambaForCausalLM(
        MambaConfig(
            vocab_size=50,
            hidden_size=19,
            num_hidden_layers=2,
            state_size=4,
            expand=2,
            use_mambapy=False,
        )
    ).eval()
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
    assert (
        adapter.check_layer(np.int64(2)) == 2 and type(adapter.check_layer(torch.tensor(2))) is int
    )
    assert adapter.check_heads(np.int32(1), [np.int64(3), torch.tensor(0)]) == [3, 0]
    assert adapter.check_heads(1, np.int64(3)) == [3]
    for bad in (True, 2.0, "2", None, torch.tensor([2])):
        with pytest.raises(InterventionError, match="layers 0..3"):
            adapter.check_layer(bad)
    with pytest.raises(InterventionError, match=r"\[True\] not valid.*heads 0..3"):
        adapter.check_heads(1, [True])
    with pytest.raises(InterventionError, match=r"\[4\] out of range.*heads 0..3"):
        adapter.check_heads(1, [4])
    with pytest.raises(
        InterventionError, match=r"head\(s\) \[2\] of layer 1 listed more than once"
    ):
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
    for heads, says in [
        ([True], r"\[True\] not valid"),
        (None, "got None"),
        (2.5, "list of them, got 2.5"),
        ({0: 1}, "a head index or a list"),
    ]:
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
    with pytest.raises(
        InterventionError, match=r"a list of layer indices, got 2 \(for one layer write \[2\]\)"
    ):
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
    with pytest.raises(
        InterventionError, match=r"donor \(llama\) has layers 0..1: it has no layer \[2\]"
    ):
        helpers.swap_layers(student, helpers.adapter_for(tiny_llama(layers=2)).model, [2])
    with pytest.raises(
        InterventionError,
        match=r"llama model in torch.bfloat16 on cpu into a llamba model in torch.float32",
    ):
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
    for mask, says in [
        (torch.ones(3, 7, 7), "one pattern per head: 2, not 3"),
        (torch.ones(7, 6), r"\[T, T\] or \[heads, T, T\].*\[7, 6\]"),
        (torch.ones(7), r"\[T, T\] or \[heads, T, T\]"),
        (torch.full((7, 7), 0.5), "booleans"),
        (np.ones((7, 7), dtype=bool), "torch tensor"),
    ]:
        with pytest.raises(InterventionError, match=says):
            mask_attention(model, 1, [0, 1], mask)


@pytest.mark.parametrize("kind", ["attention", "ssm"])
def test_a_mask_for_another_length_names_both_lengths_at_the_forward_pass(kind):
    model = tiny_llama() if kind == "attention" else tiny_mamba2()
    plain = logits(model, IDS)
    with mask_attention(model, 1, [0], torch.ones(5, 5, dtype=torch.bool)):
        with pytest.raises(
            InterventionError, match=r"mask is for T=5 tokens, but the input has T=7"
        ):
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
    assert tasks.kv_items(np.int64(3), np.int64(2), seed=np.int64(1)) == tasks.kv_items(
        3, 2, seed=1
    )


@pytest.mark.parametrize("load", [tasks.load_mmlu, tasks.load_knowledge])
def test_task_loaders_reject_an_unknown_profile_before_reaching_for_the_hub(load, monkeypatch):
    import datasets

    monkeypatch.setattr(
        datasets, "load_dataset", lambda *a, **k: pytest.fail("reached for the hub")
    )
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
    with pytest.raises(
        ConfigError, match=r"n_v_heads=32 must divide d_inner = expand \* d_model = 45"
    ):
        LlambaConfig(d_model=45)
    with pytest.raises(ConfigError, match="n_v_heads=6 must be a multiple of n_qk_heads=4"):
        LlambaConfig(d_model=48, ssm_cfg={"n_v_heads": 6, "n_qk_heads": 4})


# --- chapter parameters, checked against the model before any work -----------------------------------


@pytest.mark.parametrize(
    "chapter, kwargs, message",
    [
        (
            head_zeroing,
            dict(model="smollm2-135m-instruct", gather=[[3, -1]], aggregate=["L4H0"]),
            r"gather: cannot read \[3, -1\] as a head: layer and head are indices >= 0",
        ),
        (
            head_zeroing,
            dict(model="smollm2-135m-instruct", gather=["L3H9"], aggregate=["L4H0"]),
            r"gather: smollm2-135m-instruct has no head L3H9 \(layer 3 of this llama model has heads 0..8\)",
        ),
        (
            head_zeroing,
            dict(
                model="smollm2-135m-instruct", gather=["L3H0"], aggregate=["L12H0"], layers_kept=10
            ),
            r"aggregate: smollm2-135m-instruct has no head L12H0 \(of its 30 layers the run keeps 0..9\)",
        ),
        (
            head_zeroing,
            dict(model="smollm2-135m-instruct", sweep_layers=[2, 30]),
            r"sweep_layers: smollm2-135m-instruct has no layer 30: its layers are 0..29",
        ),
        (
            head_zeroing,
            dict(model="toy-mamba2", task="kv", kv_pairs=40),
            "kv_pairs: a KV dictionary for toy-mamba2 holds at most 32 keys",
        ),
        (
            layer_pruning,
            dict(kv_pairs=101),
            r"kv_pairs: a KV dictionary for qwen2.5-coder-0.5b-instruct holds at most 100 keys",
        ),
        (
            layer_pruning,
            dict(model="toy-mamba2"),
            "model: layer_pruning scores MMLU and the knowledge tasks, which the toy "
            "model toy-mamba2 does not read .*use one of smollm2-135m-instruct",
        ),
        (
            layer_removal,
            dict(model="toy-transformer"),
            "model: layer_removal scores MMLU .* toy model toy-transformer",
        ),
        (
            layer_removal,
            dict(model="smollm2-135m-instruct", minimal_layers=31),
            "minimal_layers must be at most 30 for smollm2-135m-instruct, got 31",
        ),
        (
            layer_pruning,
            dict(n_kv=10**12),
            "n_kv must be at most 100,000, got 1,000,000,000,000: a run that large would "
            "not finish; set a smaller n_kv",
        ),
        (
            kv_retrieval,
            dict(model="toy-mamba2", sizes=[8, 33]),
            "sizes: a KV dictionary for toy-mamba2 holds at most 32 keys",
        ),
        (
            maps_chapter,
            dict(model="toy-transformer", kv_pairs=48),
            "kv_pairs: .*toy-transformer holds at most 32 keys",
        ),
        (
            hybrid_models,
            dict(kv_pairs=33),
            "kv_pairs: a KV dictionary for toy-hybrid holds at most 32 keys",
        ),
        (
            hybrid_swap,
            dict(layers=[99]),
            "layers: toy-student has no layer 99: its layers are 0..3",
        ),
        (
            masking,
            dict(models=["toy-mamba2", "toy-mamba2"]),
            "models lists toy-mamba2 more than once: list each model once",
        ),
        (
            ssm_vs_attention,
            dict(models=["toy-mamba2", "toy-mamba1"], sizes=[2, 40]),
            "sizes: a dictionary of toy-mamba2 holds at most 32 keys",
        ),
    ],
)
def test_a_chapter_parameter_beyond_its_model_or_task_stops_the_config(chapter, kwargs, message):
    """Each of these used to pass the config and fail only after the work (the whole screen, both
    rankings, 15 cells), with a message naming another parameter, or a bare StopIteration."""
    checks.shape("smollm2-135m-instruct")  # its GGUF header, read once per process
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=message):
        chapter.Config.for_profile("cpu", smoke=True, **kwargs)
    assert time.perf_counter() - start < 1


@pytest.fixture
def sixteen_layer_llama(tmp_path, monkeypatch):
    """The local hub cache holds a 16-layer snapshot under Llama-3.1-8B-Instruct's repo id (as a
    model= override or a smaller checkpoint would): shallower than the paper's heads L16H22, L17H24.
    (`checks.shape` reads a config once per file, so the next test sees the usual cache again.)"""
    import huggingface_hub.constants

    snapshot = tmp_path / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    LlamaConfig(
        vocab_size=60,
        hidden_size=64,
        intermediate_size=48,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
    ).to_json_file(snapshot / "config.json")
    (tmp_path / "models--meta-llama--Llama-3.1-8B-Instruct" / "refs").mkdir()
    (tmp_path / "models--meta-llama--Llama-3.1-8B-Instruct" / "refs" / "main").write_text("rev")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))


@pytest.mark.parametrize(
    "chapter, kwargs",
    [
        (kv_retrieval, {}),
        (maps_chapter, {}),
        (masking, dict(models=["llama-3.1-8b-instruct"])),
        (ssm_vs_attention, dict(models=["llamba-8b", "llama-3.1-8b-instruct"])),
    ],
)
def test_a_paper_model_shallower_than_the_papers_heads_names_gather_and_aggregate(
    sixteen_layer_llama, chapter, kwargs
):
    """These stopped deep inside with "layer 16 is out of range", naming neither the paper's heads
    nor the parameters that fix it."""
    with pytest.raises(
        ConfigError,
        match=r"the paper's heads for llama-3.1-8b-instruct include L16H22, which "
        r"llama-3.1-8b-instruct does not have \(its layers are 0..15\): set gather and "
        r"aggregate to heads of this model \(with papermill: -y 'gather: \[L1H0\]'",
    ):
        chapter.Config.for_profile("paper", smoke=True, **kwargs)


@pytest.mark.parametrize("chapter", [masking, ssm_vs_attention])
def test_every_paper_model_of_a_multi_model_chapter_is_checked_before_the_first_one_runs(
    chapter, monkeypatch
):
    """The last model's missing cache used to stop the chapter only after the first model's full run."""
    from helpers import models

    cfg = chapter.Config.for_profile("paper", smoke=True)
    *first, last = cfg.models
    checked = []

    def check(spec, device, dtype):
        checked.append(spec.name)
        if spec.name == last:
            raise models.ModelUnavailable(f"{spec.hub_id} is not in the local Hugging Face cache")

    monkeypatch.setattr(models, "check_paper_model", check)
    monkeypatch.setattr(
        loading, "load", lambda name: pytest.fail(f"{name} loaded before every model was checked")
    )
    with pytest.raises(models.ModelUnavailable, match=models.spec(last).hub_id):
        chapter.run(cfg)
    assert checked == [*first, last] and len(checked) >= 2


# --- swap_layers in the host's working dtype ----------------------------------------------------------


def bf16_hosts():
    """Tiny 3-layer hosts of width 32 of each SSM family the hybrid swap takes, in bfloat16."""
    from transformers import (
        FalconMambaConfig,
        FalconMambaForCausalLM,
        Mamba2Config,
        Mamba2ForCausalLM,
    )

    from helpers.llamba import LlambaForCausalLM

    torch.manual_seed(0)
    return {
        "mamba": MambaForCausalLM(
            MambaConfig(
                vocab_size=60,
                hidden_size=32,
                num_hidden_layers=3,
                state_size=4,
                expand=2,
                use_mambapy=False,
            )
        ),
        "falcon-mamba": FalconMambaForCausalLM(
            FalconMambaConfig(
                vocab_size=60,
                hidden_size=32,
                num_hidden_layers=3,
                state_size=4,
                expand=2,
                use_mambapy=False,
            )
        ),
        "mamba2": Mamba2ForCausalLM(
            Mamba2Config(
                vocab_size=60,
                hidden_size=32,
                num_hidden_layers=3,
                expand=2,
                num_heads=4,
                head_dim=16,
                state_size=8,
                n_groups=1,
                chunk_size=8,
            )
        ),
        "llamba": LlambaForCausalLM(
            LlambaConfig(
                vocab_size=60,
                d_model=32,
                n_layer=3,
                mlp_cfg={"intermediate_size": 48},
                ssm_cfg={"d_state": 8, "n_v_heads": 4, "n_qk_heads": 4, "chunk_size": 8},
            )
        ),
    }


@pytest.mark.parametrize("family", ["mamba", "falcon-mamba", "mamba2", "llamba"])
@torch.inference_mode()
def test_swap_layers_into_a_bf16_ssm_host_runs_the_donor_in_its_dtype_and_hands_back_the_hosts(
    family,
):
    """Mamba and Falcon-Mamba keep their residual stream in float32 under bfloat16 weights: a Llama
    layer swapped in failed with "expected m1 and m2 to have the same dtype"."""
    host = bf16_hosts()[family].to(torch.bfloat16).eval()
    donor = (
        LlamaForCausalLM(
            LlamaConfig(
                vocab_size=60,
                hidden_size=32,
                intermediate_size=48,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
            )
        )
        .to(torch.bfloat16)
        .eval()
    )
    host_layers, donor_layers = helpers.adapter_for(host).layers, helpers.adapter_for(donor).layers
    seen = {}
    hooks = [
        donor_layers[1].register_forward_pre_hook(
            lambda m, args, kw: seen.update(donor_in=args[0].dtype), with_kwargs=True
        ),
        host_layers[2].register_forward_pre_hook(
            lambda m, args, kw: seen.update(host_in=(args or [kw.get("hidden_states")])[0].dtype),
            with_kwargs=True,
        ),
    ]
    plain = logits(host, IDS)
    with helpers.swap_layers(host, donor, [1]):
        swapped = logits(host, IDS)
    for hook in hooks:
        hook.remove()
    plain_in = {}
    hook = host_layers[2].register_forward_pre_hook(
        lambda m, args, kw: plain_in.update(dtype=(args or [kw.get("hidden_states")])[0].dtype),
        with_kwargs=True,
    )
    assert torch.equal(logits(host, IDS), plain)  # restored
    hook.remove()
    assert seen["donor_in"] == torch.bfloat16  # the donor's layer read the stream in its own dtype
    # the host's next layer got the stream in the dtype it keeps it in
    assert seen["host_in"] == plain_in["dtype"]
    assert torch.isfinite(swapped).all() and not torch.equal(swapped, plain)


def test_hybrid_swap_checks_widths_from_the_configs_and_tries_its_swaps_before_the_sweep(
    monkeypatch,
):
    import copy

    with pytest.raises(
        ConfigError,
        match=r"student llamba-3b \(residual width 3072\) and teacher llama-3.1-8b-instruct "
        r"\(width 4096\) cannot swap layers",
    ):
        hybrid_swap.Config.for_profile("paper", smoke=True, student="llamba-3b")
    # 4096 wide: it fits
    hybrid_swap.Config.for_profile("paper", smoke=True, student="falcon-mamba-7b-instruct")

    student, teacher = loading.load("toy-student"), loading.load("toy-transformer")
    # a teacher loaded in another dtype than the student (the cached one is left as is)
    bf16 = copy.copy(teacher)
    bf16.model = copy.deepcopy(teacher.model).to(torch.bfloat16)
    bf16.adapter = helpers.adapter_for(bf16.model)
    monkeypatch.setattr(
        loading, "load", lambda name: {"toy-student": student, "toy-transformer": bf16}[name]
    )
    monkeypatch.setattr(
        distilled, "find_teacher_layer", lambda *a, **k: pytest.fail("the sweep started")
    )
    with pytest.raises(
        InterventionError,
        match=r"cannot swap layer 0 from a conv_llama model in torch.bfloat16 on cpu "
        r"into a llamba model in torch.float32 on cpu: load both alike",
    ):
        hybrid_swap.run(hybrid_swap.Config.for_profile("cpu", smoke=True))


# --- the smaller cases --------------------------------------------------------------------------------


@torch.inference_mode()
def test_mask_final_rows_checks_its_lengths_and_keeps_another_mask_on_the_same_layer():
    """It said "a mask for T=6 tokens; this one is for T=6" beside another mask of the same
    length, and gave raw torch errors for [] and [0]."""
    from helpers.attention import mask_final_rows

    model = tiny_llama()
    T = IDS.shape[1]
    for bad in ([], [0], [7, -1], 7, [2.5]):
        with pytest.raises(
            InterventionError,
            match=r"mask_final_rows takes each row's token count, a non-empty list "
            r"of positive integers",
        ):
            with mask_final_rows(model, bad):
                pass
    with pytest.raises(InterventionError, match="layers 0..3"):
        with mask_final_rows(model, [T, T], layers=[9]):
            pass
    eye = torch.eye(T, dtype=torch.bool) | torch.ones(T, T, dtype=torch.bool).tril(-1)
    with mask_last_row(model, T), mask_attention(model, 1, [0], eye):
        expected = logits(model, IDS)
    for first, second in [
        (lambda: mask_final_rows(model, [T, T]), lambda: mask_attention(model, 1, [0], eye)),
        (lambda: mask_attention(model, 1, [0], eye), lambda: mask_final_rows(model, [T, T])),
    ]:
        # both kept, in either order: every row's final position reads nothing
        with (
            first(),
            second(),
        ):
            assert torch.equal(logits(model, IDS), expected)
    with mask_attention(model, 1, [0], torch.ones(5, 5, dtype=torch.bool)):
        with pytest.raises(
            InterventionError,
            match=r"layer 1 already has a mask for T=5 tokens; this one is for T=7",
        ):
            with mask_final_rows(model, [T, T]):
                pass


def test_the_engine_checks_its_ablations_layers_and_depths_like_the_interventions():
    from test_engine import CharTokenizer

    from helpers.engine import SweepEngine

    model = tiny_llama()
    items = [helpers.Item((("ab:1 cd:2 ab:", "1"), ("ab:1 cd:2 ab:", "2")), 0)]
    engine = SweepEngine(model, CharTokenizer(), items, batch_tokens=64)
    with helpers.zero_heads(model, {0: [0, 1]}):
        zeroed = np.concatenate(helpers.choice_loglikelihoods(model, CharTokenizer(), items))
    np.testing.assert_allclose(
        engine.loglikelihoods([Spec(zero={0: np.array([0, 1])})])[0], zeroed, rtol=0, atol=1e-5
    )
    for layers, says in [
        ("2,0", r"increasing order.*write \[0, 2\]"),
        ("0,0,1", r"\[0\] listed more than once"),
    ]:
        with pytest.raises(InterventionError, match=says):
            engine.score(f"keep {layers}")
    for depths in ([0], [5], [2.5]):
        with pytest.raises(
            InterventionError, match=r"score_by_depth takes depths 1..4 \(how many bottom layers"
        ):
            engine.score_by_depth(depths)
    with pytest.raises(ConfigError, match=r"an intervention is a Spec or its text.*got \[0, 1\]"):
        engine.loglikelihoods([[0, 1]])
    with pytest.raises(ConfigError, match=r"not \{layer: \[heads\]\}.*write Spec\(zero="):
        engine.loglikelihoods([{0: [0, 1]}])


def test_a_stored_score_of_the_wrong_shape_names_the_fix():
    """A record with other content stopped a chapter with `KeyError: 'correct'`."""
    from helpers.stats import Score

    assert Score.from_json({"correct": "0110"}).n == 4
    for row in ({"acc": 0.5}, {"correct": [1, 0]}, {"correct": "01x"}, ["0110"]):
        with pytest.raises(
            ValueError,
            match=r"a stored score is \{'correct': '0110...'\}.*delete that store .*GA_RESULTS",
        ):
            Score.from_json(row)


def test_the_offline_message_mentions_gated_models_only_for_metas(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from helpers import models

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    with pytest.raises(
        models.ModelUnavailable,
        match=r"`hf download tiiuae/falcon-mamba-7b-instruct` where the hub is reachable, or let the run download it",
    ) as e:
        models.check_paper_model(models.spec("falcon-mamba-7b-instruct"), cpu, torch.float32)
    assert "gated" not in str(e.value) and "huggingface-cli" not in str(e.value)
    with pytest.raises(
        models.ModelUnavailable,
        match=r"`hf download meta-llama/Llama-3.1-8B-Instruct` where .*gated.*hf auth login",
    ):
        models.check_paper_model(models.spec("llama-3.1-8b-instruct"), cpu, torch.float32)
