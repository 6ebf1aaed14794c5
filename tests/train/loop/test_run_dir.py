"""The run directory a run writes in place (hybrid.train.loop.run_dir), issue 47: someone else's folder is refused
without --overwrite and keeps its files with it; an --out that is a file is one line for every command that writes
a run; a resume from an earlier checkpoint moves the abandoned branch's later checkpoints aside instead of keeping
them beside the new branch."""
import json
from pathlib import Path

import pytest

from hybrid.models import HybridConfig, HybridLM
from hybrid.train import load_checkpoint
from hybrid.train.cli.lm import train_main
from hybrid.train.lm.config import TrainConfig
from hybrid.train.loop.checkpoint import save_checkpoint
from hybrid.train.loop.run_dir import check_run_out, set_aside_later_checkpoints
from hybrid.train.output.metrics import read_metrics

TINY = ["--preset", "transformer", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--seq-len", "32",
        "--batch-size", "4", "--warmup", "1", "--eval-batches", "1", "--device", "cpu", "--quiet"]


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


# ------------------------------------------------------------------------------------- a run of ours, or not


def test_someone_elses_folder_is_refused_and_kept(tmp_path, corpus, capsys, one_line_error, one_torch_thread):
    """The issue's case: metrics.jsonl and train_config.json that no hybrid-train run wrote."""
    theirs = tmp_path / "u"
    theirs.mkdir()
    (theirs / "metrics.jsonl").write_text('{"epoch": 1, "acc": 0.5}\n')
    (theirs / "train_config.json").write_text('{"optimizer": "sgd", "epochs": 3}\n')
    before = snapshot(theirs)
    assert train_main(["--data", str(corpus), *TINY, "--steps", "1", "--out", str(theirs)]) == 2
    one_line_error(capsys, "hybrid-train", "out: expected a new or empty directory, or a run of hybrid-train",
                   "train_config.json", "--overwrite")
    assert snapshot(theirs) == before
    (theirs / "notes.txt").write_text("keep me\n")
    assert train_main(["--data", str(corpus), *TINY, "--steps", "1", "--out", str(theirs), "--overwrite"]) == 0
    assert (theirs / "notes.txt").read_text() == "keep me\n"  # --overwrite replaces a run's files, no others
    assert TrainConfig.from_dict(json.loads((theirs / "train_config.json").read_text())).steps == 1
    assert load_checkpoint(theirs).step == 1


def check_train_out(out, *, overwrite: bool) -> None:
    """hybrid-train's rule (the Trainer's call): its record is train_config.json, read back as a TrainConfig."""
    check_run_out(out, overwrite=overwrite, kind="hybrid-train", record="train_config.json",
                  reads_record=lambda text: TrainConfig.from_dict(json.loads(text)), names=("loss.png",))


def test_what_counts_as_a_run_of_ours(tmp_path):
    ours = tmp_path / "ours"  # interrupted before its first checkpoint: the same command starts it over
    ours.mkdir()
    (ours / "train_config.json").write_text(json.dumps(TrainConfig(out=str(ours)).to_dict()))
    (ours / "metrics.jsonl").write_text('{"step": 10, "loss": 3.0}\n')
    (ours / "loss.png").write_bytes(b"png")
    (ours / "checkpoint-tmp-abc").mkdir()
    check_train_out(ours, overwrite=False)
    check_train_out(tmp_path / "new", overwrite=False)
    (tmp_path / "empty").mkdir()
    check_train_out(tmp_path / "empty", overwrite=False)
    for name, files in [("notes", {"notes.txt": "x"}),
                        ("no-record", {"metrics.jsonl": "{}\n"}),  # our file names, but no record says who wrote them
                        ("not-ours", {"train_config.json": '{"lr": "fast"}'}),
                        ("mixed", {"train_config.json": json.dumps(TrainConfig().to_dict()), "data.csv": "a,b\n"})]:
        folder = tmp_path / name
        folder.mkdir()
        for file, text in files.items():
            (folder / file).write_text(text)
        with pytest.raises(ValueError, match="^out: expected a new or empty directory, or a run of hybrid-train"):
            check_train_out(folder, overwrite=False)
        check_train_out(folder, overwrite=True)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="^out: expected a directory, got the file"):
        check_train_out(tmp_path / "afile", overwrite=True)


