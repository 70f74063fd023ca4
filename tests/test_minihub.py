"""The rehearsal of the paper profile: a mini-hub (helpers.minihub) of tiny random-weight paper
models and fixture datasets, loaded through the paper profile's unchanged calls in a fresh
process with HF_HOME / HF_HUB_OFFLINE=1 / GA_DEVICE=cpu, as a real machine would load the hub's."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import helpers
from helpers import minihub, models, paths

SRC = Path(helpers.__file__).resolve().parents[1]

# Runs in a process whose environment points huggingface_hub and datasets at the mini-hub.
REHEARSAL = """
import json, os, sys
import numpy as np
import torch
import helpers
from helpers import minihub

report = {"models": {}}
for name in minihub.paper_models():
    try:
        loaded = helpers.load(name)
    except Exception as e:
        report["models"][name] = {"error": f"{type(e).__name__}: {e}"}
        continue
    ids = loaded.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = loaded.model(ids).logits
    weight = next(loaded.model.parameters())
    report["models"][name] = {"summary": minihub.shape_summary(loaded.model), "logits": list(logits.shape),
                              "vocab": len(loaded.tokenizer), "finite": bool(torch.isfinite(logits).all()),
                              "dtype": str(weight.dtype), "device": str(weight.device)}
report["mmlu"] = [item.pairs[item.gold] for item in helpers.load_mmlu("paper")]
report["knowledge"] = {task: [item.pairs[item.gold] for item in items]
                       for task, items in helpers.load_knowledge("paper").items()}
# The §6 chapter's tasks, as lm-eval's own task definitions load them (offline, from the mini-hub)
from lm_eval.tasks import TaskManager, get_task_dict
report["lm_eval"] = {}
for name in ("gsm8k", "arc_challenge_chat", "swde", "bbh_cot_fewshot_navigate"):
    (task,) = get_task_dict([name], TaskManager()).values()
    docs = list(task.eval_docs)
    report["lm_eval"][name] = {"n": len(docs), "target": task.doc_to_target(docs[0]), "text": task.doc_to_text(docs[0]),
                               "fewshot": len(list(task.fewshot_docs() or []))}
# Every paper model in the GPU's bfloat16, whatever dtype this CPU rehearses the book in: a head
# zeroed by the engine, and the screen's forward and backward passes (every head at once), on two
# short prompts.
from helpers import screen
from helpers.engine import SweepEngine
report["bfloat16"] = {}
for name in minihub.paper_models():
    try:
        loaded = helpers.load(name, dtype=torch.bfloat16)
        engine = SweepEngine(loaded, loaded.tokenizer, helpers.kv_items(2, 2, seed=0))
        # the model cut to its first layer with heads: emulated bfloat16 is slow (Falcon-Mamba's
        # 64 layers took 135 s in full)
        first = loaded.adapter.head_layers()[0]
        within = helpers.Spec.parse(f"keep 0..{first}")
        plain, zeroed = engine.loglikelihoods([within, within.zeroing(helpers.Head(first, 0))])
        estimates = screen.attribution(engine, within=within, alpha=1.0, progress=False)
        report["bfloat16"][name] = {
            "dtype": str(next(loaded.model.parameters()).dtype),
            "finite": bool(np.isfinite(plain).all() and np.isfinite(zeroed).all()),
            "moved": bool((plain != zeroed).any()),
            "estimates": len(estimates),
            "finite_estimates": bool(np.isfinite(list(estimates.values())).all()),
        }
    except Exception as e:
        report["bfloat16"][name] = {"error": f"{type(e).__name__}: {e}"}
del os.environ["GA_DEVICE"]  # and no GPU is visible (CUDA_VISIBLE_DEVICES="")
try:
    helpers.load("llama-3.2-3b-instruct")
    report["without_ga_device"] = "loaded"
except helpers.ModelUnavailable as e:
    report["without_ga_device"] = str(e)
json.dump(report, open(sys.argv[1], "w"))
"""


def manifest(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The mini-hub, and what its files held before anything loaded from it."""
    directory = minihub.build(tmp_path_factory.mktemp("minihub"))
    return directory, manifest(directory)


