"""Checkpoints: exact round trips, atomic saves (torn writes, killed savers), refusal of bad checkpoints."""
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import hybrid.train.loop.checkpoint as ck
from hybrid.train.loop.checkpoint import (
    CheckpointError,
    capture_rng_state,
    has_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from hybrid.train.loop.schedule import warmup_cosine

REPO = Path(__file__).resolve().parents[3]


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.proj = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("low", torch.randn(5, 3).to(torch.bfloat16))
        self.register_buffer("counts", torch.arange(7, dtype=torch.int32))

    def forward(self, x):
        return self.head(torch.tanh(self.proj(self.embed(x))))


def _trained(steps=3):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = warmup_cosine(opt, warmup=2, total=10)
    for _ in range(steps):
        loss = model(torch.randint(0, 11, (2, 5))).logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


def _save(run, model, opt, sched, step, **kw):
    return save_checkpoint(
        run, model_state=model.state_dict(), config={"d_model": 6, "vocab": 11, "pattern": ("R", "A")},
        optimizer_state=opt.state_dict(), scheduler_state=sched.state_dict(), rng_state=capture_rng_state(),
        data_state={"seed": 0, "epoch": 1, "position": 7}, step=step, **kw,
    )


def test_round_trip_is_bit_exact_and_restores_ties(tmp_path):
    model, opt, sched = _trained()
    path = _save(tmp_path / "run", model, opt, sched, step=3, extra={"tokens_seen": 123})
    assert path == tmp_path / "run" / "checkpoint"
    assert sorted(p.name for p in path.iterdir()) == sorted(
        ["model.safetensors", "config.json", "trainer_state.pt", "checkpoint.json"])
    expected_rng = torch.rand(4)  # the stream right after the save

    ckpt = load_checkpoint(tmp_path / "run", expected_config={"d_model": 6, "vocab": 11, "pattern": ["R", "A"]})
    assert ckpt.step == 3 and ckpt.extra == {"tokens_seen": 123} and ckpt.data_state["position"] == 7
    assert ckpt.ties == {"head.weight": "embed.weight"}
    assert ckpt.model_state["head.weight"] is ckpt.model_state["embed.weight"]
    for k, v in model.state_dict().items():
        assert ckpt.model_state[k].dtype == v.dtype and torch.equal(ckpt.model_state[k], v), k
    manifest = json.loads((path / "checkpoint.json").read_text())
    assert manifest["format_version"] == ck.FORMAT_VERSION and manifest["step"] == 3
    assert set(manifest["files"]) == {"model.safetensors", "config.json", "trainer_state.pt"}

    fresh, opt2, sched2 = Tiny(), None, None
    fresh.load_state_dict(ckpt.model_state)
    assert fresh.head.weight is fresh.embed.weight
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    opt2.load_state_dict(ckpt.optimizer_state)
    sched2 = warmup_cosine(opt2, warmup=2, total=10)
    sched2.load_state_dict(ckpt.scheduler_state)
    assert sched2.get_last_lr() == sched.get_last_lr()
    restore_rng_state(ckpt.rng_state)
    assert torch.equal(torch.rand(4), expected_rng)


def test_views_and_non_contiguous_tensors_are_saved_as_copies(tmp_path):
    base = torch.arange(24, dtype=torch.float32)
    state = {"whole": base, "alias": base, "slice": base[4:10], "t": base.view(4, 6).t(), "empty": torch.empty(0),
             "empty2": torch.empty(0)}
    save_checkpoint(tmp_path, model_state=state, config={}, optimizer_state=None, scheduler_state=None,
                    rng_state=None, data_state=None, step=0)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.ties == {"alias": "whole"}
    for k, v in state.items():
        assert torch.equal(ckpt.model_state[k], v), k


def test_rng_state_round_trip_covers_python_numpy_torch():
    state = capture_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def _simple(run, step, fill=None):
    fill = float(step) if fill is None else fill
    return save_checkpoint(run, model_state={"w": torch.full((64, 64), fill)}, config={"n": 1},
                           optimizer_state={"step": step}, scheduler_state=None, rng_state=None,
                           data_state={"position": step}, step=step)


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    _simple(tmp_path, 1)

    def torn(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"w\":")  # a partial header
        raise OSError("disk full")

    monkeypatch.setattr(ck, "save_file", torn)
    with pytest.raises(OSError, match="disk full"):
        _simple(tmp_path, 2)
    assert not list(tmp_path.glob("checkpoint-tmp-*"))  # the partial directory is removed
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.step == 1 and torch.all(ckpt.model_state["w"] == 1)


def test_crash_between_renames_falls_back_to_the_old_checkpoint(tmp_path, monkeypatch):
    _simple(tmp_path, 1)
    real, calls = os.replace, []

    def crash_on_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        real(src, dst)

    monkeypatch.setattr(ck.os, "replace", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        _simple(tmp_path, 2)
    monkeypatch.setattr(ck.os, "replace", real)
    assert not (tmp_path / "checkpoint").exists() and (tmp_path / "checkpoint.old").is_dir()
    assert load_checkpoint(tmp_path).step == 1
    _simple(tmp_path, 3)  # the next save cleans up after the crash
    assert load_checkpoint(tmp_path).step == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


_SAVER = textwrap.dedent("""
    import sys, torch
    from hybrid.train.loop.checkpoint import save_checkpoint
    run, step = sys.argv[1], int(sys.argv[2])
    w = torch.empty(2_000_000)
    while True:
        step += 1
        w.fill_(step)
        save_checkpoint(run, model_state={"w": w, "b": torch.full((3,), float(step))}, config={"n": 1},
                        optimizer_state={"step": step}, scheduler_state=None, rng_state=None,
                        data_state={"position": step}, step=step)
        print(step, flush=True)
""")


def test_killed_saver_leaves_a_complete_checkpoint(tmp_path):
    run, rng, step = tmp_path / "run", random.Random(), 0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(run), str(step)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()  # one save completed
            assert first.strip(), proc.stderr.read()
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        ckpt = load_checkpoint(run)
        assert ckpt.step > step
        step = ckpt.step
        assert torch.all(ckpt.model_state["w"] == step) and torch.all(ckpt.model_state["b"] == step)
        assert ckpt.optimizer_state == {"step": step} and ckpt.data_state == {"position": step}


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["model.safetensors", "trainer_state.pt", "config.json"])
def test_flipped_byte_is_refused(tmp_path, name):
    ckpt_dir = _simple(tmp_path, 1)
    _flip(ckpt_dir / name, (ckpt_dir / name).stat().st_size // 2)
    with pytest.raises(CheckpointError, match=f"{name}.*sha256"):
        load_checkpoint(tmp_path)


def test_truncated_file_is_refused_even_with_a_matching_manifest(tmp_path):
    ckpt_dir = _simple(tmp_path, 1)
    model = ckpt_dir / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="model.safetensors.*truncated"):
        load_checkpoint(tmp_path)
    manifest = json.loads((ckpt_dir / "checkpoint.json").read_text())  # forge the checksums
    manifest["files"]["model.safetensors"] = {"sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                                              "bytes": model.stat().st_size}
    (ckpt_dir / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="model.safetensors.*unreadable"):
        load_checkpoint(tmp_path)


def test_unparsable_or_incompatible_manifest_is_refused(tmp_path):
    ckpt_dir = _simple(tmp_path, 1)
    manifest_path = ckpt_dir / "checkpoint.json"
    good = manifest_path.read_text()
    manifest_path.write_text(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="checkpoint.json.*not valid JSON"):
        load_checkpoint(tmp_path)
    manifest_path.write_text(good.replace('"format_version": 1', '"format_version": 99'))
    with pytest.raises(CheckpointError, match="format_version 99"):
        load_checkpoint(tmp_path)
    manifest_path.write_text(good)
    (ckpt_dir / "trainer_state.pt").unlink()
    with pytest.raises(CheckpointError, match="trainer_state.pt.*missing"):
        load_checkpoint(tmp_path)


def test_config_mismatch_names_the_field(tmp_path):
    save_checkpoint(tmp_path, model_state={"w": torch.zeros(2)}, optimizer_state=None, scheduler_state=None,
                    rng_state=None, data_state=None, step=0,
                    config={"n_layers": 4, "d_model": 64, "rope": {"base": 10000.0}, "flag": True})
    good = {"n_layers": 4, "d_model": 64, "rope": {"base": 10000}, "flag": True}
    assert load_checkpoint(tmp_path, expected_config=good).config["n_layers"] == 4
    with pytest.raises(CheckpointError, match=r"config.json.*'n_layers': checkpoint has 4, expected 6"):
        load_checkpoint(tmp_path, expected_config={**good, "n_layers": 6})
    with pytest.raises(CheckpointError, match=r"'rope.base'"):
        load_checkpoint(tmp_path, expected_config={**good, "rope": {"base": 500.0}})
    with pytest.raises(CheckpointError, match=r"'vocab' is missing"):
        load_checkpoint(tmp_path, expected_config={**good, "vocab": 259})
    with pytest.raises(CheckpointError, match=r"'flag'"):
        load_checkpoint(tmp_path, expected_config={**good, "flag": 1})


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        load_checkpoint(tmp_path)
    assert not has_checkpoint(tmp_path)
    _simple(tmp_path, 5)
    assert has_checkpoint(tmp_path)
    assert load_checkpoint(tmp_path / "checkpoint").step == 5  # the directory itself works too


def test_keep_holds_the_newest_checkpoints_named_by_step(tmp_path):
    model, opt, sched = _trained()
    run = tmp_path / "run"
    for step in (2, 4, 6, 8):
        _save(run, model, opt, sched, step, keep=3)
    assert [s for s, _ in ck.kept_checkpoints(run)] == [6, 4]  # checkpoint/ (8) and the two before it
    assert load_checkpoint(run).step == 8 and load_checkpoint(run / "checkpoint-step-4").step == 4
    _save(run, model, opt, sched, 10, keep=1)  # keep 1: the earlier ones go
    assert ck.kept_checkpoints(run) == [] and sorted(p.name for p in run.iterdir()) == ["checkpoint"]
    _save(run, model, opt, sched, 12, keep=2)
    (run / "checkpoint").rename(tmp_path / "gone")  # lost: the newest kept one is found instead
    assert load_checkpoint(run).step == 10
    with pytest.raises(ValueError, match="keep: expected a positive int, got 0"):
        _save(run, model, opt, sched, 14, keep=0)



def _keep3(run, step):
    return save_checkpoint(run, model_state={"w": torch.full((4,), float(step))}, config={"n": 1},
                           optimizer_state=None, scheduler_state=None, rng_state=None, data_state=None, step=step,
                           keep=3)


def test_a_complete_old_checkpoint_left_by_a_crash_is_kept_not_deleted(tmp_path):
    """Probe finding 7: a crash after the new `checkpoint/` was in place but before `checkpoint.old/` was renamed
    to `checkpoint-step-N/` left it complete; the next save removed it and kept an older one. It joins the kept
    checkpoints, so `keep` keeps the newest."""
    for step in (1, 2, 3, 4):
        _keep3(tmp_path, step)
    (tmp_path / "checkpoint-step-3").rename(tmp_path / "checkpoint.old")  # the crash window of step 4's save
    _keep3(tmp_path, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "checkpoint-step-3", "checkpoint-step-4"]
    assert load_checkpoint(tmp_path / "checkpoint-step-3").step == 3


def test_an_incomplete_old_checkpoint_is_removed_by_the_next_save(tmp_path):
    """A crash while `checkpoint.old/` was being removed leaves part of it: the next save removes it."""
    for step in (1, 2, 3, 4):
        _keep3(tmp_path, step)
    old = tmp_path / "checkpoint.old"
    (tmp_path / "checkpoint-step-3").rename(old)
    (old / "model.safetensors").unlink()
    _keep3(tmp_path, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "checkpoint-step-2", "checkpoint-step-4"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest"])
def test_a_damaged_checkpoint_names_the_earlier_ones_to_resume(tmp_path, damage):
    """Probe finding 9: a truncated or corrupt file was refused naming it, not the intact earlier checkpoints (as
    the non-finite weights' refusal did); both name them now, and how to resume one."""
    for step in (4, 8, 12):
        _keep3(tmp_path, step)
    final = tmp_path / "checkpoint"
    if damage == "truncate":
        (final / "model.safetensors").write_bytes((final / "model.safetensors").read_bytes()[:-10])
    elif damage == "flip":
        _flip(final / "trainer_state.pt", 40)
    else:
        (final / "checkpoint.json").write_text("{")
    earlier = f"earlier checkpoints: {tmp_path / 'checkpoint-step-8'} (step 8), {tmp_path / 'checkpoint-step-4'} " \
              f"(step 4): pass one instead, e.g. --resume {tmp_path / 'checkpoint-step-8'}"
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path)
    assert str(caught.value).startswith(f"checkpoint file {final}") and str(caught.value).endswith(earlier)
    assert "\n" not in str(caught.value)


def test_an_incompatible_checkpoint_names_no_earlier_one(tmp_path):
    """A config mismatch is the run's, not the file's: the earlier checkpoints share it, so none is suggested; nor
    is one for a damaged checkpoint that has none beside it."""
    for step in (4, 8):
        _keep3(tmp_path, step)
    with pytest.raises(CheckpointError, match="'n': checkpoint has 1, expected 2") as caught:
        load_checkpoint(tmp_path, expected_config={"n": 2})
    assert "earlier" not in str(caught.value)
    _simple(tmp_path / "alone", 1)
    (tmp_path / "alone" / "checkpoint" / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"config.json: is 1 bytes, .* \(truncated or replaced\)$"):
        load_checkpoint(tmp_path / "alone")
