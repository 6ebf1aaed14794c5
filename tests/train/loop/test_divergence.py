"""A diverging run never writes non-finite weights: the per-step flag and the weights are checked before every
save and log, the last good checkpoints are kept and named, a non-finite checkpoint is refused, a resume may
change the optimiser's hyper-parameters, --on-nonfinite skip drops isolated spikes, float16 needs CUDA."""
import json
import math

import pytest
import torch

from hybrid.models import HybridLM
from hybrid.train.loop import checkpoint as ck
from hybrid.train.loop.checkpoint import CheckpointError, kept_checkpoints, load_checkpoint
from hybrid.train.cli.lm import generate_main, train_main
from hybrid.train.lm.config import MAX_SKIPS_IN_A_ROW, TrainConfig
from hybrid.train.lm.inference import load_run
from hybrid.train.lm.trainer import Trainer

TINY = ["--d-model", "32", "--n-layers", "3", "--n-heads", "2", "--window", "16", "--seq-len", "32",
        "--batch-size", "4", "--eval-batches", "2", "--device", "cpu", "--eval-every", "0"]


def tiny(corpus, out, **kw) -> TrainConfig:
    base = dict(model={"d_model": 32, "n_layers": 3, "n_heads": 2, "window": 16}, data=str(corpus), seq_len=32,
                batch_size=4, steps=8, lr=1e-2, warmup=2, eval_every=0, eval_batches=2, log_every=4, save_every=2,
                out=str(out))
    return TrainConfig(**{**base, **kw})


def poison_loss_at(monkeypatch, steps, *, gradient_only: bool = False):
    """Make the training loss of the given (1-based) steps NaN, as a spike would: that step's training forward
    (one per step here: one rank, one micro-batch) returns NaN logits, hence a NaN loss and NaN gradients.
    gradient_only: the loss stays finite and only its gradient is NaN."""
    real, forwards = HybridLM.forward, [0]

    def forward(self, *args, **kwargs):
        logits, state = real(self, *args, **kwargs)
        if self.training and torch.is_grad_enabled():
            forwards[0] += 1
            if forwards[0] in steps and gradient_only:
                logits.register_hook(lambda g: torch.full_like(g, float("nan")))
            elif forwards[0] in steps:
                logits = logits * float("nan")
        return logits, state

    monkeypatch.setattr(HybridLM, "forward", forward)


def all_finite(run_dir):
    return all(bool(torch.isfinite(t).all()) for t in load_checkpoint(run_dir).model_state.values())


def test_a_nan_between_logs_never_reaches_a_checkpoint(corpus, tmp_path, monkeypatch):
    poison_loss_at(monkeypatch, {5})  # saves at 2, 4, (6); logs at 4, 8: the NaN falls between them
    out = tmp_path / "run"
    with pytest.raises(FloatingPointError) as e:
        Trainer(tiny(corpus, out), verbose=0, progress=False).fit()
    message = str(e.value)
    assert "not finite at step 5" in message and f"last good checkpoint is {out / 'checkpoint'} (step 4)" in message
    assert f"--resume {out} --lr 0.001" in message and "\n" not in message
    assert load_checkpoint(out).step == 4 and all_finite(out)
    assert [step for step, _ in kept_checkpoints(out)] == [2]  # --keep 2: checkpoint/ and one earlier
    assert all(math.isfinite(json.loads(x).get("loss", 0)) for x in (out / "metrics.jsonl").read_text().splitlines())


