"""The dict round trip that the training configs (TrainConfig, DistillConfig) share: ``from_dict`` and
``replace`` refuse unknown fields in one line naming the config (``KIND``) and the fields it knows."""
from __future__ import annotations

import dataclasses
from typing import ClassVar


class ConfigRecord:
    """Mixed into a config dataclass; ``KIND`` ("train config", "distill config") names it in errors."""

    KIND: ClassVar[str]

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
