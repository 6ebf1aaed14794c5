"""Named budgets: how big, how long and how many seeds a suite runs, printed at the start of every suite.

    budget = Budget(name="cpu", models=("transformer", "vo-rnn"), steps=500, seq_len=40, seeds=(0, 1, 2))
    budget = budget.override(steps=100, seeds=(0,))          # --steps / --seq-len / --seeds / --models
    print(budget.describe())

A suite keeps its own table of budgets (``smoke``, ``cpu``, ``gpu``); the fields every suite needs are here and
anything specific goes in ``extra``.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from hybrid.checks import check_positive_int


@dataclass(frozen=True)
class Budget:
    name: str
    models: tuple[str, ...]  # the suite's model names, in report order
    steps: int  # optimizer steps per run
    seq_len: int  # training sequence length (a suite may read it as the longest training length)
    seeds: tuple[int, ...] = (0,)
    batch_size: int = 32
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    lrs: tuple[float, ...] = (1e-3,)  # the learning-rate grid: every model runs each, the report keeps the best
    eval_size: int = 256  # evaluation sequences (or batches, as the suite defines)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        object.__setattr__(self, "lrs", tuple(float(v) for v in self.lrs))
        if not self.models:
            raise ValueError("models: expected at least one model, got none")
        if not self.seeds:
            raise ValueError("seeds: expected at least one seed, got none")
        if not self.lrs or min(self.lrs) <= 0:
            raise ValueError(f"lrs: expected positive learning rates, got {self.lrs}")
        for name in ("steps", "seq_len", "batch_size", "d_model", "n_layers", "n_heads", "eval_size"):
            check_positive_int(name, getattr(self, name))

    def override(self, *, steps=None, seq_len=None, seeds=None, models=None, known_models=None) -> "Budget":
        """This budget with the command line's overrides (None = keep). ``models`` must be among
        ``known_models`` when given (the suite's names)."""
        changes = {}
        if steps is not None:
            changes["steps"] = steps
        if seq_len is not None:
            changes["seq_len"] = seq_len
        if seeds is not None:
            changes["seeds"] = tuple(seeds)
        if models is not None:
            unknown = [m for m in models if known_models is not None and m not in known_models]
            if unknown:
                raise ValueError(f"models: expected names from {list(known_models)}, got {unknown}")
            changes["models"] = tuple(models)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One block of text: the budget's name and every field."""
        d = self.to_dict()
        lines = [f"budget {self.name!r}:"]
        for key, value in d.items():
            if key == "name" or (key == "extra" and not value):
                continue
            text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else json.dumps(value) if isinstance(value, dict) else str(value)
            lines.append(f"  {key:<11} {text}")
        return "\n".join(lines)


def parse_int_list(text: str, flag: str = "--seeds", example: str = "0,1,2") -> tuple[int, ...]:
    """``"0,1,2"`` or ``"3"`` → a tuple of ints (a comma-separated flag, ``--seeds`` by default); raises ValueError
    naming ``flag``, with ``example`` as the expected form."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values:
        raise ValueError(f"{flag}: expected comma-separated integers such as {example}, got {text!r}")
    return values


def parse_name_list(text: str) -> tuple[str, ...]:
    """``"a,b"`` → ``("a", "b")`` (the --models flag)."""
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise ValueError(f"--models: expected comma-separated model names, got {text!r}")
    return values
