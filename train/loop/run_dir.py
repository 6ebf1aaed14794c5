"""The run directory a training run writes in place (``hybrid-train``, ``hybrid-distill``): what it reads, whether a
folder is a run of ours, and what a resume from an older checkpoint does with the later ones.

- **Inputs** (``run_inputs``): the paths a run reads (its data, tokenizer, the run it starts from), for the
  output-path rule (``hybrid.train.output.paths.check_apart``): the run directory may not be, hold or lie inside
  any.
- **A run of ours** (``check_run_out``): a folder that is empty, or whose every entry is a name a run writes
  (``RUN_NAMES``, ``RUN_PREFIXES`` and the run kind's own files) and whose record (``train_config.json`` for
  ``hybrid-train``) reads back as the run kind's config. Any other non-empty folder (someone else's
  ``metrics.jsonl`` and ``train_config.json``, a corpus, notes) is refused without ``--overwrite``; with it, the
  files a run writes are replaced and the others stay.
- **A resumed run's directory** (``check_resumed_run_dir``): a run resumed from a checkpoint directory named
  itself (``--resume runs/a/checkpoint-step-6``) writes in that directory's parent. The parent may hold nothing but
  what a run writes and the checkpoint, as for a fresh run without ``--overwrite``, which a resume never takes: a
  checkpoint copied among other files (``backup/mine``) is refused, never written beside them.
- **Resuming a branch** (``set_aside_later_checkpoints``): resuming from an older checkpoint
  (``--resume runs/a/checkpoint-step-6`` while ``checkpoint/`` holds step 10) starts a new branch of the run at
  step 6. The checkpoints saved after step 6 belong to the abandoned branch: they are moved, before the new branch
  writes anything, into ``abandoned-after-step-6/`` (named by their steps, with that branch's ``metrics.jsonl``),
  never deleted and never left beside the new branch's checkpoints, where the loader would take the newest for the
  run's. A second abandoned branch at the same step goes to ``abandoned-after-step-6-2/``.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from ..output.metrics import METRICS_FILE
from ..output.outdir import foreign_entries
from ..output.paths import check_not_a_file
from ..output.tracking import TENSORBOARD_DIR, WANDB_DIR
from .checkpoint import DIR, KEPT_PREFIX, OLD, TMP_PREFIX, _manifest_step, kept_checkpoints

__all__ = ["run_inputs", "check_run_out", "check_resumed_run_dir", "set_aside_later_checkpoints", "ABANDONED_PREFIX",
           "RUN_NAMES", "RUN_PREFIXES"]

ABANDONED_PREFIX = "abandoned-after-step-"
RUN_NAMES = frozenset({DIR, OLD, METRICS_FILE, METRICS_FILE + ".tmp", TENSORBOARD_DIR, WANDB_DIR})
RUN_PREFIXES = (KEPT_PREFIX, TMP_PREFIX, ABANDONED_PREFIX)
STUDY_EVAL_FILE = "eval.json"  # what the distillation study's eval writes into a run (hybrid.train.distill.bench)


def run_inputs(**named) -> list[tuple[str, Path]]:
    """``(name, path)`` for each named value that is an existing path (``run_inputs(tokenizer=...)``): a hub
    dataset name or ``"bytes"`` reads no local path."""
    out = []
    for name, value in named.items():
        if value is None:
            continue
        path = Path(os.path.expanduser(os.fspath(value)))
        if path.exists() or path.is_symlink():
            out.append((name, path))
    return out


def check_run_out(out, *, overwrite: bool, kind: str, record: str, reads_record: Callable[[str], object],
                  names=(), what: str = "out") -> None:
    """A ValueError when ``out`` is a file, or a non-empty folder that is not a run of ``kind`` (see the module:
    ``record`` its record file, ``reads_record(text)`` raises unless it is one; ``names`` the files of its own beside
    ``RUN_NAMES``) and ``overwrite`` is False."""
    check_not_a_file(what, out)
    if overwrite:
        return
    foreign = foreign_entries(out, names=RUN_NAMES | {record, *names}, prefixes=RUN_PREFIXES, record=record,
                              reads_record=reads_record)
    if foreign:
        shown = ", ".join(foreign[:4]) + (", …" if len(foreign) > 4 else "")
        raise ValueError(f"{what}: expected a new or empty directory, or a run of {kind}, got {out}, which holds "
                         f"files no {kind} run wrote ({shown}); pass --overwrite to start a run there anyway (the "
                         f"files a run writes are replaced, the others stay), or choose another directory")


def check_resumed_run_dir(checkpoint, *, kind: str, record: str, reads_record: Callable[[str], object], names=(),
                          what: str = "--resume") -> Path:
    """The run directory a run resumed from the checkpoint directory ``checkpoint`` writes to, its parent; a
    ValueError when that holds entries no run of ``kind`` writes besides ``checkpoint`` (``record``, read back by
    ``reads_record``, and ``names``: the kind's own files, as ``check_run_out``)."""
    checkpoint = Path(checkpoint)
    run_dir = checkpoint.parent
    has_record = (run_dir / record).is_file()  # a run dir of only a copied checkpoint has none yet: fine
    names = RUN_NAMES | {record, *names, checkpoint.name, STUDY_EVAL_FILE}
    foreign = foreign_entries(run_dir, names=names, prefixes=RUN_PREFIXES,
                              record=record if has_record else None, reads_record=reads_record)
    if foreign:
        shown = ", ".join(foreign[:4]) + (", …" if len(foreign) > 4 else "")
        raise ValueError(f"{what}: expected a checkpoint in a {kind} run directory, got {checkpoint}, whose directory "
                         f"{run_dir} (where the resumed run would write) holds files no {kind} run wrote ({shown}); "
                         f"copy the checkpoint into a directory of its own, e.g. NEW/{DIR}, and resume NEW")
    return run_dir


def _unique(path: Path) -> Path:
    n, candidate = 2, path
    while candidate.exists():
        candidate = path.with_name(f"{path.name}-{n}")
        n += 1
    return candidate


def set_aside_later_checkpoints(run_dir, step: int, loaded) -> tuple[Path, list[int]] | None:
    """Move the checkpoints of ``run_dir`` saved after ``step`` (all but ``loaded``, the one resumed from) into
    ``abandoned-after-step-STEP/``, with a copy of the metrics; (that folder, their steps), or None when there were
    none (see the module)."""
    run_dir, loaded = Path(run_dir), Path(loaded).resolve()
    candidates = [run_dir / DIR, run_dir / OLD] + [p for _, p in kept_checkpoints(run_dir)]
    later = []
    for path in candidates:
        if path.is_dir() and path.resolve() != loaded:
            saved = _manifest_step(path)
            if saved > step:
                later.append((saved, path))
    if not later:
        return None
    folder = _unique(run_dir / f"{ABANDONED_PREFIX}{step}")
    folder.mkdir()
    if (run_dir / METRICS_FILE).is_file():  # the abandoned branch's records; the run's file is cut at `step`
        shutil.copy2(run_dir / METRICS_FILE, folder / METRICS_FILE)
    for saved, path in sorted(later):
        os.replace(path, _unique(folder / f"{KEPT_PREFIX}{saved}"))
    return folder, sorted(saved for saved, _ in later)
