"""lm-eval itself, offline, as the reference our prompts and scores must equal."""

import importlib
import json
from pathlib import Path

import yaml


def lm_eval_tasks_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def task(yaml_path: str, rows: dict[str, list[dict]], tmp: Path, **overrides):
    """An lm-eval ConfigurableTask from one of lm-eval's own task YAMLs, reading `rows` (split
    name -> docs) from local JSON-lines files instead of the hub."""
    from lm_eval.api.task import ConfigurableTask

    cfg = yaml.load((lm_eval_tasks_dir() / yaml_path).read_text(), Loader=_Loader)
    cfg.pop("include", None)
    package = "lm_eval.tasks." + ".".join(Path(yaml_path).parent.parts)
    for key, value in cfg.items():
        if isinstance(value, _Function):
            module, name = value.rsplit(".", 1)
            cfg[key] = getattr(importlib.import_module(f"{package}.{module}"), name)
    files = {}
    for split, docs in rows.items():
        path = tmp / f"{Path(yaml_path).stem}-{split}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs))
        files[split] = str(path)
    cfg.update(
        dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": files}, **overrides
    )
    for key in ("training_split", "validation_split", "test_split", "fewshot_split"):
        if cfg.get(key) and cfg[key] not in files:
            cfg[key] = None
    return ConfigurableTask(config=cfg)


def requests(t, doc, num_fewshot: int = 0) -> list[tuple[str, str]]:
    """The (context, continuation) pairs lm-eval scores for one doc."""
    ctx = t.fewshot_context(doc, num_fewshot=num_fewshot)
    return [inst.args for inst in t.construct_requests(doc=doc, ctx=ctx, metadata=("t", 0, 1))]


class _Function(str):
    """A `!function module.name` reference of an lm-eval YAML."""


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!function", lambda loader, node: _Function(node.value))
