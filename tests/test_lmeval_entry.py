"""`helpers.lmeval`: any lm-eval task under the book's interventions, tested offline on local task
YAMLs. A tiny random Llama with SmolLM2's tokenizer for the exact comparisons (fast, and its
scores have no ties), SmolLM2 itself for a generative task it can answer; and the book's own tasks
in data/lm_eval_tasks."""

import contextlib
import json
import os
import re
import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest
import torch

import helpers
from helpers import lmeval, models, paths, specs, tasks
from helpers.errors import ConfigError, InterventionError
from helpers.registry import Loaded
from helpers.specs import Spec

SUMS = [(1, 2), (3, 4), (5, 6), (7, 1), (2, 8), (4, 4), (6, 3), (9, 5)]
MC_DOCS = [
    {
        "question": f"What is {a} plus {b}?",
        "choices": [str(a + b), str(a + b + 1), str(a + b + 2)],
        "answer": i % 3,
    }
    for i, (a, b) in enumerate(SUMS)
]


def write_task(folder, name, docs, body):
    """A local lm-eval task: its docs as JSON lines, read through `dataset_path: json`."""
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    path = folder / f"{name}.yaml"
    path.write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"test_split: test\n{body}"
    )
    return str(path)


MC = (
    'output_type: multiple_choice\ndoc_to_text: "Question: {{question}}\\nAnswer:"\n'
    "doc_to_target: answer\ndoc_to_choice: choices\nmetric_list:\n  - metric: acc\n"
)
GEN = (
    'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
    'generation_kwargs:\n  until: ["\\n", ","]\n  do_sample: false\n  max_gen_toks: 6\n'
    "metric_list:\n  - metric: exact_match\n"
)


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tasks")
    kv = tasks.kv_items(2, 12, seed=0, query="repeat")
    gen_docs = [{"prompt": it.pairs[it.gold][0], "answer": it.pairs[it.gold][1]} for it in kv]
    return {
        "mc": write_task(folder, "entry_mc", MC_DOCS, MC),
        "gen": write_task(folder, "entry_gen", gen_docs, GEN),
    }


@pytest.fixture(scope="module")
def task_manager():
    from lm_eval.tasks import TaskManager

    return TaskManager()


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = models.gguf_file("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    return Loaded("tiny-random-llama", model, tok, helpers.adapter_for(model), "random, seed 0")


def run(loaded, files, task_manager, **kw):
    return lmeval.evaluate(loaded, files, task_manager=task_manager, log_samples=True, **kw)


def loglikelihoods(results, task):
    return [[ll for ll, _ in s["filtered_resps"]] for s in results["samples"][task]]


def test_clean_run_equals_plain_lm_eval(tiny, task_files, task_manager):
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks._yaml_loader import load_yaml

    files = [task_files["mc"], task_files["gen"]]
    ours = run(tiny, files, task_manager)
    plain = lm_eval.simple_evaluate(
        HFLM(pretrained=tiny.model, tokenizer=tiny.tokenizer, batch_size=8, device="cpu"),
        tasks=[load_yaml(f) for f in files],
        task_manager=task_manager,
        log_samples=True,
    )
    for task in ("entry_mc", "entry_gen"):
        assert ours["results"][task] == plain["results"][task]
        assert [s["resps"] for s in ours["samples"][task]] == [
            s["resps"] for s in plain["samples"][task]
        ]
    assert ours["provenance"]["models"] == {"tiny-random-llama": "random, seed 0"}
    intervention = ours["provenance"]["parameters"]["intervention"]
    assert intervention["text"] == "none" and Spec.from_record(intervention) == Spec()
    assert ours["provenance"]["versions"]["lm-eval"] == metadata.version("lm-eval")


# Each spec as text or as the CLI's flags build it, and as the book's primitives write it (the
# reference side).
INTERVENTIONS = [
    ("zero L1H0,L2H3", lambda m: [helpers.zero_heads(m, {1: [0], 2: [3]})]),
    (
        Spec.of([(3, 1)], "0..3", "1"),
        lambda m: [helpers.zero_heads(m, {3: [1]}), helpers.keep_layers(m, [0, 2, 3])],
    ),
]


@pytest.mark.parametrize("intervention, primitives", INTERVENTIONS)
def test_ablated_run_equals_the_projects_scorer(
    tiny, task_files, task_manager, intervention, primitives
):
    clean = run(tiny, [task_files["mc"]], task_manager)
    ablated = run(tiny, [task_files["mc"]], task_manager, spec=intervention)
    samples = ablated["samples"]["entry_mc"]
    items = [
        helpers.Item(
            tuple((f"Question: {d['question']}\nAnswer:", f" {c}") for c in d["choices"]),
            d["answer"],
        )
        for d in (s["doc"] for s in samples)
    ]
    # one prompt
    assert [tuple(tuple(a) for a in s["arguments"]) for s in samples] == [it.pairs for it in items]
    with contextlib.ExitStack() as stack:
        for context in primitives(tiny.model):
            stack.enter_context(context)
        ours = helpers.choice_loglikelihoods(tiny.model, tiny.tokenizer, items)
    theirs = loglikelihoods(ablated, "entry_mc")
    np.testing.assert_allclose(np.concatenate(ours), np.concatenate(theirs), atol=1e-4, rtol=0)
    correct = [int(np.argmax(ll)) == it.gold for ll, it in zip(ours, items)]
    assert correct == [bool(s["acc"]) for s in samples]
    assert ablated["results"]["entry_mc"]["acc,none"] == pytest.approx(np.mean(correct), abs=1e-12)
    # The ablation reached the model: every item's scores moved.
    assert all(
        not np.allclose(a, b, atol=1e-3) for a, b in zip(theirs, loglikelihoods(clean, "entry_mc"))
    )
    recorded = ablated["provenance"]["parameters"]["intervention"]
    assert Spec.from_record(recorded) == Spec.parse(intervention)
    assert recorded["text"] == str(Spec.parse(intervention))


def test_ablated_generations_differ_and_the_model_is_restored_exactly(
    tiny, task_files, task_manager
):
    ids = tiny.tokenizer("Question: What is 1 plus 2?\nAnswer:", return_tensors="pt").input_ids
    before = tiny.model(ids).logits
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    blocks = tiny.adapter.layers
    clean = run(tiny, [task_files["gen"]], task_manager)
    ablated = run(tiny, [task_files["gen"]], task_manager, spec="zero L0H0,L0H1,L1H2; remove 2")
    texts = lambda r: [s["filtered_resps"][0] for s in r["samples"]["entry_gen"]]
    assert texts(clean) != texts(ablated)
    # cut at the stops
    assert not any(stop in t for t in texts(clean) + texts(ablated) for stop in ("\n", ","))
    assert tiny.adapter.layers is blocks and len(blocks) == 4
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in tiny.model.modules())
    assert all(torch.equal(state[k], v) for k, v in tiny.model.state_dict().items())
    assert torch.equal(tiny.model(ids).logits, before)
    with (
        pytest.raises(RuntimeError, match="inside"),
        Spec.of("L1H1", "0..3", "2").applied(tiny.model),
    ):
        assert len(tiny.adapter.layers) == 3
        raise RuntimeError("interrupted inside the block")
    assert torch.equal(tiny.model(ids).logits, before)