def test_out_that_is_a_file_is_one_line_for_every_run_writer(tmp_path, capsys, one_line_error):
    """`--out somefile.txt`: named as a file, not `…/metrics.jsonl: Not a directory`."""
    from hybrid.train.cli.bench import bench_main
    from hybrid.train.cli.distill import main as distill_main
    from hybrid.train.cli.synthetic import main as synthetic_main

    somefile = tmp_path / "somefile.txt"
    somefile.write_text("mine\n")
    for prog, main, argv in [("hybrid-train", train_main, [*TINY]),
                             ("hybrid-distill", distill_main, ["--teacher", str(tmp_path / "t"), "--pattern", "R"]),
                             ("hybrid-synthetic", synthetic_main, ["--task", "parity", "--budget", "smoke"]),
                             ("hybrid-synthetic", synthetic_main, ["--suite", "mqar", "--budget", "smoke"]),
                             ("hybrid-bench", bench_main, ["--suite", "baselines"])]:
        for out in (somefile, somefile / "run"):
            assert main([*argv, "--out", str(out)]) == 2
            one_line_error(capsys, prog, "expected a directory, got the file", "somefile.txt")
    assert somefile.read_text() == "mine\n"


# ------------------------------------------------------------------------------------------ resuming a branch


def test_resuming_an_earlier_checkpoint_moves_the_later_ones_aside(corpus, tmp_path, capsys, one_torch_thread):
    out = tmp_path / "run"
    common = ["--data", str(corpus), *TINY, "--log-every", "1", "--eval-every", "0"]
    assert train_main([*common, "--steps", "6", "--save-every", "2", "--keep", "4", "--out", str(out)]) == 0
    first = {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint", "checkpoint-step-2", "checkpoint-step-4"]

    assert train_main(["--resume", str(out / "checkpoint-step-2"), "--save-every", "2", "--log-every", "1"]) == 0
    aside = out / "abandoned-after-step-2"
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint-step-4", "checkpoint-step-6", "metrics.jsonl"]
    assert [load_checkpoint(aside / f"checkpoint-step-{s}").step for s in (4, 6)] == [4, 6]  # whole, loadable
    assert max(r["step"] for r in read_metrics(aside / "metrics.jsonl")) == 6  # the abandoned branch's records
    # the run: the new branch's checkpoints and the one it started from, nothing of the old branch beside them
    new_branch = sorted(p.name for p in out.glob("checkpoint*"))
    assert new_branch == ["checkpoint", "checkpoint-step-2", "checkpoint-step-4"] and load_checkpoint(out).step == 6
    second = {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}
    assert second == first  # an exact resume: the same steps again, bit for bit on the CPU
    assert "abandoned-after-step-2" in capsys.readouterr().out  # the note says where they went

    # a second branch from the same step keeps the first abandoned branch as it was
    before = {p.name: load_checkpoint(p).step for p in aside.glob("checkpoint-step-*")}
    assert train_main(["--resume", str(out / "checkpoint-step-2"), "--steps", "3", "--save-every", "1"]) == 0
    assert sorted(p.name for p in (out / "abandoned-after-step-2-2").iterdir()) == [
        "checkpoint-step-4", "checkpoint-step-6", "metrics.jsonl"]
    assert {p.name: load_checkpoint(p).step for p in aside.glob("checkpoint-step-*")} == before
    assert load_checkpoint(out).step == 3


def test_set_aside_leaves_the_loaded_and_earlier_checkpoints(tmp_path):
    model = HybridConfig.preset("transformer", d_model=16, n_layers=1, n_heads=2, vocab_size=320)
    state = HybridLM(model).state_dict()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, model_state=state, config=model.to_dict(), optimizer_state=None,
                        scheduler_state=None, rng_state=None, data_state=None, step=step, keep=3)
    assert set_aside_later_checkpoints(tmp_path, 3, tmp_path / "checkpoint") is None  # the newest: nothing later
    folder, steps = set_aside_later_checkpoints(tmp_path, 1, tmp_path / "checkpoint-step-1")
    assert steps == [2, 3] and folder.name == "abandoned-after-step-1"
    assert sorted(p.name for p in tmp_path.glob("checkpoint*")) == ["checkpoint-step-1"]
    assert load_checkpoint(tmp_path).step == 1  # the run now opens at the checkpoint it resumes from
