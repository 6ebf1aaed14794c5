"""What every run config is (``RunConfig``): a flat record of options, each checked by its declaration as the config
is built, read from and written to a plain dict (``train_config.json``, a checkpoint's record, a ``--config`` file).

    config = TrainConfig.from_dict(json.loads(Path("runs/x/train_config.json").read_text()))
    config.replace(steps=4000).to_dict()

``from_dict`` and ``replace`` refuse unknown fields in one line naming the config (``KIND``) and the fields it knows.
A run kind adds the rules that tie its fields together in ``_check`` (``warmup`` at most ``steps``, …), and names
``FIXED``: the fields that define a run, which a resumed run may not change (``hybrid.train.loop.resume``),
``CHANGEABLE``: the ones it may (every field is one or the other, or ``out``), and ``OPTIMISER``: those of them a
note names when they change.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

__all__ = ["RunConfig"]


class RunConfig:
    """Mixed into a run config dataclass whose fields are options (``hybrid.train.options.fields``)."""

    KIND: ClassVar[str]  # how errors name it: "train config", "distill config"
    FIXED: ClassVar[tuple[str, ...]] = ()
    OPTIMISER: ClassVar[tuple[str, ...]] = ()
    CHANGEABLE: ClassVar[tuple[str, ...] | None] = None  # what a resume may change; None: every field not FIXED

    @classmethod
    def changeable(cls) -> tuple[str, ...]:
        """The fields a resumed run may change (``CHANGEABLE``, else every field but ``FIXED`` and ``out``)."""
        if cls.CHANGEABLE is not None:
            return cls.CHANGEABLE
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in (*cls.FIXED, "out"))

    def __post_init__(self):
        for f in dataclasses.fields(self):
            declared = f.metadata.get("option")
            if declared is not None and declared.check is not None:
                setattr(self, f.name, declared.check(f.name, getattr(self, f.name)))
        self._check()

    def _check(self) -> None:
        """The rules between fields (each field alone is checked by its declaration)."""

    @classmethod
    def _unknown(cls, names) -> list[str]:
        return sorted(set(names) - {f.name for f in dataclasses.fields(cls)})

    @classmethod
    def from_dict(cls, d: dict):
        if not isinstance(d, dict):
            raise ValueError(f"{cls.KIND}: expected a dict, got {type(d).__name__}")
        unknown = cls._unknown(d)
        if unknown:
            known = sorted(f.name for f in dataclasses.fields(cls))
            raise ValueError(f"{cls.KIND}: unknown field(s) {unknown}; known fields are {known}")
        return cls(**d)

    def replace(self, **overrides):
        unknown = self._unknown(overrides)
        if unknown:
            raise ValueError(f"{self.KIND}: unknown field(s) {unknown}")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict:
        """Plain values only (it is stored in checkpoints, which are read with ``weights_only=True``): tuples as
        lists."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

