"""What a resumed run may change (hybrid.train.loop.resume), issue 47: every flag a resume cannot honour is refused
in one line and changes nothing (--init-from among them: a resumed run starts from its own checkpoint), every
field of a run config is either fixed or changeable, and docs/training.md's "Resume" lists exactly what the code
lets change."""
import dataclasses
import re
from pathlib import Path

import pytest

from hybrid.models import HybridConfig, HybridLM
from hybrid.train import Trainer
from hybrid.train.cli.lm import train_main, train_parser
from hybrid.train.data.tokenizer import ByteTokenizer
from hybrid.train.distill.config import DistillConfig
from hybrid.train.lm.config import TrainConfig
from hybrid.train.loop.checkpoint import capture_rng_state, save_checkpoint
from hybrid.train.loop.resume import resume_config

DOCS = Path(__file__).resolve().parents[3] / "docs" / "training.md"
FIXED, CHANGEABLE = TrainConfig.FIXED, TrainConfig.CHANGEABLE


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def fake_run(path: Path, **config) -> Path:
    """A resumable run's checkpoint (its record only: resume's checks come before any weight is read)."""
    model = HybridConfig.preset("transformer", d_model=16, n_layers=1, n_heads=2, vocab_size=320)
    train_config = TrainConfig(preset="transformer", out=str(path), steps=4, **config)
    save_checkpoint(path, model_state=HybridLM(model).state_dict(), config=model.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=2,
                    extra={"train_config": train_config.to_dict(), "global_batch": 16,
                           "tokenizer": ByteTokenizer().to_dict()})
    return path


# a value other than fake_run's for every field a resume may not change, as a flag
REFUSED_FLAGS = {
    "preset": ["--preset", "retnet"], "size": ["--size", "small"], "model": ["--window", "8"],
    "data": ["--data", "elsewhere"], "text_column": ["--text-column", "body"],
    "skip_rows_without_text": ["--skip-rows-without-text"], "tokenizer": ["--tokenizer", "tok.json"],
    "valid_fraction": ["--valid-fraction", "0.2"], "seq_len": ["--seq-len", "64"], "packing": ["--packing", "stream"],
    "seed": ["--seed", "3"], "min_lr_ratio": ["--min-lr-ratio", "0.5"], "betas": ["--betas", "0.8", "0.9"],
    "init_from": ["--init-from", "runs/elsewhere"], "init_partial": ["--init-partial"],
}
# a new value for every field a resume may change
CHANGED = {"steps": 10, "lr": 1e-3, "warmup": 1, "weight_decay": 0.0, "grad_clip": 0.5, "batch_size": 8,
           "grad_accum": 2, "eval_every": 1, "eval_batches": 1, "log_every": 1, "save_every": 1, "keep": 3,
           "on_nonfinite": "skip", "log": ["tensorboard"], "device": "cpu", "compile": True, "fsdp": True, "cp": 2}


def test_every_field_is_either_fixed_or_changeable_on_resume():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(FIXED) | set(CHANGEABLE) | {"out"} == fields and not set(FIXED) & set(CHANGEABLE)
    assert set(REFUSED_FLAGS) == set(FIXED) and set(CHANGED) == set(CHANGEABLE)


@pytest.mark.parametrize("field", sorted(FIXED))
def test_resume_refuses_every_flag_it_cannot_honour(field, tmp_path, capsys, one_line_error):
    run = fake_run(tmp_path / "run")
    before = snapshot(run)
    assert train_main(["--resume", str(run), *REFUSED_FLAGS[field], "--quiet"]) == 2
    one_line_error(capsys, "hybrid-train", f"{field}: cannot change when resuming")
    assert snapshot(run) == before


def test_resume_refuses_overwrite_and_another_out(tmp_path, capsys, one_line_error):
    run = fake_run(tmp_path / "run")
    assert train_main(["--resume", str(run), "--overwrite"]) == 2
    one_line_error(capsys, "hybrid-train", "--overwrite and --resume contradict each other")
    assert train_main(["--resume", str(run), "--out", str(tmp_path / "other")]) == 2
    one_line_error(capsys, "hybrid-train", "name different run directories")


def test_resume_takes_every_change_it_may_honour(tmp_path):
    run = fake_run(tmp_path / "run", init_from=None)
    for field, value in CHANGED.items():
        trainer = Trainer.from_checkpoint(run, world_size=1, **{field: value})
        assert getattr(trainer.config, field) == value, field
    same = {name: getattr(TrainConfig(preset="transformer"), name) for name in FIXED}  # repeating a value is fine
    Trainer.from_checkpoint(run, world_size=1, **same)


def test_resume_compares_model_fields_not_their_spellings(tmp_path, capsys, one_line_error):
    """The issue: a run made with --set attention.window=16, resumed with --window 16, was "model: cannot change"."""
    run = fake_run(tmp_path / "run", model={"attention.window": 16, "recurrence": {"selective": True}})
    for same in ({"window": 16}, {"attention": {"window": 16}}, {"rnn_selective": True, "attention.window": 16}):
        trainer = Trainer.from_checkpoint(run, world_size=1, model=same)
        assert trainer.config.model == {"attention.window": 16, "recurrence": {"selective": True}}
    for other in ({"window": 8}, {"rnn_selective": False}, {"attention": {"window": 8}}):
        with pytest.raises(ValueError, match=r"^model: cannot change when resuming"):
            Trainer.from_checkpoint(run, world_size=1, model=other)
    assert train_main(["--resume", str(run), "--window", "8", "--quiet"]) == 2
    one_line_error(capsys, "hybrid-train", "model: cannot change when resuming")


def flags_in(sentence: str) -> set[str]:
    return set(re.findall(r"`(--[a-z-]+)`", sentence))


def test_the_resume_docs_list_what_the_code_lets_change():
    """docs/training.md, "Resume": its "May change" and "Refused" lists are the code's CHANGEABLE and FIXED."""
    section = DOCS.read_text().split("## Resume", 1)[1].split("\n## ", 1)[0]
    may = flags_in(section.split("**May change:**", 1)[1].split("- **Refused**", 1)[0])
    refused = flags_in(section.split("- **Refused**", 1)[1].split("\n\n", 1)[0])
    dest = {a.option_strings[-1]: a.dest for a in train_parser()._actions if a.option_strings}
    model_flags = {"--pattern", "--d-model", "--n-layers", "--n-heads", "--window", "--set"}
    assert {dest[f] for f in may} == set(CHANGEABLE)
    assert {"model" if f in model_flags else dest[f] for f in refused} == set(FIXED) | {"overwrite", "out"}
    shown = {f for f in dest if f not in ("--help", "--config", "--resume", "--quiet", "--threads")}
    assert shown == may | refused  # every flag is in one list or the other


def test_a_distillation_may_change_every_field_it_does_not_fix():
    """DistillConfig names no CHANGEABLE: every field but FIXED and out (its teacher among them: it may have moved)."""
    config = DistillConfig(teacher="t", pattern="R")
    changeable = set(config.changeable())
    assert changeable | set(config.FIXED) | {"out"} == {f.name for f in dataclasses.fields(config)}
    assert "teacher" in changeable and "skip_rows_without_text" in config.FIXED
    with pytest.raises(ValueError, match=r"^skip_rows_without_text: cannot change when resuming"):
        resume_config(config, saved_global_batch=16, world_size=1, out="o", skip_rows_without_text=True)
    resumed, _ = resume_config(config, saved_global_batch=16, world_size=1, out="o", teacher="moved", steps=300)
    assert (resumed.teacher, resumed.steps) == ("moved", 300)