@pytest.fixture(scope="module")
def rehearsal(hub, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("rehearsal") / "report.json"
    env = {
        **os.environ,
        "HF_HOME": str(hub[0]),
        "HF_HUB_OFFLINE": "1",
        "GA_DEVICE": "cpu",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        # Tiny tensors: on a busy machine extra threads cost more than they share (measured: 50x).
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", REHEARSAL, str(out)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def published_summary(name: str) -> dict:
    with torch.device("meta"):
        return minihub.shape_summary(models.model_from_config(helpers.paper_config(name)))


@pytest.mark.parametrize("name", minihub.paper_models())
def test_paper_model_loads_on_cpu_with_its_published_counts(rehearsal, name):
    loaded = rehearsal["models"][name]
    assert "error" not in loaded, loaded.get("error")
    assert loaded["summary"] == published_summary(name)
    assert loaded["logits"][0] == 1 and loaded["logits"][2] >= loaded["vocab"] and loaded["finite"]
    assert (loaded["dtype"], loaded["device"]) == ("torch.float32", "cpu")


@pytest.mark.parametrize("name", minihub.paper_models())
def test_paper_model_zeroes_heads_and_screens_in_the_gpus_bfloat16(rehearsal, name):
    """The rehearsal book runs in float32 on a CPU without native bfloat16 (`book.rehearsal_hub`):
    the GPU's dtype is rehearsed here on every paper model, on a few tokens."""
    got = rehearsal["bfloat16"][name]
    assert "error" not in got, got.get("error")
    assert got["dtype"] == "torch.bfloat16" and got["finite"] and got["moved"]
    assert got["estimates"] > 0 and got["finite_estimates"]


def test_published_counts_that_the_paper_names():
    """The counts the paper's heads and the hybrid chapter need, as data/configs has them."""
    llama, llamba = published_summary("llama-3.1-8b-instruct"), published_summary("llamba-8b")
    # L16H22, L17H24
    assert llama["heads"][16] == llama["heads"][17] == 32 and llama["kv_heads"] == 8
    assert llamba["heads"][17] == 32  # L16H10, L17H3 and H9
    assert published_summary("falcon-mamba-7b-instruct")["heads"][35] == 8192  # channels up to 7305
    zamba = published_summary("zamba2-7b")
    assert (
        zamba["hybrid_layers"] == [6, 11, 17, 23, 29, 35, 41, 47, 53, 59, 65, 71, 77]
        and zamba["shared_blocks"] == 2
    )
    assert published_summary("zamba2-2.7b-instruct")["hybrid_layers"] == [
        6,
        12,
        18,
        24,
        30,
        36,
        42,
        47,
        51,
    ]


def test_paper_datasets_load_from_the_minihub(rehearsal):
    fixture = [
        json.loads(line)
        for line in (paths.data() / "fixtures" / "mmlu.jsonl").read_text().splitlines()
    ]
    test = [r for r in fixture if r["split"] == "test"]
    assert len(rehearsal["mmlu"]) == len(test)
    assert (
        test[0]["question"] in rehearsal["mmlu"][0][0]
        and rehearsal["mmlu"][0][1] == " " + "ABCD"[test[0]["answer"]]
    )
    knowledge = rehearsal["knowledge"]
    assert set(knowledge) == set(helpers.tasks.PAPER_KNOWLEDGE)
    assert {task: len(items) for task, items in knowledge.items()} == {
        "arc_easy": 44,
        "arc_challenge": 19,
        "openbookqa": 63,
        "piqa": 63,
        "hellaswag": 63,
        "winogrande": 63,
    }
    # Each task's first gold choice holds its fixture row's answer, whatever the task's schema.
    for task, items in knowledge.items():
        assert (" K" if task == "arc_challenge" else " Moscow") in "".join(items[0]), task


def test_the_beyond_mmlu_tasks_load_offline_through_lm_evals_own_definitions(rehearsal):
    book = lambda name: [
        json.loads(line)
        for line in (paths.data() / "lm_eval_tasks" / f"{name}-test.jsonl").read_text().splitlines()
    ]
    tasks = rehearsal["lm_eval"]
    arithmetic, pages = book("arithmetic_words"), book("page_field")
    # 8 solved ones for 5-shot
    assert tasks["gsm8k"]["n"] == len(arithmetic) - 8 and tasks["gsm8k"]["fewshot"] == 8
    # what strict-match reads
    assert tasks["gsm8k"]["target"].endswith(f"#### {arithmetic[8]['answer']}")
    assert tasks["swde"]["n"] == len(pages) and tasks["swde"]["target"] == pages[0]["answer"]
    assert tasks["swde"]["text"].endswith(f"{pages[0]['field']}:")
    # its train split
    assert tasks["arc_challenge_chat"]["n"] == 19 and tasks["arc_challenge_chat"]["fewshot"] > 0
    assert tasks["arc_challenge_chat"]["target"] in "ABCD"
    assert tasks["bbh_cot_fewshot_navigate"]["n"] == 63 and tasks["bbh_cot_fewshot_navigate"][
        "text"
    ].startswith("Q: ")


def test_paper_model_without_ga_device_still_needs_a_gpu(rehearsal):
    assert rehearsal["without_ga_device"].startswith(
        "llama-3.2-3b-instruct (meta-llama/Llama-3.2-3B-Instruct) is a "
        "paper-profile model: it needs a CUDA GPU"
    )


def test_two_builds_are_byte_identical(hub, tmp_path):
    minihub.main([str(tmp_path)])
    assert manifest(tmp_path) == hub[1]


def test_gpu_memory_check_fails_before_loading_and_names_the_fix(monkeypatch):
    import transformers

    def boom(*a, **k):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    monkeypatch.delenv("GA_DEVICE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # a Colab T4
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (15 * 10**9, 16 * 10**9))
    with pytest.raises(
        helpers.ModelUnavailable, match=r"16\.1 GB .* 15\.0 GB free.*>= 24 GB.*profile='paper-3b'"
    ):
        helpers.load("llama-3.1-8b-instruct")
    models.check_gpu(models.spec("llama-3.2-3b-instruct"), torch.bfloat16)  # 6.4 GB: fits


@pytest.mark.parametrize("name", minihub.paper_models())
def test_full_shapes_are_the_published_model(name):
    """--full-shapes writes the published model: same class, every count and width, counted on
    the meta device (the full set is ~116 GB of bf16 weights)."""
    # full shapes keep the vocabulary
    tokenizer = SimpleNamespace(bos_token_id=1, eos_token_id=2, pad_token_id=None)
    with torch.device("meta"):
        model = models.model_from_config(
            models.config_from_fields(minihub.hub_fields(name, tokenizer, full_shapes=True))
        )
    assert sum(p.numel() for p in model.parameters()) == models.n_parameters(name)
    assert minihub.shape_summary(model) == published_summary(name)


@pytest.mark.parametrize(
    "student, teacher",
    [("llamba-8b-unaligned", "llama-3.1-8b-instruct"), ("llamba-3b", "llama-3.2-3b-instruct")],
)
def test_a_distilled_ssm_and_its_teacher_keep_one_width_so_their_layers_swap(student, teacher):
    tokenizer = minihub.smollm2_tokenizer()
    assert (
        minihub.hub_fields(student, tokenizer)["d_model"]
        == minihub.hub_fields(teacher, tokenizer)["hidden_size"]
    )


def test_the_three_kv_forms_under_llama3s_tokenizer():
    """Released ("is42") against spaced ("is" + " 42") and trailing ("is " + "42"): the released
    form is other tokens; spaced and trailing are one model input, the spaced continuation only
    adding the space token every candidate shares, so their candidate rankings are one."""
    from helpers import tasks
    from helpers.experiments.kv_retrieval import same_tokens
    from helpers.packing import encode_pair

    tok = minihub.llama3_tokenizer()
    items = {form: tasks.kv_items(8, 3, seed=0, form=form) for form in tasks.KV_FORMS}
    for released, spaced, trailing in zip(*items.values()):
        for r, s, t in zip(released.pairs, spaced.pairs, trailing.pairs):
            (rc, rx), (sc, sx), (tc, tx) = (
                encode_pair(tok, c, x, it.verbatim)
                for (c, x), it in ((r, released), (s, spaced), (t, trailing))
            )
            assert tok.convert_ids_to_tokens(rc[-1:] + rx[:1]) == ["Ġis", r[1]]  # ' is', '42'
            # ' is', ' ', '42'
            assert tok.convert_ids_to_tokens(sc[-1:] + sx[:2]) == [
                "Ġis",
                "Ġ",
                s[1][1:],
            ]
            assert sc + sx == tc + tx and rc + rx != sc + sx  # spaced = trailing as model input
            # the shared space: scored by spaced, context for trailing
            assert tc == sc + sx[:1] and tx == sx[1:]
    assert same_tokens(tok, "paper") == {
        ("released", "spaced"): False,
        ("released", "trailing"): False,
        ("spaced", "trailing"): True,
    }
