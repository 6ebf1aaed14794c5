"""Passkey retrieval far beyond the training length: the task (``task``), its suites (``suites``) and the studies
behind docs/research/passkey (``reach``: how far a model retrieves; ``positions``: accuracy by key position;
``probe``: what the recurrence holds of the key)."""
from .scoring import plot_heatmap, score_passkey, score_task_json
from .task import Passkey

__all__ = ["Passkey", "plot_heatmap", "score_passkey", "score_task_json"]