def test_the_cli_run_of_the_issue_exits_1_and_names_the_good_checkpoint(corpus, tmp_path, capsys):
    out = tmp_path / "R"
    code = train_main(["--data", str(corpus), *TINY, "--steps", "20", "--lr", "1e6", "--warmup", "0", "--log-every",
                       "5", "--save-every", "2", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "training diverged" in err, err
    if (out / "checkpoint").exists():
        assert all_finite(out)
        assert generate_main(["--run", str(out), "--temperature", "0", "--max-new-tokens", "5", "--device", "cpu"]) == 0


def test_nonfinite_checkpoints_are_refused_by_resume_and_generate(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    Trainer(tiny(corpus, out, steps=2), verbose=0, progress=False).fit()
    ckpt = load_checkpoint(out)
    state = dict(ckpt.model_state)
    state["embed.weight"] = state["embed.weight"].clone().fill_(float("nan"))
    ck.save_checkpoint(out, model_state=state, config=ckpt.config, optimizer_state=ckpt.optimizer_state,
                       scheduler_state=ckpt.scheduler_state, rng_state=ckpt.rng_state, data_state=ckpt.data_state,
                       step=3, extra=ckpt.extra, keep=2)
    with pytest.raises(CheckpointError, match=r"non-finite weights .*embed.weight.*earlier checkpoints: .*step 2"):
        load_run(out)
    assert load_checkpoint(out, allow_nonfinite=True).step == 3
    capsys.readouterr()  # what the first run printed: datasets' bars, unless an earlier test turned them off
    assert train_main(["--resume", str(out), "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "non-finite weights" in err
    assert generate_main(["--run", str(out), "--device", "cpu"]) == 2
    assert "non-finite weights" in capsys.readouterr().err
    # the kept checkpoint resumes, and the run goes on into the same directory
    resumed = Trainer.from_checkpoint(out / "checkpoint-step-2", steps=4, trainer_kwargs=dict(verbose=0))
    assert resumed.out == out and resumed.fit().step == 4 and load_checkpoint(out).step == 4


def test_resume_may_change_the_optimiser_and_says_so(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_main(["--data", str(corpus), *TINY, "--steps", "20", "--save-every", "4", "--out", str(out),
                       "--quiet"]) == 0
    saved = json.loads((out / "train_config.json").read_text())
    assert saved["warmup"] is None  # derived: min(100, steps // 10) = 2 for 20 steps
    # the derived warmup follows the new total (52 // 10 = 5); no "warmup: expected at most steps" error
    trainer = Trainer.from_checkpoint(out, steps=52, lr=5e-4, weight_decay=0.0, grad_clip=0.5)
    notes = " ".join(trainer.notes)
    assert "lr 0.002 -> 0.0005" in notes and "weight_decay 0.1 -> 0" in notes and "grad_clip 1 -> 0.5" in notes
    assert "warmup 2 -> 5" in notes
    trainer.verbose, trainer.progress = 0, False
    trainer.fit()
    groups = trainer.optimizer.param_groups
    assert trainer.scheduler.base_lrs == [5e-4, 5e-4] and [g["weight_decay"] for g in groups] == [0.0, 0.0]
    assert trainer.scheduler.schedule.warmup == 5 and trainer.config.grad_clip == 0.5
    assert train_main(["--resume", str(out), "--steps", "60", "--warmup", "3", "--lr", "1e-4"]) == 0
    assert "optimiser changes on resume: lr 0.0005 -> 0.0001, warmup 5 -> 3" in capsys.readouterr().out


def test_skip_drops_isolated_spikes_and_stops_on_a_streak(corpus, tmp_path, monkeypatch):
    poison_loss_at(monkeypatch, {3, 6})
    result = Trainer(tiny(corpus, tmp_path / "skip", on_nonfinite="skip", log_every=1), verbose=0,
                     progress=False).fit()
    records = [json.loads(x) for x in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("skipped")] == [3, 6]
    assert sorted(result.losses) == [1, 2, 4, 5, 7, 8] and all(math.isfinite(v) for v in result.losses.values())
    assert all_finite(tmp_path / "skip") and load_checkpoint(tmp_path / "skip").step == 8

    poison_loss_at(monkeypatch, set(range(2, 30)))
    with pytest.raises(FloatingPointError, match=rf"{MAX_SKIPS_IN_A_ROW + 1} steps in a row .*\(from step 2"):
        Trainer(tiny(corpus, tmp_path / "streak", on_nonfinite="skip", steps=12), verbose=0, progress=False).fit()
    assert all_finite(tmp_path / "streak")


def test_float16_training_is_refused_on_the_cpu_with_the_reason(corpus, tmp_path, capsys):
    assert train_main(["--data", str(corpus), *TINY, "--steps", "2", "--set", "dtype=float16", "--quiet",
                       "--out", str(tmp_path / "f16")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "float16 training needs a CUDA device" in err and "gradient scaler" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="float16 training with a GradScaler needs CUDA")
def test_float16_training_on_cuda_uses_a_grad_scaler(corpus, tmp_path):
    trainer = Trainer(tiny(corpus, tmp_path / "f16", device="cuda", steps=20, lr=1e-3,
                           model={"d_model": 32, "n_layers": 3, "n_heads": 2, "window": 16, "dtype": "float16"}),
                      verbose=0, progress=False)
    result = trainer.fit()
    assert trainer.scaler is not None and all(math.isfinite(v) for v in result.losses.values())
    assert result.losses[20] < result.losses[4]
    assert "grad_scaler" in load_checkpoint(tmp_path / "f16").extra


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_a_nonfinite_gradient_is_seen_with_clipping_on_or_off(corpus, tmp_path, monkeypatch, grad_clip):
    poison_loss_at(monkeypatch, {5}, gradient_only=True)
    out = tmp_path / "skip"
    Trainer(tiny(corpus, out, on_nonfinite="skip", log_every=1, grad_clip=grad_clip), verbose=0, progress=False).fit()
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"val_loss"' not in x]
    assert [r["step"] for r in records if r.get("skipped")] == [5]
    assert all(math.isfinite(r["grad_norm"]) for r in records if not r.get("skipped"))  # recorded, clipping or not
    assert all_finite(out) and load_checkpoint(out).step == 8

    poison_loss_at(monkeypatch, {5}, gradient_only=True)
    with pytest.raises(FloatingPointError, match="not finite at step 5"):
        Trainer(tiny(corpus, tmp_path / "stop", grad_clip=grad_clip), verbose=0, progress=False).fit()
    assert load_checkpoint(tmp_path / "stop").step == 4 and all_finite(tmp_path / "stop")
