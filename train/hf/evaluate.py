"""lm-evaluation-harness on our models: ``evaluate(path, tasks)`` runs lm-eval's ``HFLM``.

``path`` is a run directory (model and tokenizer from its checkpoint) or a transformers directory (ours from
``hybrid-export``, or any causal LM ``AutoModelForCausalLM`` opens offline). Tasks are lm-eval task names;
``include_path`` adds a folder of task YAML files (e.g. a local jsonl multiple-choice task, as in the tests).
"""
from __future__ import annotations

from pathlib import Path

from ..checkpoint import has_checkpoint


def load_for_eval(path, device: str = "cpu"):
    """(transformers model, fast tokenizer) for a run directory or a transformers directory."""
    import hybrid.models.hf  # noqa: F401 - registers our classes with the Auto factories

    path = Path(path)
    if has_checkpoint(path):
        from ..inference import load_run
        from .export import hf_model_from_run
        from .tokenizer import to_hf_tokenizer

        run = load_run(path, device=device)
        return hf_model_from_run(run), to_hf_tokenizer(run.tokenizer)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"path: expected a run directory (checkpoint/) or a transformers directory "
                                f"(config.json), got {path}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return model, tokenizer


def evaluate(path, tasks: list[str], *, include_path=None, device: str = "cpu", batch_size: int = 1,
             limit: int | None = None, num_fewshot: int | None = None, max_length: int | None = None,
             log_samples: bool = False) -> dict:
    """lm-eval's output for ``tasks`` on the model at ``path``: ``out["results"][task][metric]``, and with
    ``log_samples`` the per-document requests and responses in ``out["samples"][task]``."""
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise ImportError(f"hybrid-eval needs lm-eval: pip install -e '.[eval]' in the hybrid checkout ({e})") from None
    model, tokenizer = load_for_eval(path, device)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size, device=device,
              max_length=max_length)
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                   num_fewshot=num_fewshot, log_samples=log_samples)
