"""Helpers for the G&A companion: models, interventions, tasks, scoring, sweeps and plots."""

from .attention import attention_maps, mask_attention, mask_last_row
from .adapters import Adapter, InterventionError, adapter_for
from .evaluate import Score, choice_loglikelihoods, loglikelihoods, mean_of_tasks, mean_over_tasks, score, score_by_depth, wilson
from .interventions import keep_layers, prune_top, remove_layers, swap_layers, zero_heads
from .models import MODELS, Loaded, ModelUnavailable, default_model, load, paper_config
from . import segments
from .tasks import Item, kv_items, load_knowledge, load_mmlu

__all__ = [
    "attention_maps", "mask_attention", "mask_last_row",
    "Adapter", "InterventionError", "adapter_for",
    "Score", "choice_loglikelihoods", "loglikelihoods", "mean_of_tasks", "mean_over_tasks", "score", "score_by_depth", "wilson",
    "keep_layers", "prune_top", "remove_layers", "swap_layers", "zero_heads",
    "MODELS", "Loaded", "ModelUnavailable", "default_model", "load", "paper_config",
    "Item", "kv_items", "load_knowledge", "load_mmlu",
]
