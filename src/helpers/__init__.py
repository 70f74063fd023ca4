"""Helpers for the G&A companion: models, interventions, tasks, scoring, sweeps and plots.

The names below are the ones a chapter or a reader at a prompt reaches for; every module is
also importable on its own (`helpers.engine`, `helpers.screen`, `helpers.experiments.<chapter>`).
"""

import warnings

from tqdm.std import TqdmWarning

# huggingface_hub imports tqdm.auto, which warns in a kernel without ipywidgets; the book's own
# bars never use it (`helpers.progress`), so the warning would only be noise on every page.
warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)

from .adapters import Adapter, adapter_for
from .errors import ConfigError, InterventionError
from .attention import attention_maps, mask_attention, mask_last_row
from .evaluate import choice_loglikelihoods, mean_over_tasks, score
from .heads import Head
from .interventions import keep_layers, prune_top, remove_layers, swap_layers, zero_heads
from .models import ModelUnavailable, load, paper_config
from .registry import MODELS, Loaded
from .stats import Score, wilson
from .tasks import Item, kv_items, load_knowledge, load_mmlu

__all__ = [
    "Adapter", "adapter_for", "ConfigError", "InterventionError",
    "attention_maps", "mask_attention", "mask_last_row",
    "choice_loglikelihoods", "mean_over_tasks", "score",
    "Head",
    "keep_layers", "prune_top", "remove_layers", "swap_layers", "zero_heads",
    "ModelUnavailable", "load", "paper_config",
    "MODELS", "Loaded",
    "Score", "wilson",
    "Item", "kv_items", "load_knowledge", "load_mmlu",
]
