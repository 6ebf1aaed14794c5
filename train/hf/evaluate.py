"""lm-evaluation-harness on our models: ``evaluate(path, tasks)`` runs lm-eval's ``HFLM``.

``path`` is a run directory (model and tokenizer from its checkpoint) or a transformers directory (ours from
``hybrid-export``, or any causal LM ``AutoModelForCausalLM`` opens offline). Tasks are lm-eval task names;
``include_path`` adds a folder of task YAML files (e.g. a local jsonl multiple-choice task, as in the tests).
"""
from __future__ import annotations

import difflib
import logging
from pathlib import Path

from ..loop.checkpoint import has_checkpoint


def load_for_eval(path, device: str = "cpu"):
    """(transformers model, fast tokenizer) for a run directory or a transformers directory."""
    import hybrid.models.hf  # noqa: F401 - registers our classes with the Auto factories

    path = Path(path)
    if has_checkpoint(path):
        from ..lm.inference import load_run
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


class _DropWarning(logging.Filter):
    """Drops one message of a logger: lm-eval warns on every HFLM made from a model object, which is the way its
    own documentation gives for a model already in memory (ours, built from a run directory). Nothing the user
    can act on, so that one warning is not shown; every other message of the logger is."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


_PRETRAINED_NOT_STR = "`pretrained` model kwarg is not of type `str`"


def check_include_path(include_path) -> None:
    """A ValueError unless ``include_path`` is None or an existing directory (lm-eval ignores a missing one)."""
    if include_path is not None and not Path(include_path).is_dir():
        what = "a file" if Path(include_path).exists() else "no such directory"
        raise ValueError(f"include_path: expected a directory of lm-eval task YAML files, got {include_path} ({what})")


def check_tasks(manager, tasks: list[str], include_path=None) -> None:
    """A ValueError naming every task that ``manager`` (an lm-eval TaskManager) does not know, with the
    nearest names it does know; a path to a task YAML file is a task too."""
    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known and not Path(t).is_file()]
    if not unknown:
        return
    near = sorted({m for t in unknown for m in difflib.get_close_matches(t, known, n=3, cutoff=0.8)})
    where = f"the tasks of lm-eval and of --include-path {include_path}" if include_path else (
        "the tasks of lm-eval (a task of your own needs --include-path DIR, its YAML folder)")
    raise ValueError(f"tasks: expected names from {where}, got unknown {', '.join(map(repr, unknown))}"
                     + (f"; did you mean {', '.join(near)}?" if near else "; `lm-eval ls tasks` lists them"))


def import_lm_eval():
    """``(lm_eval, HFLM, TaskManager)``, imported on first use; an ImportError that says how to install lm-eval."""
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise ImportError(f"hybrid-eval needs lm-eval: pip install 'hybrid-lm[eval]' (or -e '.[eval]' in the "
                          f"checkout) ({e})") from None
    return lm_eval, HFLM, TaskManager


def task_manager(tasks: list[str], include_path=None):
    """lm-eval's TaskManager with ``include_path``, after checking the path and that it knows every task."""
    check_include_path(include_path)
    _, _, TaskManager = import_lm_eval()
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    check_tasks(manager, tasks, include_path)
    return manager


def evaluate(path, tasks: list[str], *, include_path=None, device: str = "cpu", batch_size: int = 1,
             limit: int | None = None, num_fewshot: int | None = None, max_length: int | None = None,
             log_samples: bool = False) -> dict:
    """lm-eval's output for ``tasks`` on the model at ``path``: ``out["results"][task][metric]``, and with
    ``log_samples`` the per-document requests and responses in ``out["samples"][task]``.

    The include path and the task names are checked before the model is loaded (a ValueError names them)."""
    check_include_path(include_path)  # before lm-eval's slow import and task index
    lm_eval, HFLM, _ = import_lm_eval()
    manager = task_manager(tasks, include_path)
    model, tokenizer = load_for_eval(path, device)
    hf_logger = logging.getLogger("lm_eval.models.huggingface")
    quiet = _DropWarning(_PRETRAINED_NOT_STR)
    hf_logger.addFilter(quiet)
    try:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size, device=device,
                  max_length=max_length)
    finally:
        hf_logger.removeFilter(quiet)
    return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                   num_fewshot=num_fewshot, log_samples=log_samples)
