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
from ..parallel.device import check_device, resolve_device

MIN_MAX_LENGTH = 2  # the shortest input worth scoring: one token of context, one of continuation


def load_for_eval(path, device: str = "cpu"):
    """(transformers model, fast tokenizer) for a run directory or a transformers directory."""
    import hybrid.models.hf  # noqa: F401 - registers our classes with the Auto factories

    path = Path(path)
    check_model_path(path)
    if has_checkpoint(path):
        from ..lm.inference import load_run
        from .export import hf_model_from_run
        from .tokenizer import to_hf_tokenizer

        run = load_run(path, device=device)
        return hf_model_from_run(run), to_hf_tokenizer(run.tokenizer)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return model, tokenizer


def check_model_path(path) -> None:
    """A FileNotFoundError unless ``path`` is a run directory (checkpoint/) or a transformers one (config.json)."""
    path = Path(path)
    if not has_checkpoint(path) and not (path / "config.json").is_file():
        raise FileNotFoundError(f"path: expected a run directory (checkpoint/) or a transformers directory "
                                f"(config.json), got {path}")


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


def check_eval_options(device: str, max_length: int | None, num_fewshot: int | None) -> str:
    """The torch device name ``device`` resolves to ("auto": CUDA when there is one), after checking it and
    ``max_length`` / ``num_fewshot``: a ValueError naming the option, before lm-eval starts (where each would be
    a bare AssertionError)."""
    check_device("device", device)
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                   or max_length < MIN_MAX_LENGTH):
        raise ValueError(f"max_length: expected an integer >= {MIN_MAX_LENGTH} (a token of context and one to "
                         f"score), got {max_length!r}")
    if num_fewshot is not None and (isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int)
                                    or num_fewshot < 0):
        raise ValueError(f"num_fewshot: expected an integer >= 0, got {num_fewshot!r}")
    return str(resolve_device(device))  # a CUDA device this machine lacks: one line now


def checked_lm(HFLM):
    """``HFLM`` whose requests are checked against ``max_length`` before the model scores any: a continuation
    longer than it, or a generation budget that leaves no room for the prompt, is a ValueError naming
    --max-length (lm-eval itself asserts, deep in its loop)."""

    class CheckedLM(HFLM):
        def _loglikelihood_tokens(self, requests, *args, **kwargs):
            longest = max((len(r[2]) for r in requests), default=0)
            if longest > self.max_length:
                raise ValueError(f"max_length: expected at least the {longest} tokens of the tasks' longest "
                                 f"continuation, got {self.max_length} (--max-length)")
            return super()._loglikelihood_tokens(requests, *args, **kwargs)

        def generate_until(self, requests, *args, **kwargs):
            for request in requests:
                options = request.args[1] if len(request.args) > 1 and isinstance(request.args[1], dict) else {}
                wanted = int(options.get("max_gen_toks", self.max_gen_toks))
                if self.max_length - wanted < 1:
                    raise ValueError(f"max_length: expected more than the {wanted} tokens the task generates, got "
                                     f"{self.max_length} (--max-length)")
            return super().generate_until(requests, *args, **kwargs)

    return CheckedLM


def evaluate(path, tasks: list[str], *, include_path=None, device: str = "auto", batch_size: int = 1,
             limit: int | None = None, num_fewshot: int | None = None, max_length: int | None = None,
             log_samples: bool = False) -> dict:
    """lm-eval's output for ``tasks`` on the model at ``path``: ``out["results"][task][metric]``, and with
    ``log_samples`` the per-document requests and responses in ``out["samples"][task]``.

    The device, ``max_length``, ``num_fewshot``, the model's path, the include path and the task names are checked
    before the model is loaded (a ValueError names them); ``device`` "auto" is CUDA when there is one."""
    device = check_eval_options(device, max_length, num_fewshot)
    check_include_path(include_path)  # before lm-eval's slow import and task index
    check_model_path(path)
    lm_eval, HFLM, _ = import_lm_eval()
    HFLM = checked_lm(HFLM)
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
