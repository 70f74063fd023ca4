"""Any lm-eval task on a model of the book, under the book's own interventions.

    python -m helpers.lmeval --model smollm2-135m-instruct --tasks gsm8k,my_task.yaml \\
        --zero L16H8,L17H3 --keep-layers 0..17 --limit 50 --output results.json

`evaluate` loads the model by its registry name (`helpers.models.load`), hands lm-eval's `HFLM`
the loaded model object under an intervention spec (`helpers.specs.Spec`, the one form every
scorer and store cell takes; the flags build it: `--zero L16H8 --keep-layers 0..17` is
`"zero L16H8; keep 0..17"`), calls
`lm_eval.simple_evaluate`, and returns lm-eval's own results dict with one more entry,
`"provenance"`: the spec as run (its record and text), the model's revision, the code and package versions
(`helpers.provenance.record`). Leaving the spec puts the model back exactly.

Heads and layers are named as in the model's full layer list (`L16H22` is head 22 of layer 16
whatever else is removed); `--keep-layers` and `--remove-layers` together run the kept layers
minus the removed ones (the paper's removal from the minimal model). Bad input (an unknown
model, a head written wrongly or out of the model's range, a head in a layer that does not run,
an unknown task) fails before the model loads: shapes are checked on the model's published
config built on the meta device (`data/configs`), tasks against lm-eval's task index.

The book's own small generative tasks (`data/lm_eval_tasks`: `arithmetic_words`, `page_field`)
are taken by name too; a task YAML's relative `data_files` are read from the YAML's folder.

Not supported here: the toy zoo (a toy vocabulary, no Hugging Face tokenizer for HFLM), our own
Llamba (`helpers.llamba` is a plain torch module without transformers' `generate`), and the
attention masks of `helpers.attention` (they are built for one known sequence length, while
lm-eval batches requests of many lengths).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Sequence

from . import registry
from .errors import ConfigError, InterventionError
from .registry import Loaded
from .specs import Spec

# --- what to run ---------------------------------------------------------------------------------


# --- which models, which tasks --------------------------------------------------------------------


def check_model(name: str) -> None:
    """A registry name whose model HFLM can drive, else a ConfigError naming the fix."""
    try:
        s = registry.spec(name)
    except KeyError as e:
        raise ConfigError(f"--model: {e.args[0]}") from None
    if s.toy:
        raise ConfigError(
            f"--model {name}: the toy zoo's models read a toy vocabulary with no Hugging Face "
            "tokenizer, which lm-eval's HFLM needs; run lm-eval tasks on smollm2-135m-instruct or a "
            "paper model, and score the toys with helpers.evaluate"
        )
    if s.ours:
        raise ConfigError(
            f"--model {name}: the book's Llamba (helpers.llamba) is a plain torch module without "
            "transformers' generate() and .device, which lm-eval's HFLM needs; score it with "
            "helpers.evaluate, or run lm-eval on a transformers model"
        )


def shape_model(name: str):
    """The model's published config as a model on the meta device (no weights, no memory): what
    the interventions check heads and layers against before the real model loads."""
    import torch

    from .models import model_from_config, paper_config

    with torch.device("meta"):
        return model_from_config(paper_config(name))


def book_tasks() -> dict[str, Path]:
    """The book's own small tasks in lm-eval's format (`data/lm_eval_tasks`), by task name."""
    from . import paths

    return {p.stem: p for p in sorted((paths.data() / "lm_eval_tasks").glob("*.yaml"))}


def read_task_yaml(path: Path) -> dict:
    """A task YAML as lm-eval's own loader reads it, with relative `data_files` read from the
    YAML's folder (as lm-eval reads `include:` and `!function`), not from the working directory."""
    from lm_eval.tasks._yaml_loader import load_yaml

    config = load_yaml(path, resolve_func=True)
    kwargs = config.get("dataset_kwargs") or {}
    files = kwargs.get("data_files")
    if files is None:
        return config
    here = lambda f: f if "://" in f or Path(f).is_absolute() else str(path.parent.resolve() / f)
    if isinstance(files, str):
        files = here(files)
    elif isinstance(files, dict):
        files = {
            split: here(f) if isinstance(f, str) else [here(x) for x in f]
            for split, f in files.items()
        }
    else:
        files = [here(f) for f in files]
    return {**config, "dataset_kwargs": {**kwargs, "data_files": files}}