def test_smollm2_by_name_on_a_generative_task(smol, task_files, task_manager, monkeypatch):
    """The registry path: checks against data/configs, then the model loaded by name (here the
    session's copy), its revision recorded; exact_match is lm-eval's, read off its own records."""
    loads = []
    monkeypatch.setattr(models, "load", lambda name, device=None: loads.append(name) or smol)
    shape = models.config_fields("smollm2-135m-instruct")
    config = smol.model.config
    assert (
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.hidden_size,
    ) == (
        shape["num_hidden_layers"],
        shape["num_attention_heads"],
        shape["num_key_value_heads"],
        shape["head_dim"],
        shape["hidden_size"],
    )
    results = lmeval.evaluate(
        "smollm2-135m-instruct",
        task_files["gen"],
        task_manager=task_manager,
        log_samples=True,
        limit=6,
    )
    assert loads == ["smollm2-135m-instruct"]
    samples = results["samples"]["entry_gen"]
    hits = [s["filtered_resps"][0] == s["target"] for s in samples]
    assert results["results"]["entry_gen"]["exact_match,none"] == pytest.approx(np.mean(hits))
    assert 0 < np.mean(hits)  # SmolLM2 retrieves from a 2-key dictionary (about 0.7)
    assert results["provenance"]["models"] == {"smollm2-135m-instruct": smol.revision}
    assert results["provenance"]["parameters"]["limit"] == 6


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(model="toy-mamba2"), "toy zoo"),
        (dict(model="llamba-8b"), "plain torch module"),
        (dict(spec="zero L16H"), "write it as 'L16H22'"),
        (dict(spec="zero L16H8,L16H8"), "more than once"),
        (dict(spec="zero L16H9"), r"smollm2-135m-instruct: head \[9\] out of range: .* heads 0..8"),
        (dict(spec="remove 30"), "layers 0..29"),
        (dict(spec="zero L20H1; keep 0..17"), "layers do not run"),
        (dict(spec="keep 0..17; remove 20"), "not among the kept layers"),
        (dict(spec="keep 0-17"), "write them as 0..17"),
        (dict(spec="zeros L16H1"), "each part is one of zero, mean"),
        (dict(spec="mean L16H1"), "measured by the sweep engine"),
        (dict(limit=-1), "limit must be"),
    ],
)
def test_bad_input_is_refused_before_anything_loads(kw, match, monkeypatch):
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    args = dict(model="smollm2-135m-instruct", tasks="entry_mc.yaml") | kw
    with pytest.raises((ConfigError, InterventionError), match=match):
        lmeval.evaluate(args.pop("model"), args.pop("tasks"), **args)


