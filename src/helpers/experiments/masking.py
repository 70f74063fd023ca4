"""Masking the Gather and Aggregate heads to the hypothesised patterns (the paper's Fig. 6, §4.3).

If retrieval runs through the two heads, each needs nothing but its pattern: the Gather head
reading only inside each segment, the Aggregate head reading only the segments' last tokens from
the final position. Restrict them to that (per prompt, from its segments) and accuracy should
be kept; restrict them to a control pattern (the complement) and it should fall, below the
hypothesised pattern. Zeroing each head says how much the model needs it at all.

Every condition runs in the keep-only minimal model: the minimal model's layers, and in the
roles' layers every head but G and A zeroed (Table 1's "only G and A kept"). In the whole model
other heads stand in for a masked one, so a mask would keep accuracy whatever the head does. On
the CPU profile the model is the letter model (`registry.cast(profile, "letters")`) on the book's letter set,
with the minimal model and the roles of the head-zeroing chapter (its screen, `head_screen.screen`,
through its results stores: one role assignment for both pages), scored on the head-zeroing check's
prompts, disjoint from the screen's prompts on which the roles were named. On the paper profiles
the minimal model is the published one and the heads the paper's.

Masks act before the softmax (the allowed positions are renormalised); SSM heads are masked
through their materialised hidden attention (`attention.mask_attention`). Every condition is
scored on the same prompts, so each comparison is a paired test on the prompts' correctness.
Masks differ per prompt, so prompts run one at a time, every masked condition from one cached
residual stream below the masked layers.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field

import pandas as pd
import torch

from .. import benchmarks as bm
from .. import registry
from .. import verdicts as v
from ..attention import mask_attention
from ..engine import SweepEngine
from ..errors import ConfigError
from ..evaluate import from_loglikelihoods
from ..heads import Head
from ..packing import ONE_ROW
from ..protocol import base, checks, fields, head_screen, loading, minimal, shared, stores
from ..protocol.roles import ROLE_NAMES, Roles, check_pair, check_roles_of, find_roles, with_closest
from ..reference import paper, paper_heads
from ..segments import aggregate_pattern, gather_pattern
from ..specs import Spec
from ..stats import Score, difference
from ..sweep import sweep

PATTERN = {"G": gather_pattern, "A": aggregate_pattern}
BOTH = "G and A"


@dataclass(frozen=True)
class Condition:
    # role -> restricted to its control pattern (True) or to its pattern (False)
    masked: dict[str, bool]
    zeroed: str | None = None  # role whose heads are zeroed

    @property
    def kind(self) -> str:
        if self.zeroed:
            return "head zeroed"
        if not self.masked:
            return "no mask"
        return "control pattern" if any(self.masked.values()) else "hypothesised pattern"


CONDITIONS = {
    "no mask": Condition({}),
    "G: gather pattern": Condition({"G": False}),
    "A: aggregate pattern": Condition({"A": False}),
    "G and A: both patterns": Condition({"G": False, "A": False}),
    "G: control pattern": Condition({"G": True}),
    "A: control pattern": Condition({"A": True}),
    "G and A: control patterns": Condition({"G": True, "A": True}),
    "G zeroed": Condition({}, "G"),
    "A zeroed": Condition({}, "A"),
}
PATTERN_OF = {"G": "G: gather pattern", "A": "A: aggregate pattern", BOTH: "G and A: both patterns"}
CONTROL_OF = {
    "G": "G: control pattern",
    "A": "A: control pattern",
    BOTH: "G and A: control patterns",
}
N_CPU = 100  # the CPU profile's prompts per condition


@dataclass(frozen=True)
class Config(base.Config):
    models: tuple[str, ...] = fields.models("attention", "ssm")
    # one model only; None: the paper's, or by behaviour
    gather: tuple[Head, ...] | None = fields.heads(optional=True)
    aggregate: tuple[Head, ...] | None = fields.heads(optional=True)
    task: str = fields.one_of("kv", "mmlu")
    n: int = fields.count()  # prompts, the same under every condition
    kv_pairs: int = fields.count()
    kv_query: str = fields.one_of("paper", "repeat")
    seed: int = fields.seed()

    chapter = "masking"
    smoke_sizes = dict(n=3)

    @classmethod
    def defaults(cls, profile):
        if profile == "cpu":
            # The letter model on `n` of the head-zeroing check's prompts (`head_screen.check_part`).
            return dict(
                models=[registry.cast(profile, "letters")],
                gather=None,
                aggregate=None,
                task="mmlu",
                n=N_CPU,
                kv_pairs=8,
                kv_query="repeat",
                seed=0,
            )
        return dict(
            models=registry.cast_of(profile, ("llamba", "llama")),
            gather=None,
            aggregate=None,
            task="mmlu",
            n=500,
            kv_pairs=8,
            kv_query="paper",
            seed=0,
        )

    def __post_init__(self):
        super().__post_init__()
        check_pair(self.gather, self.aggregate)
        if self.gather is not None and len(self.models) > 1:
            raise ConfigError(
                f"gather and aggregate name the heads of one model; models lists {len(self.models)}: "
                "list one model, or leave the heads to None (each model's own)"
            )
        for name in self.models:  # every model, from its config, before the first one runs
            check_roles_of(name, self.gather, self.aggregate)
            if self.task == "kv":
                checks.check_kv_sizes(name, "kv_pairs", [self.kv_pairs])
        checked = check_questions(self.profile, self.smoke)
        if checked and any(uses_head_zeroing(self, m) for m in self.models) and self.n > checked:
            raise ConfigError(
                f"n must be at most the {checked} questions head zeroing checks its roles on "
                f"(its n_check on the {self.profile} profile), got {self.n}"
            )


def check_questions(profile: str, smoke: bool) -> int | None:
    """How many questions head zeroing measures its roles on at least (the prompts masked here):
    its smoke size, its floor on the CPU profile (it checks as many as its claims need), None on
    the paper profiles (the rest of MMLU)."""
    if smoke:
        return head_screen.ScreenConfig.smoke_sizes["n_check"]
    n = head_screen.ScreenConfig.defaults(profile)["n_check"]
    return head_screen.CHECK_FLOOR if n is None and profile == "cpu" else n


@dataclass(frozen=True)
class ModelRun:
    model: str
    roles: Roles
    benchmark: str
    chance: float
    scores: dict[str, Score]  # condition -> accuracy, every condition on the same prompts
    layers: int = 0  # the minimal model's layers, where every condition runs
    n_layers: int = 0  # the whole model's
    minimal: str = ""  # where the minimal model comes from
    # the roles' layers' other heads (keep-only)
    others_zeroed: dict[int, list[int]] = field(default_factory=dict)

    def keep_only(self) -> str:
        """The model every condition runs in, as a sentence."""
        kept = (
            ", ".join(f"L{l}: {len(hs)} other heads zeroed" for l, hs in self.others_zeroed.items())
            or "no head zeroed"
        )
        return f"layers 0-{self.layers - 1} of {self.n_layers} ({self.minimal}); {kept}"


@dataclass(frozen=True)
class Result:
    cfg: Config
    runs: tuple[ModelRun, ...]
    provenance: dict


def benchmark(cfg: Config, model: str, tokenizer) -> bm.Benchmark:
    """The prompts every condition is scored on: KV prompts the head ranking did not see, or
    MMLU questions."""
    if cfg.task == "kv":
        skip = shared.ranking_settings(cfg.profile, cfg.smoke)["n"]
        return shared.held_out_kv(
            model, tokenizer, cfg.n, skip, cfg.kv_pairs, cfg.seed, cfg.kv_query
        )
    return shared.mmlu(cfg, model, tokenizer, cfg.n)


def masked_loglikelihoods(
    loaded,
    b: bm.Benchmark,
    patterns,
    within: Spec = Spec(),
) -> list:
    """Each prompt's choices' log-likelihoods when heads may attend only where a per-prompt
    pattern allows: what `segments.score_with_patterns` computes (tested), through the sweep
    engine, one prompt at a time. There a prompt's choices share one row, so a prompt costs one
    row instead of one per choice (several times fewer tokens).

    `patterns(seg) -> {(layer, head): allowed [T, T]}` covers the context's T tokens; the
    continuation tokens keep the engine's own mask (they read the context and their own
    choice), as they stay causal in `score_with_patterns`. `within`: the layers run and the
    heads zeroed besides (default: the model as it is)."""
    return masked_runs(loaded, b, {"": patterns}, within)[""]


def masked_runs(
    loaded,
    b: bm.Benchmark,
    by_condition: dict,
    within: Spec = Spec(),
) -> dict[str, list]:
    """`masked_loglikelihoods` for several named pattern functions at once: per prompt, the
    residual stream below the lowest masked or zeroed layer is computed once and every
    condition runs the layers above it (tested equal to running each condition alone)."""
    zeroed = within.ablation
    out = {name: [] for name in by_condition}
    for item in b.items:
        engine = SweepEngine(loaded, loaded.tokenizer, [item], batch_tokens=ONE_ROW)
        seg, width = b.segments(item), engine.rows.ids.shape[1]
        run = within.check(engine.adapter)
        for name, patterns in by_condition.items():
            masks = patterns(seg)
            scales = head_scales(engine.adapter, zeroed, {l for l, _ in masks})
            with ExitStack() as stack:
                for (layer, head), pattern in masks.items():
                    allowed = torch.ones(width, width, dtype=torch.bool)
                    allowed[: len(seg), : len(seg)] = pattern
                    stack.enter_context(mask_attention(loaded, layer, [head], allowed))
                # The cached stream lies below the first layer in `scales`, so no mask acts on it.
                with torch.inference_mode():
                    out[name].append(engine.scaled_loglikelihoods(scales, run)[0].numpy())
    return out


def head_scales(adapter, zeroed: dict[int, list[int]], masked: set[int]) -> dict[int, torch.Tensor]:
    """The engine's head-site scales ([1, heads * head_dim] per layer): 0 for the `zeroed` heads,
    1 elsewhere; every masked layer among them, so that the engine recomputes it."""
    scales = {}
    for layer in sorted(set(zeroed) | masked):
        keep = torch.ones(1, adapter.n_heads(layer))
        keep[0, adapter.check_heads(layer, zeroed.get(layer, []))] = 0
        scales[layer] = keep.repeat_interleave(adapter.head_dim(layer), dim=1)
    return scales


def others_zeroed(roles: Roles, n_heads) -> dict[int, list[int]]:
    """Table 1's "only G and A kept": every other head of the roles' layers, zeroed."""
    keep = {h for hs in roles.heads.values() for h in hs}
    return {
        l: [h for h in range(n_heads(l)) if Head(l, h) not in keep]
        for l in sorted({h.layer for h in keep})
    }


def scores(
    loaded,
    b: bm.Benchmark,
    heads: dict[str, tuple[Head, ...]],
    within: Spec,
) -> dict[str, Score]:
    """Every condition's accuracy in the keep-only model (`within`: the layers run, the other
    heads zeroed), the roles' heads `heads` (role -> heads, a `Roles`' heads): the unmasked ones
    batched, the masked ones prompt by prompt from one cached stream each."""
    engine = SweepEngine(loaded, loaded.tokenizer, b.items)
    plain = {
        name: within.zeroing(*(heads[c.zeroed] if c.zeroed else ()))
        for name, c in CONDITIONS.items()
        if not c.masked
    }
    out = engine.score_each(plain)
    masked = {
        name: (
            lambda seg, c=c: {
                (h.layer, h.head): PATTERN[r](seg, control)
                for r, control in c.masked.items()
                for h in heads[r]
            }
        )
        for name, c in CONDITIONS.items()
        if c.masked
    }
    lls = masked_runs(loaded, b, masked, within)
    out |= {name: from_loglikelihoods(lls[name], b.items) for name in masked}
    return {name: out[name] for name in CONDITIONS}


def measure_conditions(cell: dict) -> dict:
    """Every condition on the cell's items in the keep-only model (`within`, a spec's text: the
    minimal model's layers, every other head of the roles' layers zeroed), the roles' heads "G"
    and "A" (lists of heads as text): {condition: score} (a measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    heads = {r: tuple(map(Head.parse, cell[r])) for r in ROLE_NAMES}
    b = bm.from_spec(cell["items"], loaded.tokenizer)
    found = scores(loaded, b, heads, Spec.parse(cell["within"]))
    return {k: s.to_json() for k, s in found.items()}


def uses_head_zeroing(cfg: Config, model: str) -> bool:
    """Letter selection on a model with no published heads or minimal model: the minimal model and
    roles are the head-zeroing chapter's (the layer-pruning chapter's minimal model; the roles
    found on its screen's prompts)."""
    return (
        cfg.task == "mmlu"
        and cfg.gather is None
        and paper_heads(model) is None
        and minimal.published_minimal(model) is None
    )


def run_model(cfg: Config, model: str, timer: base.Timer) -> tuple[ModelRun, dict]:
    loaded = loading.load(model)
    n_layers = loaded.adapter.n_layers
    if uses_head_zeroing(cfg, model):
        zcfg = head_screen.ScreenConfig.for_profile(
            cfg.profile, cfg.smoke, model=model, task="mmlu", seed=cfg.seed
        )
        found = head_screen.screen(zcfg, loaded)
        roles, kept = with_closest(found.roles), found.layers_kept
        b = head_screen.check_part(found.check, cfg.n, cfg.seed)
        where = "the layer-pruning chapter's, as in the head-zeroing chapter"
    else:
        roles = with_closest(
            find_roles(
                loaded,
                cfg.profile,
                cfg.smoke,
                cfg.gather,
                cfg.aggregate,
                seed=cfg.seed,
                measure=False,
            )
        )
        b = benchmark(cfg, model, loaded.tokenizer)
        published = minimal.published_minimal(model)
        kept, where = (
            (published, "the published minimal model")
            if published
            else (n_layers, "the whole model")
        )
    if bad := [h for hs in roles.heads.values() for h in hs if h.layer >= kept]:
        raise ConfigError(
            f"heads {', '.join(map(str, bad))} lie above the minimal model's layers 0..{kept - 1}"
        )
    keep = others_zeroed(roles, loaded.adapter.n_heads)
    store = stores.open_store(cfg.chapter, cfg.profile, "conditions", [loaded], measure_conditions)
    cell = dict(
        model=model,
        benchmark=b.name,
        items=b.spec,
        **{r: list(map(str, hs)) for r, hs in roles.heads.items()},
        within=str(Spec(zero=keep, keep_layers=range(kept))),
    )
    row = sweep(store, [cell], measure_conditions, desc=f"{model}: conditions")[0]
    by_condition = {c: Score.from_json(row[c]) for c in CONDITIONS}
    return (
        ModelRun(model, roles, b.name, b.chance, by_condition, kept, n_layers, where, keep),
        base.record(cfg, [loaded], timer),
    )


def run(cfg: Config) -> Result:
    timer = base.Timer()
    runs, made = [], {}
    checks.check_available(cfg.models)  # every model, before the first one computes
    for model in cfg.models:  # one paper model in memory at a time
        one, record = run_model(cfg, model, timer)
        runs.append(one)
        made = {**record, **made, "models": {**made.get("models", {}), **record["models"]}}
    return Result(cfg, tuple(runs), {**made, "wall_s": timer.seconds})


# --- what it says ------------------------------------------------------------------------------


def roles_of(which: str) -> list[str]:
    return ["G", "A"] if which == BOTH else [which]


def compare(
    r: ModelRun, which: str, rule, a: str, b: str, needs_harm: bool = False
) -> tuple[str, str]:
    """One model's part of a claim about role(s) `which`: `rule(scores[a], scores[b], chance)`.
    Not testable where the model is at chance. With `needs_harm` (every claim about a role's
    masks), judged only where zeroing each role's heads lowers accuracy (`verdicts.falls`): when
    the model does not need the head at all, a mask can show neither that it needs only its
    pattern nor that another pattern breaks it. Then not testable where a role is played by the
    closest candidate only: no harmful head behaves as that role, which the roles' claim says
    once (`roles_found`), and a mask of another head says nothing about the paper's."""
    clean = r.scores["no mask"]
    if not clean.above(r.chance):
        return v.NOT_TESTABLE, (
            f"{r.model}: no mask does not clear chance ({clean}, chance {r.chance:.0%}), "
            "nothing to keep or lose"
        )
    if needs_harm:
        harm = {x: v.falls(clean, r.scores[f"{x} zeroed"], r.chance) for x in roles_of(which)}
        if idle := [x for x, (o, _) in harm.items() if o != v.REPRODUCED]:
            return v.NOT_TESTABLE, (
                f"{r.model}: zeroing {' and '.join(ROLE_NAMES[x] for x in idle)} does not "
                f"measurably lower accuracy, so a mask keeping it says nothing: "
                + "; ".join(f"{x} zeroed: {harm[x][1]}" for x in idle)
            )
    if missing := [x for x in roles_of(which) if not r.roles.filled[x]]:
        names = " or ".join(ROLE_NAMES[x] for x in missing)
        return v.NOT_TESTABLE, (
            f"{r.model}: no harmful head behaves as the {names} head (the roles' claim); the "
            f"closest, {', '.join(r.roles.label(x) for x in missing)}, stands in: {b}: {r.scores[b]} "
            f"against {a}: {r.scores[a]}"
        )
    outcome, evidence = rule(r.scores[a], r.scores[b], r.chance)
    return outcome, f"{r.model}: {evidence}"


def roles_found(r: ModelRun) -> tuple[str, str]:
    """One model's roles: played by harmful heads, or only by the closest candidate (one finding,
    `verdicts.another_mechanism`, where the model can do the task)."""
    clean = r.scores["no mask"]
    parts = []
    for x in ROLE_NAMES:
        if r.roles.filled[x]:
            parts.append((v.REPRODUCED, f"{ROLE_NAMES[x]}: {r.roles.describe(x)}"))
        elif not clean.above(r.chance):
            parts.append((v.NOT_TESTABLE, f"no mask does not clear chance ({clean})"))
        else:
            parts.append(
                v.another_mechanism(
                    ROLE_NAMES[x], r.roles.missing(x), measured=True, sure=r.roles.surely_missing(x)
                )
            )
    return v.every(o for o, _ in parts), f"{r.model}: " + "; ".join(e for _, e in parts)


def verdict(
    result: Result,
    claim: str,
    which: str,
    rule,
    a: str,
    b: str,
    needs_harm: bool = False,
    headline: bool = False,
) -> v.Verdict:
    """A claim over every model of the run (`verdicts.every`), each model's part decided by `compare`."""
    parts = [compare(r, which, rule, a, b, needs_harm) for r in result.runs]
    return v.Verdict(
        claim,
        "Fig. 6, §4.3",
        v.every(o for o, _ in parts),
        "; ".join(e for _, e in parts),
        headline=headline,
    )


def verdicts(result: Result) -> list[v.Verdict]:
    kept, falls, lower = v.kept, v.falls, lambda a, b, chance: v.lower(a, b)
    out = []
    if any(r.roles.source == "behaviour" for r in result.runs):
        parts = [roles_found(r) for r in result.runs if r.roles.source == "behaviour"]
        out.append(
            v.Verdict(
                "The masked heads are a Gather and an Aggregate head (harmful heads that behave so)",
                "Fig. 1, §3.4",
                v.every(o for o, _ in parts),
                "; ".join(e for _, e in parts),
                headline=True,
            )
        )
    for which in ("G", "A", BOTH):
        heads = f"{which} head{'s' if which == BOTH else ''}"
        out += [
            verdict(
                result,
                f"{heads} masked to the hypothesised pattern{'s' if which == BOTH else ''}: "
                "accuracy is kept",
                which,
                kept,
                "no mask",
                PATTERN_OF[which],
                needs_harm=True,
                headline=True,
            ),
            verdict(
                result,
                f"{heads} masked to the control pattern{'s' if which == BOTH else ''}: accuracy falls",
                which,
                falls,
                "no mask",
                CONTROL_OF[which],
                needs_harm=True,
            ),
            verdict(
                result,
                f"{heads}: the control scores below the hypothesised pattern",
                which,
                lower,
                PATTERN_OF[which],
                CONTROL_OF[which],
                needs_harm=True,
            ),
        ]
    for role in ROLE_NAMES:
        out.append(
            verdict(
                result,
                f"{role} head zeroed: accuracy falls",
                role,
                falls,
                "no mask",
                f"{role} zeroed",
            )
        )
    return out


def table(result: Result) -> pd.DataFrame:
    """Every model and condition: accuracy [95% interval], n, and the paired difference from no mask."""
    rows = []
    for r in result.runs:
        clean = r.scores["no mask"]
        for name, s in r.scores.items():
            rows.append(
                {
                    "model": r.model,
                    "condition": name,
                    "accuracy [95% interval]": s,
                    "n": s.n,
                    "change from no mask [95% interval]": "-"
                    if name == "no mask"
                    else difference(clean, s),
                }
            )
    return pd.DataFrame(rows)


def comparison(result: Result) -> pd.DataFrame:
    paper_row = lambda m: (
        f"G {paper('head_zeroing', 'gather_head', m).value}, "
        f"A {paper('head_zeroing', 'aggregate_head', m).value} ({m})"
    )
    rows = [
        (
            "models and heads",
            "; ".join(paper_row(m) for m in registry.cast_of("paper", ("llamba", "llama"))),
            "no masking code in the release",
            "; ".join(
                f"{r.model}: G {r.roles.describe('G')}, A {r.roles.describe('A')}"
                for r in result.runs
            ),
        ),
        (
            "where the heads are masked",
            "not stated in the sources read",
            "-",
            "; ".join(f"{r.model}: {r.keep_only()}" for r in result.runs),
        ),
        ("weights", "as published", "-", base.weights(result.provenance)),
        (
            "task",
            "MMLU (Fig. 6; not verified)",
            "-",
            f"{result.runs[0].benchmark}, n={result.runs[0].scores['no mask'].n}, seed={result.cfg.seed}",
        ),
    ]
    expected = {
        **{c: "kept (Fig. 6; not verified)" for c in PATTERN_OF.values()},
        **{c: "falls (§4.3; not verified)" for c in CONTROL_OF.values()},
    }
    for r in result.runs:
        rows += [
            (f"{r.model}: {name}", expected.get(name, "-"), "-", str(r.scores[name]))
            for name in ("no mask", *PATTERN_OF.values(), *CONTROL_OF.values())
        ]
    return base.comparison_table(rows)


def subject(result: Result) -> str:
    return f"on the {result.cfg.profile} profile, " + "; ".join(
        f"{r.model}, layers 0-{r.layers - 1}, only G {r.roles.label('G')} and A {r.roles.label('A')} kept in their layers"
        for r in result.runs
    )


COLOURS = {
    "no mask": "0.55",
    "hypothesised pattern": "tab:green",
    "control pattern": "tab:red",
    "head zeroed": "0.25",
}


def figure(result: Result):
    """Fig. 6's bars for this run: accuracy under every condition (95% intervals), one panel per
    model, chance as a labelled dotted line."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from .. import plots

    plots.style()
    fig, axes = plt.subplots(
        len(result.runs),
        1,
        figsize=(plots.WIDTH, 0.8 + 3.2 * len(result.runs)),
        squeeze=False,
        sharex=True,
    )
    for ax, r in zip(axes[:, 0], result.runs):
        names = list(r.scores)
        acc = [100 * r.scores[c].acc for c in names]
        err = [
            [100 * (r.scores[c].acc - r.scores[c].lo) for c in names],
            [100 * (r.scores[c].hi - r.scores[c].acc) for c in names],
        ]
        ax.barh(names, acc, xerr=err, color=[COLOURS[CONDITIONS[c].kind] for c in names], capsize=3)
        ax.axvline(100 * r.chance, ls=":", lw=1.5, color="0.2")
        ax.invert_yaxis()
        ax.set(xlim=(0, 100), title=f"{r.model}: G {r.roles.label('G')}, A {r.roles.label('A')}")
    axes[-1, 0].set_xlabel("accuracy (%)")
    handles = [Patch(color=c, label=k) for k, c in COLOURS.items()]
    handles.append(
        plt.Line2D([], [], ls=":", color="0.2", label=f"chance ({result.runs[0].chance:.0%})")
    )
    fig.legend(
        handles=handles, loc="lower center", ncols=3, frameon=False, bbox_to_anchor=(0.5, -0.02)
    )
    fig.tight_layout(rect=(0, 0.1 / len(result.runs), 1, 1))
    return fig
