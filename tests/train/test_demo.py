"""The demo (hybrid.train.demo) replaces its own earlier run, never a run it did not write or one trained on."""
import json
import re

import pytest

from hybrid.train.demo import MARK, RECIPE, check_replaceable
from hybrid.train.lm.config import TrainConfig


def demo_dir(path, **recorded):
    """A demo's run directory as the demo leaves it, its recorded config changed by ``recorded``."""
    path.mkdir()
    config = TrainConfig(out=str(path), **RECIPE).to_dict()
    (path / MARK).write_text(json.dumps(config))
    (path / "train_config.json").write_text(json.dumps({**config, **recorded}))
    return path


def test_the_demo_replaces_nothing_but_its_own_run(tmp_path):
    check_replaceable(tmp_path / "new", overwrite=False)
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty", overwrite=False)
    check_replaceable(demo_dir(tmp_path / "demo"), overwrite=False)
    check_replaceable(demo_dir(tmp_path / "shorter", steps=900), overwrite=False)  # a slow machine's shorter run
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    for path, holds in [(tmp_path / "mine", "files the demo did not write"),
                        (demo_dir(tmp_path / "resumed", steps=2400),
                         r"a run trained on from the demo's \(to 2400 steps\)"),
                        (demo_dir(tmp_path / "other", lr=1e-3), r"a run of another config \(over a demo's\)")]:
        with pytest.raises(ValueError, match=rf"^--out: expected no directory or an earlier demo's run \(or "
                                             rf"--overwrite\), got {re.escape(str(path))}, which holds {holds}$"):
            check_replaceable(path, overwrite=False)
        check_replaceable(path, overwrite=True)