def test_unknown_tasks_are_refused_with_close_names(task_manager, tmp_path, monkeypatch):
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ConfigError, match="no task 'gsm8kk'; close names: gsm8k"):
        lmeval.evaluate("smollm2-135m-instruct", "gsm8kk", task_manager=task_manager)
    with pytest.raises(ConfigError, match="no task file"):
        lmeval.evaluate(
            "smollm2-135m-instruct", str(tmp_path / "missing.yaml"), task_manager=task_manager
        )
    assert lmeval.resolve_tasks("gsm8k", task_manager) == ["gsm8k"]


def test_the_books_own_tasks_skip_lm_evals_index_and_its_names_do_not():
    ours = list(lmeval.book_tasks())[:2]
    local = lmeval.task_manager_for(ours)
    assert not local.all_tasks  # no YAML of lm-eval's was read
    assert [t["task"] for t in lmeval.resolve_tasks(ours, local)] == ours
    # one lm-eval name: its whole index
    assert "gsm8k" in lmeval.task_manager_for(ours + ["gsm8k"]).all_tasks


def test_layers_and_heads_are_read_as_written():
    assert specs.parse_layers("0..3,8", "x") == (0, 1, 2, 3, 8)
    both = (helpers.Head(16, 22), helpers.Head(17, 24))
    assert specs.parse_heads("L17H24, L16H22") == both  # sorted: a set of heads
    assert specs.parse_heads({16: [22], 17: 24}) == specs.parse_heads([[16, 22], (17, 24)]) == both
    assert specs.parse_heads(helpers.Head(16, 22)) == both[:1]
    with pytest.raises(ConfigError, match="a list"):
        specs.parse_layers(5, "--keep-layers")
    assert Spec.of(keep_layers="0..5", remove_layers="2,3").runs(30) == [0, 1, 4, 5]


def test_the_command_line_refuses_bad_input_without_loading_a_model(capsys):
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "helpers.lmeval",
            "--model",
            "smollm2-135m-instruct",
            "--tasks",
            "gsm8k",
            "--zero",
            "L16H9",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert bad.returncode == 2 and "heads 0..8" in bad.stderr and "Traceback" not in bad.stderr
    with pytest.raises(SystemExit) as missing:
        lmeval.main(["--tasks", "gsm8k"])
    assert missing.value.code == 2 and "--model" in capsys.readouterr().err
    assert lmeval.main(["--model", "toy-hybrid", "--tasks", "gsm8k"]) == 2
    assert "toy zoo" in capsys.readouterr().err


# --- the book's own generative tasks (data/lm_eval_tasks) -------------------------------------------


def test_the_book_tasks_are_what_their_generator_writes_and_their_answers_check(tmp_path):
    import runpy

    folder = paths.data() / "lm_eval_tasks"
    generator = runpy.run_path(str(folder / "generate.py"))
    written = generator["write"](tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in folder.glob("*.jsonl"))
    for path in written:
        assert path.read_bytes() == (folder / path.name).read_bytes(), (
            f"rerun data/lm_eval_tasks/generate.py: {path.name}"
        )
    solve = {"add": lambda a, b: a + b, "take away": lambda a, b: a - b}
    letters = {
        r["id"]: r
        for r in map(
            json.loads, (paths.data() / "letters" / "letters.jsonl").read_text().splitlines()
        )
    }
    for split in ("train", "test"):
        for doc in map(
            json.loads, (folder / f"arithmetic_words-{split}.jsonl").read_text().splitlines()
        ):
            x, y = doc["operands"]
            assert doc["answer"] == str(solve[doc["operation"]](x, y)) and int(doc["answer"]) > 0
            thing = doc["solution"].split()[3].rstrip(".")
            stated = re.findall(r"(\w+) has (\d+) \w+ and (\d+) \w+\.", doc["question"])
            assert len(stated) == 3  # six counts stated, two of them needed
            owners = [n for n, *_ in stated]
            first, second = doc["solution"].split(". ")[:2]
            assert (
                first == f"{first.split()[0]} has {x} {thing}"
                and second == f"{second.split()[0]} has {y} {thing}"
            )
            assert {first.split()[0], second.split()[0]} <= set(owners)
            assert doc["solution"].endswith(f"The answer is {doc['answer']}.")
        for doc in map(json.loads, (folder / f"page_field-{split}.jsonl").read_text().splitlines()):
            rows = re.findall(r"<tr>((?:<td>[^<]*</td>)+)</tr>", doc["page"])
            table = [re.findall(r"<td>([^<]*)</td>", r) for r in rows]
            column, director = doc["field"].split(" of the film by ")
            header = re.findall(r"<th>([^<]*)</th>", doc["page"])
            asked = [r for r in table if r[header.index("Director")] == director]
            # one row, the cell
            assert len(asked) == 1 and asked[0][header.index(column)] == doc["answer"]
            for i in range(len(header)):
                assert len({r[i] for r in table}) == len(table)  # no value twice in a column
        for doc in map(
            json.loads, (folder / f"dialogue_fact-{split}.jsonl").read_text().splitlines()
        ):
            rejected = doc["dialogue"].split("How about the ")[1].split("?")[0]
            # said, and not the rejected place
            assert doc["answer"] in doc["dialogue"] and doc["answer"] != rejected
        for doc in map(
            json.loads, (folder / f"choice_chat-{split}.jsonl").read_text().splitlines()
        ):
            # a question of the letter set's test split, its options as they stand
            source = letters[doc["id"]]
            assert source["split"] == "test" and doc["question"] == source["question"]
            assert (
                doc["choices"]["text"] == source["choices"]
                and doc["answerKey"] == "ABCD"[source["answer"]]
            )


