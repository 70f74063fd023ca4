"""Helpers for the G&A companion: models, interventions, tasks, scoring, sweeps and plots.

The names below are the ones a chapter or a reader at a prompt reaches for; every module is
also importable on its own (`helpers.engine`, `helpers.screen`, `helpers.experiments.<chapter>`).
They are imported on first use, so that `import helpers` (and every `python -m helpers.<x> --help`
or refused argument) answers without loading torch and transformers.
"""

import importlib
import warnings

from tqdm.std import TqdmWarning

# huggingface_hub imports tqdm.auto, which warns in a kernel without ipywidgets; the book's own
# bars never use it (`helpers.progress`), so the warning would only be noise on every page.
warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)

# name -> the module that defines it
_HOME = {
    "Adapter": "adapters",
    "adapter_for": "adapters",
    "ConfigError": "errors",
    "InterventionError": "errors",
    "attention_maps": "attention",
    "mask_attention": "attention",
    "mask_last_row": "attention",
    "choice_loglikelihoods": "evaluate",
    "mean_over_tasks": "evaluate",
    "score": "evaluate",
    "Head": "heads",
    "keep_layers": "interventions",
    "prune_top": "interventions",
    "remove_layers": "interventions",
    "swap_layers": "interventions",
    "zero_heads": "interventions",
    "ModelUnavailable": "models",
    "load": "models",
    "paper_config": "models",
    "Spec": "specs",
    "MODELS": "registry",
    "Loaded": "registry",
    "Score": "stats",
    "wilson": "stats",
    "Item": "tasks",
    "kv_items": "tasks",
    "load_knowledge": "tasks",
    "load_mmlu": "tasks",
}

__all__ = list(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
        globals()[name] = value  # once: later lookups do not come back here
        return value
    raise AttributeError(f"module 'helpers' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_HOME])
