"""The toy zoo: its tasks are what they say, training is deterministic and learns, the
distilled student starts from its teacher, and the shipped checkpoints reproduce their records."""

import json
import shutil

import numpy as np
import pytest
import torch

import helpers
from helpers import synthetic, zoo


def test_kv_gold_is_the_value_on_the_queried_line():
    b = synthetic.kv(50, 6, np.random.default_rng(0))
    for i in range(len(b)):
        ids = b.ids[i, : int(b.at[i]) + 1].tolist()
        key = ids[-3:-1]
        lines = [ids[1 + 5 * j : 6 + 5 * j] for j in range(6)]
        (line,) = [l for l in lines if l[:2] == key]
        assert line[3] == int(b.target[i]) and [l[3] for l in lines] == b.choices[i].tolist()


def test_kv_training_rows_supervise_each_earlier_lookup():
    b = synthetic.kv(8, 4, np.random.default_rng(1), queries=3)
    for i in range(len(b)):
        positions = (b.inline[i] >= 0).nonzero().flatten().tolist()
        assert len(positions) == 2
        for p in positions:
            assert b.ids[i, p] == synthetic.SEP and b.ids[i, p + 1] == b.inline[i, p]


def test_mcq_gold_option_is_the_only_unmarked_one():
    b = synthetic.mcq(50, 5, np.random.default_rng(0))
    for i, item in enumerate(synthetic.items(b)):
        seg = synthetic.segments(item)
        assert seg.target == int(b.gold[i])
        ids = b.ids[i, : len(seg)].numpy()
        marked = [bool(np.isin(ids[seg.segment == s], synthetic.MARKS).any()) for s in range(5)]
        assert marked == [s != int(b.gold[i]) for s in range(5)]
        letters = [ids[seg.segment == s][0] for s in range(5)]
        assert letters == b.choices[i].tolist() and seg.role[-1] == "query"
        assert all(seg.role[e] == "end" for e in seg.ends)


def test_bad_sizes_and_task_names_say_the_range():
    with pytest.raises(ValueError, match="2..8"):
        synthetic.mcq(1, 9, np.random.default_rng(0))
    with pytest.raises(ValueError, match="kv, mcq, knowledge"):
        synthetic.make("copy", 1, 2, np.random.default_rng(0))
    with pytest.raises(KeyError, match="toy-mamba2"):
        zoo.recipe("toy-rwkv")


def test_toy_items_tokenize_back_to_the_batch_and_score_an_oracle_perfectly():
    """The toy tokenizer turns each Item back into the batch's ids, and the book's scorer gives
    a model that puts its logit on the gold token accuracy 1 (and 0 when told another gold)."""
    b = synthetic.mcq(40, 4, np.random.default_rng(2))
    items = synthetic.items(b)
    tok = synthetic.tokenizer()
    for i, item in enumerate(items):
        assert tok.encode(item.pairs[0][0]) == b.ids[i, : int(b.at[i]) + 1].tolist()
        assert [tok.encode(c) for _, c in item.pairs] == [[int(t)] for t in b.choices[i]]

    class Oracle(torch.nn.Module):
        """Its next-token logit at every position is the gold token of the row's item."""

        def __init__(self, gold_tokens):
            super().__init__()
            self.gold, self.dummy = gold_tokens, torch.nn.Parameter(torch.zeros(1))

        @property
        def base_model(self):
            return self

        def forward(self, input_ids):
            # A row of pads only fills a batch to its fixed height (`packing.batches`): any token will do.
            rows = torch.tensor(
                [self.gold.get(tuple(r[r != synthetic.PAD].tolist()), 0) for r in input_ids]
            )
            hidden = (
                torch.nn.functional.one_hot(rows, synthetic.VOCAB_SIZE)
                .float()[:, None]
                .expand(-1, input_ids.shape[1], -1)
            )
            return type("Out", (), {"last_hidden_state": hidden})

        def get_output_embeddings(self):
            return torch.nn.Identity()

    key = lambda i: tuple(b.ids[i, : int(b.at[i]) + 1].tolist())
    oracle = Oracle({key(i): int(b.target[i]) for i in range(len(b))})
    assert helpers.score(oracle, tok, items).acc == 1.0
    wrong = [helpers.Item(it.pairs, (it.gold + 1) % 4) for it in items]
    assert helpers.score(oracle, tok, wrong).acc == 0.0