def task_manager_for(tasks: str | Sequence[str]):
    """lm-eval's TaskManager for `tasks`: without lm-eval's own index where every task is the
    book's own or a YAML path (`resolve_tasks` reads those itself), since building that index
    reads some 14,000 YAML files (8 s here) for names that are never looked up."""
    from lm_eval.tasks import TaskManager

    ours = book_tasks()
    return TaskManager(
        include_defaults=not all(
            t in ours or t.endswith((".yaml", ".yml")) for t in task_names(tasks)
        )
    )


def task_names(tasks: str | Sequence[str]) -> list[str]:
    """The task names of a comma-joined string or a list, stripped, empty ones dropped."""
    return [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]


def resolve_tasks(tasks: str | Sequence[str], task_manager) -> list:
    """lm-eval task names (checked against lm-eval's index), the book's own tasks by name
    (`book_tasks`) and paths to task YAMLs, comma-joined or listed, as `simple_evaluate` takes them."""
    given = task_names(tasks)
    if not given:
        raise ConfigError(
            "--tasks is empty: name lm-eval tasks (e.g. gsm8k,arc_challenge) or task YAML files"
        )
    ours = book_tasks()
    out: list = []
    for task in given:
        if task.endswith((".yaml", ".yml")) or task in ours:
            path = ours[task] if task in ours else Path(task).expanduser()
            if not path.is_file():
                raise ConfigError(
                    f"--tasks: no task file {task!r} (a name ending in .yaml is read as a path)"
                )
            try:
                out.append(read_task_yaml(path))
            except Exception as e:  # a YAML error or a !function that does not import
                raise ConfigError(f"--tasks: lm-eval cannot read {task}: {e}") from e
            continue
        matched = task_manager.match_tasks([task])
        if not matched:
            close = difflib.get_close_matches(task, [*ours, *task_manager.all_tasks], n=5)
            hint = f"; close names: {', '.join(close)}" if close else ""
            raise ConfigError(
                f"--tasks: lm-eval knows no task {task!r}{hint} (`lm-eval ls tasks` lists them all; "
                f"the book's own: {', '.join(ours)}; a local task is given by the path of its .yaml)"
            )
        out += matched
    return out


# --- the run ---------------------------------------------------------------------------------------


def evaluate(
    model: str | Loaded,
    tasks: str | Sequence[str],
    spec: Spec | str | None = None,
    *,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 8,
    log_samples: bool = False,
    apply_chat_template: bool = False,
    device: str | None = None,
    task_manager=None,
    **simple_evaluate_kwargs,
) -> dict:
    """lm-eval's results for `tasks` on `model` (a registry name, or a model already loaded with
    `helpers.load`) under an intervention, a `specs.Spec` or its text (`"zero L16H22,L17H24;
    keep 0..17; remove 16"`: heads zeroed, layers kept and/or removed). Everything that can be checked is checked
    before a named model loads. The result is `lm_eval.simple_evaluate`'s dict plus
    `"provenance"`; with `log_samples`, lm-eval's per-item records are in `"samples"`."""
    # The cheap checks first: a mistyped head fails in well under a second.
    if isinstance(model, str):
        check_model(model)
    spec = Spec.parse(spec).plain()
    for name, value, low in (
        ("limit", limit, 0),
        ("num_fewshot", num_fewshot, 0),
        ("batch_size", batch_size, 1),
    ):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value is not None and (
            not number or value < low or (name != "limit" and not isinstance(value, int))
        ):
            kind = "number" if name == "limit" else "integer"
            raise ConfigError(
                f"{name} must be a{'n' if kind == 'integer' else ''} {kind} >= {low}, got {value!r}"
            )

    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from . import provenance

    if isinstance(model, str):
        try:
            spec.check(shape_model(model))
        except InterventionError as e:  # the interventions' own message, with the valid range
            raise InterventionError(f"{model}: {e}") from None
    task_manager = task_manager or task_manager_for(tasks)
    resolved = resolve_tasks(tasks, task_manager)
    if isinstance(model, str):
        from .models import load

        model = load(model, device=device)
    spec.check(model.model)  # the loaded model itself, before lm-eval starts
    lm = HFLM(
        pretrained=model.model,
        tokenizer=model.tokenizer,
        batch_size=batch_size,
        device=str(next(model.model.parameters()).device),
    )
    with spec.applied(model.model):
        results = simple_evaluate(
            lm,
            tasks=resolved,
            num_fewshot=num_fewshot,
            limit=limit,
            task_manager=task_manager,
            log_samples=log_samples,
            apply_chat_template=apply_chat_template,
            **simple_evaluate_kwargs,
        )
    parameters = {
        "intervention": spec.record(),
        "tasks": list(tasks.split(",") if isinstance(tasks, str) else tasks),
        "limit": limit,
        "num_fewshot": num_fewshot,
        "batch_size": batch_size,
        "apply_chat_template": apply_chat_template,
    }
    results["provenance"] = provenance.record([model], parameters)
    # the harness that computed these numbers
    results["provenance"]["versions"]["lm-eval"] = version("lm-eval")
    return results