def test_lm_eval_scores_the_book_tasks_offline_from_any_folder(
    tiny, task_manager, tmp_path, monkeypatch
):
    # data_files and utils.py are read from the YAML's folder, not from here
    monkeypatch.chdir(tmp_path)
    results = lmeval.evaluate(
        tiny, "arithmetic_words,page_field", task_manager=task_manager, log_samples=True, limit=3
    )
    assert results["n-shot"] == {"arithmetic_words": 1, "page_field": 0}
    book = lambda task, split: [
        json.loads(x)
        for x in (paths.data() / "lm_eval_tasks" / f"{task}-{split}.jsonl").read_text().splitlines()
    ]
    first = book("arithmetic_words", "train")[0]
    for task, stops, metric in (
        ("arithmetic_words", ("\n", "Question:"), "exact_match,strict-match"),
        ("page_field", ("\n", "<"), "contains,none"),
    ):
        samples = results["samples"][task]
        context, generation = samples[0]["arguments"][0]
        assert generation["until"] == list(stops) and generation["do_sample"] is False
        doc = book(task, "test")[samples[0]["doc_id"]]
        assert context == (
            f"Question: {first['question']}\nAnswer: {first['solution']}\n\n"
            if task == "arithmetic_words"
            else ""
            # a worked example first; SWDE's none
        ) + (
            f"Question: {doc['question']}\nAnswer:"
            if task == "arithmetic_words"
            else f"{doc['page']}\n\n{doc['field']}:"
        )
        assert not any(stop in s["resps"][0][0] for s in samples for stop in stops)
        assert results["results"][task][metric] == pytest.approx(
            np.mean([s[metric.split(",")[0]] for s in samples])
        )
    # The scoring as lm-eval's GSM8K and SWDE score: the answer after "The answer is", the answer anywhere
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter

    config = lmeval.read_task_yaml(lmeval.book_tasks()["arithmetic_words"])
    extract = RegexFilter(
        **{k: v for k, v in config["filter_list"][0]["filter"][0].items() if k != "function"}
    )
    settings = {
        k: v
        for k, v in config["metric_list"][0].items()
        if k not in ("metric", "aggregation", "higher_is_better")
    }
    said = extract.apply(
        [
            ["Ana has 12 pears. Ben has 7 pears. 12 + 7 = 19. The answer is 19. The answer is 1"],
            ["12 + 7 = 19, so 20"],
        ],
        [{}, {}],
    )
    assert [x[0] for x in said] == ["19.", "[invalid]"]  # the first answer said; none said is wrong
    target = " Ana has 12 pears. Ben has 7 pears. 12 + 7 = 19. The answer is 19."
    assert exact_match_hf_evaluate(["19."], [target], **settings)["exact_match"] == 1.0
    assert exact_match_hf_evaluate(["18."], [target], **settings)["exact_match"] == 0.0
    contains = lmeval.read_task_yaml(lmeval.book_tasks()["dialogue_fact"])["process_results"]
    assert contains({"answer": "3"}, [" 3 o'clock"]) == {"contains": 1}
    assert contains({"answer": "park"}, [" The Park."]) == {"contains": 1}
    assert contains({"answer": "park"}, [" the market"]) == {"contains": 0}