def test_the_transformers_convolution_is_causal():
    torch.manual_seed(0)
    model = zoo.build_model(zoo.recipe("toy-transformer")).eval()
    ids = synthetic.kv(2, 4, np.random.default_rng(0)).ids
    changed = ids.clone()
    changed[:, 10:] = synthetic.WORDS[0]
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("name", ["toy-transformer", "toy-mamba2", "toy-hybrid"])
def test_training_is_deterministic_and_seeded(name, tmp_path):
    weights = {}
    for run, seed in [("a", 0), ("b", 0), ("c", 1)]:
        zoo.build(name, tmp_path / run, seed=seed, steps=3, n_final=8, progress=False)
        weights[run] = (tmp_path / run / f"{name}.safetensors").read_bytes()
    assert weights["a"] == weights["b"] and weights["a"] != weights["c"]


def test_training_lowers_the_loss():
    torch.manual_seed(0)
    model = zoo.build_model(zoo.recipe("toy-transformer"))
    with zoo.one_thread():
        curve = zoo.train(model, 60, seed=0, every=20, n_probe=16, progress=False)
    assert curve[-1]["loss"] < 0.9 * curve[0]["loss"]


def test_student_starts_from_its_teacher_and_distills_end_to_end(tmp_path):
    zoo.build("toy-transformer", tmp_path, steps=2, n_final=8, progress=False)
    rec = zoo.build("toy-student", tmp_path, steps=4, n_final=8, progress=False)
    assert [c["stage"] for c in rec["curve"]][-1] == 2
    teacher, student = zoo.load("toy-transformer", tmp_path), zoo.load("toy-student", tmp_path)
    t, s = teacher.model.model, student.model.backbone
    assert torch.equal(s.layers[1].mlp.down_proj.weight, t.layers[1].mlp.down_proj.weight)
    assert torch.equal(s.embedding.weight[: synthetic.VOCAB_SIZE], t.embed_tokens.weight)
    assert not torch.equal(
        s.layers[0].mixer.in_proj.weight,
        zoo.build_model(zoo.recipe("toy-student")).backbone.layers[0].mixer.in_proj.weight,
    )
    b = synthetic.mcq(4, 3, np.random.default_rng(0))
    with helpers.swap_layers(student, teacher, list(range(zoo.TEACHER_LAYERS))):
        swapped = student.model(input_ids=b.ids).logits
    assert torch.allclose(swapped, teacher.model(input_ids=b.ids).logits, atol=1e-5)


def test_every_shipped_checkpoint_is_the_file_its_record_describes():
    for name in zoo.RECIPES:
        about = json.loads((zoo.checkpoints() / f"{name}.json").read_text())
        assert about["sha256"] == zoo.digest(name), name