def write(results: dict, path: str | Path) -> None:
    """The results as JSON, with lm-eval's own conversion of what JSON cannot hold (dtypes, numpy)."""
    from lm_eval.utils import handle_non_serializable

    Path(path).write_text(
        json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False)
    )


# --- the command line ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m helpers.lmeval",
        description="Run lm-eval tasks on a model of the book with heads zeroed and/or layers removed. "
        "Heads and layers are numbered as in the full model.",
        epilog="example: python -m helpers.lmeval --model smollm2-135m-instruct --tasks my_task.yaml "
        "--zero L16H8 --limit 20 --output results.json",
    )
    p.add_argument("--model", required=True, help="a registry name (helpers.registry.MODELS)")
    p.add_argument(
        "--tasks",
        required=True,
        help="lm-eval task names and/or paths to task YAMLs, comma-separated",
    )
    p.add_argument("--zero", default="", help="heads to zero, e.g. L16H22,L17H24")
    p.add_argument(
        "--keep-layers", default=None, help="run only these layers, e.g. 0..17 (the minimal model)"
    )
    p.add_argument("--remove-layers", default=None, help="skip these layers, e.g. 16 or 16,17")
    p.add_argument(
        "--limit", type=float, default=None, help="items per task (a fraction if below 1)"
    )
    p.add_argument(
        "--num-fewshot", type=int, default=None, help="few-shot examples (default: each task's own)"
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--apply-chat-template",
        action="store_true",
        help="format prompts with the tokenizer's chat template",
    )
    p.add_argument(
        "--device", default=None, help="where a paper model runs (default: GA_DEVICE, else cuda)"
    )
    p.add_argument(
        "--log-samples", action="store_true", help="keep lm-eval's per-item records in the output"
    )
    p.add_argument(
        "--output", default=None, help="write the results (with provenance) to this JSON file"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    limit = (
        None
        if args.limit is None
        else int(args.limit)
        if args.limit >= 1 and args.limit.is_integer()
        else args.limit
    )
    try:
        results = evaluate(
            args.model,
            args.tasks,
            Spec.of(args.zero, args.keep_layers, args.remove_layers),
            limit=limit,
            num_fewshot=args.num_fewshot,
            batch_size=args.batch_size,
            log_samples=args.log_samples,
            apply_chat_template=args.apply_chat_template,
            device=args.device,
        )
    except (ConfigError, InterventionError) as e:
        print(f"python -m helpers.lmeval: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        from .models import ModelUnavailable  # imported only now: torch is loaded by then anyway

        # weights or a GPU missing: its message names the fix
        if not isinstance(e, ModelUnavailable):
            raise
        print(f"python -m helpers.lmeval: error: {e}", file=sys.stderr)
        return 2
    from lm_eval.utils import make_table

    print(make_table(results))
    print("intervention:", results["provenance"]["parameters"]["intervention"]["text"])
    if args.output:
        write(results, args.output)
        print(f"results written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
