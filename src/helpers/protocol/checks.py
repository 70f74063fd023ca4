"""Checks of a config against the model its run will load, read from the model's config alone
(`shape`: no weights read): layers and heads in range, dictionary sizes its KV task can draw, a
toy refused where a chapter needs words, a paper model available here."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterable

from .. import registry
from ..errors import ConfigError
from ..heads import Head


def shape(name: str):
    """An adapter of model `name` built on the meta device from its config alone: its layers and
    heads are the model's, it holds no weights and allocates nothing. The config is the toy
    zoo's recipe, SmolLM2's GGUF header, or a paper model's config.json from the local hub cache
    (what `load` would load), else its published one in data/configs."""
    s = registry.spec(name)
    return _shape(name, None if s.toy or s.profile == "cpu" else _cached_config_file(s.hub_id))


def _cached_config_file(repo: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, "config.json")
    return found if isinstance(found, str) else None


@lru_cache(maxsize=None)
def _shape(name: str, config_file: str | None):
    """`shape`, once per model and config file (another hub cache, another snapshot: read again)."""
    import torch

    from .. import models, zoo
    from ..adapters import adapter_for
    from ..progress import quiet

    s = registry.spec(name)
    with torch.device("meta"):
        if s.toy:
            return zoo.adapter_of(zoo.recipe(name), zoo.build_model(zoo.recipe(name)))
        with quiet():
            if s.gguf:
                config = _packaged_config(name)
            elif config_file is not None:  # read as `load` reads it: ours by our config class
                from transformers import AutoConfig

                from ..llamba import LlambaConfig

                config = (LlambaConfig if s.ours else AutoConfig).from_pretrained(
                    Path(config_file).parent
                )
            else:
                config = models.paper_config(name)
        return adapter_for(models.model_from_config(config))


def _packaged_config(name: str):
    from .. import models

    return models.packaged_config(name)


def check_layers_of(
    model: str, name: str, layers: Iterable[int] | None, below: int | None = None
) -> None:
    """Every layer in `layers` (the parameter `name`) is one of `model`'s (and below `below`,
    e.g. the layers a run keeps)."""
    n = shape(model).n_layers if below is None else min(below, shape(model).n_layers)
    if bad := [l for l in layers or () if l >= n]:
        kept = f" of the {n} it runs" if below is not None and below < shape(model).n_layers else ""
        raise ConfigError(
            f"{name}: {model} has no layer {', '.join(map(str, bad))}{kept}: its layers are 0..{n - 1}"
        )


def check_heads_of(
    model: str,
    name: str,
    heads: Iterable[Head] | None,
    paper: bool = False,
    below: int | None = None,
) -> None:
    """Every head in `heads` is one of `model`'s (in its first `below` layers, when given). With
    `paper`, the heads are the paper's, used because the parameter `name` was left unset: the
    message says to set it (and its partner) to heads of this model."""
    from ..errors import InterventionError

    adapter = shape(model)
    n_layers = adapter.n_layers if below is None else min(below, adapter.n_layers)
    for h in heads or ():
        try:
            if h.layer >= n_layers:
                raise InterventionError(
                    f"its layers are 0..{n_layers - 1}"
                    if n_layers == adapter.n_layers
                    else f"of its {adapter.n_layers} layers the run keeps 0..{n_layers - 1}"
                )
            adapter.check_heads(h.layer, [h.head])
        except InterventionError as e:
            why = str(e).split(": ", 1)[-1]
            if paper:
                raise ConfigError(
                    f"the paper's heads for {model} include {h}, which {model} does not have ({why}): "
                    f"set gather and aggregate to heads of this model (with papermill: -y 'gather: "
                    f"[L1H0]' -y 'aggregate: [L2H0]')"
                ) from None
            raise ConfigError(f"{name}: {model} has no {adapter.head_kind} {h} ({why})") from None


def kv_limit(model: str) -> int:
    """The most keys a KV dictionary of `model`'s task holds: one distinct value each (the toy
    zoo's token task has 32 values, the release's prompt the numbers 0-99)."""
    from .. import synthetic
    from ..reference import paper

    return (
        synthetic.N_VALUES
        if registry.spec(model).toy
        else len(paper("kv_retrieval", "value_range").integers)
    )


def check_kv_sizes(model: str, name: str, sizes: Iterable[int]) -> None:
    """Dictionary sizes (the parameter `name`) that `model`'s KV task can draw."""
    most = kv_limit(model)
    if bad := [k for k in sizes if k > most]:
        raise ConfigError(
            f"{name}: a KV dictionary for {model} holds at most {most} keys (one distinct value each); "
            f"got {', '.join(map(str, bad))}"
        )


def refuse_toy(chapter: str, name: str, model: str) -> None:
    """A chapter scored on MMLU and the knowledge tasks cannot run a toy model, which speaks only
    the zoo's token tasks: say so by name, with the models it can run."""
    if registry.spec(model).toy:
        usable = [
            n
            for n in registry.names()
            if not registry.spec(n).toy and registry.spec(n).mixer != "hybrid"
        ]
        raise ConfigError(
            f"{name}: {chapter} scores MMLU and the knowledge tasks, which the toy model {model} does "
            f"not read (it speaks only the zoo's token tasks; see the toy_zoo chapter); use one of "
            f"{', '.join(usable)}"
        )


def check_available(names: Iterable[str]) -> None:
    """Every paper model of a multi-model run can load here (in the local hub cache when offline;
    a GPU with room when on one), checked before the first one computes; CPU-tier models ship
    with the package."""
    from .. import models

    for name in dict.fromkeys(names):
        s = registry.spec(name)
        if s.profile != "cpu":
            device = models.paper_device()
            models.check_paper_model(s, device, models.paper_dtype(device))