def test_a_changed_checkpoint_no_longer_matches_its_record(tmp_path):
    shutil.copy(zoo.checkpoints() / "toy-transformer.safetensors", tmp_path)
    before = zoo.digest("toy-transformer", tmp_path)
    with open(tmp_path / "toy-transformer.safetensors", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    assert zoo.digest("toy-transformer", tmp_path) != before


# Each recipe's first seed is re-measured here (a seed's other checkpoints run the same code, and
# their files are checked above against their records); the toy-zoo chapter re-measures all of
# them at full size in `make book`.
@pytest.mark.parametrize("name", [n for n in zoo.RECIPES if "-seed" not in n])
def test_shipped_checkpoint_reproduces_its_recorded_accuracies(name, monkeypatch):
    # 5,500 short items through a model of a few hundred thousand weights: at the CPU's 256
    # tokens a pass, each pass's fixed cost is most of the time (toy-rad-random0 on one thread:
    # 18.1 s, 13.4 at 1024; the Mamba toys, whose scan loops over tokens, the same)
    monkeypatch.setenv("GA_BATCH_TOKENS", "1024")
    loaded = helpers.load(name)
    rec = zoo.record(name)
    with zoo.one_thread():
        now = zoo.final_accuracies(loaded.model, rec["seed"], rec["n_final"])
    # Bit-equal on the machine that trained it; another CPU's kernels may round differently and
    # flip a near-tie, so allow two examples of 500 per cell (a wrong checkpoint misses by far more).
    assert now.keys() == rec["final"].keys()
    assert all(abs(now[k] - rec["final"][k]) <= 2 / rec["n_final"] + 1e-12 for k in now), (
        now,
        rec["final"],
    )
    assert (
        json.loads((zoo.checkpoints() / f"{name}.json").read_text())["config"]
        == zoo.recipe(name).config
    )


def test_every_recipe_is_a_loadable_model_name_and_a_missing_checkpoint_names_the_fix(tmp_path):
    assert {name for name, s in helpers.MODELS.items() if s.toy} == set(zoo.RECIPES)
    with pytest.raises(FileNotFoundError, match="python -m helpers.zoo build toy-mamba2"):
        zoo.load("toy-mamba2", tmp_path)


def test_kept_heads_compute_the_teachers_attention_with_the_other_heads_zeroed():
    teacher = helpers.load("toy-transformer")
    t = teacher.model.model
    kept = {0: [1], len(t.layers) - 2: [0, 3]}
    torch.manual_seed(0)
    student = zoo.build_model(zoo.recipe("toy-student"), zoo.kept_attention(teacher.model, kept))
    zoo.copy_kept_heads(student, teacher.model, kept)
    ids = synthetic.kv(4, 8, np.random.default_rng(0)).ids
    inputs, _, _ = zoo.teacher_states(teacher.model, ids)
    for layer, heads in kept.items():
        seen = {}
        hook = t.layers[layer].self_attn.register_forward_hook(
            lambda m, a, out: seen.update(out=out[0])
        )
        with (
            helpers.zero_heads(teacher, {layer: [h for h in range(4) if h not in heads]}),
            torch.no_grad(),
        ):
            teacher.model(input_ids=ids)
        hook.remove()
        norm = t.layers[layer].input_layernorm
        # the convolution is the kept heads'
        norm = norm[0] if isinstance(norm, torch.nn.Sequential) else norm
        with torch.no_grad():
            mine = student.backbone.layers[layer].attention(norm(inputs[layer]))
        assert torch.allclose(mine, seen["out"], atol=1e-5)
        assert not torch.allclose(mine, torch.zeros_like(mine))
    # The other layers have no attention, and the mixers start as a plain student's.
    assert [l for l, b in enumerate(student.backbone.layers) if b.attention is not None] == sorted(
        kept
    )
    torch.manual_seed(0)
    plain = zoo.build_model(zoo.recipe("toy-student")).state_dict()
    assert all(torch.equal(w, student.state_dict()[k]) for k, w in plain.items())


def test_the_head_rules_rank_a_planted_head_first_and_random_draws_differ(monkeypatch):
    teacher = helpers.load("toy-transformer")
    layer, head, d = 1, 2, teacher.model.config.head_dim
    keep = lambda by, draw=0: zoo.choose_heads(
        teacher, zoo.Recipe("x", "", "llamba", {}, 0, keep=1, keep_by=by, draw=draw), seed=0
    )
    site = teacher.model.model.layers[layer].self_attn.o_proj

    def planted_loss(model, batch):  # a loss that only the planted head's output lowers
        seen = {}
        hook = site.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
        model(input_ids=batch.ids)
        hook.remove()
        return -seen["x"][..., head * d : (head + 1) * d].norm()

    # every head on the first token, the planted one everywhere
    def planted_maps(model, ids, layers):
        maps = {}
        for l in layers:
            m = torch.zeros(ids.shape[0], 4, ids.shape[1], ids.shape[1])
            m[..., 0] = 1
            if l == layer:
                m[:, head] = (
                    torch.tril(torch.ones(ids.shape[1], ids.shape[1]))
                    / torch.arange(1, ids.shape[1] + 1)[:, None]
                )
            maps[l] = m
        return maps

    with monkeypatch.context() as m:
        m.setattr(zoo, "answer_loss", planted_loss)
        assert keep("G&A ranking") == {layer: [head]}
    with monkeypatch.context() as m:
        m.setattr(helpers.attention, "attention_maps", planted_maps)
        assert keep("retrieval score") == {layer: [head]}
    assert len({str(keep("random", draw)) for draw in range(4)}) > 1
    with pytest.raises(ValueError, match="keeps heads by"):
        keep("entropy")


def test_a_hybrid_that_keeps_heads_builds_loads_and_records_them(tmp_path):
    zoo.build("toy-transformer", tmp_path, steps=2, n_final=8, progress=False)
    name = next(n for n, r in zoo.RECIPES.items() if r.keep_by == "G&A ranking")
    rec = zoo.build(name, tmp_path, steps=4, n_final=8, progress=False)
    hybrid = zoo.load(name, tmp_path)
    kept = {int(l): hs for l, hs in rec["kept_attention"]["from"].items()}
    assert sum(map(len, kept.values())) == zoo.recipe(name).keep
    teacher = zoo.load("toy-transformer", tmp_path).model.model
    for l, hs in kept.items():
        d = teacher.config.head_dim
        rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in hs])
        assert torch.equal(
            hybrid.model.backbone.layers[l].attention.attn.q_proj.weight,
            teacher.layers[l].self_attn.q_proj.weight[rows],
        )
