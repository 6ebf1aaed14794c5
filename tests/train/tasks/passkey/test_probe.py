"""hybrid.train.tasks.passkey.probe: the split scan against the closed form, and the probe on crafted recurrences
whose decays are known (static, gates always open, gates always shut)."""
from __future__ import annotations

import math

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.recurrence import VORecurrence
from hybrid.train.tasks import make_task
from hybrid.train.tasks.passkey.probe import passkey_probe, split_scan

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # width-16 models (tests/conftest.py)


def test_split_scan_against_the_closed_form():
    torch.manual_seed(0)
    B, T, H, P = 2, 7, 3, 5
    v = torch.randn(B, T, H, 2 * P, dtype=torch.float64)
    log_decay = -torch.rand(B, T, H, P, dtype=torch.float64)
    theta = torch.randn(B, T, H, P, dtype=torch.float64)
    mask = torch.rand(B, T) < 0.4
    until = 5
    masked, rest = split_scan(v, log_decay, theta, mask, until)
    writes = torch.complex(v[..., 0::2], v[..., 1::2])  # (B, T, H, P)
    want_masked = torch.zeros(B, H, P, dtype=torch.complex128)
    want_rest = torch.zeros_like(want_masked)
    for j in range(until + 1):  # s_q = Σ_j Π_{t=j+1}^{q} γ_t e^{−iθ_t} v_j
        factor = torch.exp(torch.complex(log_decay[:, j + 1:until + 1].sum(1), -theta[:, j + 1:until + 1].sum(1)))
        term = factor * writes[:, j]
        want_masked += torch.where(mask[:, j, None, None], term, 0)
        want_rest += torch.where(mask[:, j, None, None], 0, term)
    torch.testing.assert_close(masked, want_masked, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rest, want_rest, rtol=1e-12, atol=1e-12)


def _task():
    return make_task("passkey", train_length=40, test_lengths=[40], depths=3, samples=2, filler_vocab=12)


def _model(task, **overrides) -> HybridLM:
    torch.manual_seed(0)
    config = HybridConfig.preset("hybrid", "tiny", vocab_size=task.vocab_size, d_model=16, n_layers=3, n_heads=2,
                                 window=8, **overrides)
    return HybridLM(config).eval()


def test_static_decay_keeps_gamma_to_the_distance():
    task = _task()
    model = _model(task)
    rows = passkey_probe(model, task, length=64, n=4, depth=0.25)
    layers = [m for m in model.modules() if isinstance(m, VORecurrence)]
    assert len(rows) == len(layers) == 2  # RRA
    for row, layer in zip(rows, layers):
        h, p = row["best_pair"]
        distance = row["distance"]
        assert distance == task.query_position(64) - (task.key_position(64, 0.25) + task.k)
        want = math.exp(distance * layer.log_decay()[h, p].item())  # γ^distance
        assert row["kept"] == pytest.approx(want, rel=1e-6)
        assert row["turned"] == pytest.approx(distance * layer.theta[h, p].item(), rel=1e-6)  # θ·distance
        assert 0.0 < row["key_share_best"] <= 1.0 and row["key_share_mean"] <= row["key_share_best"]
        assert row["held"] == 0.0  # static γ < 1 never holds


def test_a_pair_without_rotary_turns_the_key_by_nothing():
    task = _task()
    model = _model(task, **{"recurrence.rotary_dim": 2})  # head_dim 8: pair 0 turns, pairs 1–3 do not
    for row in passkey_probe(model, task, length=64, n=4, depth=0.25):
        h, p = row["best_pair"]
        assert row["turned"] == (0.0 if p > 0 else pytest.approx(row["distance"] * 1.0, rel=1e-6))


def _gated_model(task, bias: float) -> HybridLM:
    """The selective hard-gate hybrid with every recurrence gate at ``hardsigmoid(bias / 6 + ½)`` on every token."""
    model = _model(task, rnn_selective=True, rnn_selective_gate="hardsigmoid")
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, VORecurrence):
                layer.recur_gate_weight.zero_()
                layer.recur_gate_bias.fill_(bias)
    return model


def test_gates_shut_everywhere_hold_everything():
    task = _task()
    model = _gated_model(task, -10.0)  # hardsigmoid(−10/6 + ½) = 0: r_t = 0, γ_t = 1, no write
    for row in passkey_probe(model, task, length=48, n=3):
        assert row["held"] == 1.0 and row["kept"] == 1.0  # (the writes are the floor sqrt(MIN_WRITE_SQ)·u)


def test_gates_open_everywhere_decay_at_c_times_the_base():
    task = _task()
    model = _gated_model(task, 10.0)  # r_t = 1: log γ_t = c · log γ
    layers = [m for m in model.modules() if isinstance(m, VORecurrence)]
    for row, layer in zip(passkey_probe(model, task, length=48, n=3, depth=0.9), layers):
        h, p = row["best_pair"]
        assert row["held"] == 0.0
        assert row["kept"] == pytest.approx(math.exp(8.0 * row["distance"] * layer.log_decay()[h, p].item()), rel=1e-6)


def test_probe_refuses_a_model_without_recurrence():
    task = _task()
    torch.manual_seed(0)
    model = HybridLM(HybridConfig.preset("transformer", "tiny", vocab_size=task.vocab_size, d_model=16, n_layers=1,
                                         n_heads=2)).eval()
    with pytest.raises(ValueError, match="model: expected a model with a VO-RoPE recurrence layer, got none"):
        passkey_probe(model, task, length=40, n=2)


def test_the_command_line_on_a_run(tmp_path, capsys):
    from hybrid.train.cli import synthetic as cli
    from hybrid.train.cli.studies.passkey_probe import main
    from hybrid.train.tasks.passkey.probe import PROBE_COLUMNS

    run = tmp_path / "pk"
    assert cli.main(["--task", "passkey", "--budget", "smoke", "--preset", "hybrid", "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main([str(run), "--lengths", "32,48"]) == 0
    out = capsys.readouterr().out
    assert ("| " + " | ".join(PROBE_COLUMNS) + " |") in out and out.count(f"| {run} |") >= 2


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "a"], "--lengths: expected comma-separated integers such as 256,1024, got 'a'"),
    (["--depth", "2"], "--depth: expected a number in [0, 1], got 2.0"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    from hybrid.train.cli.studies.passkey_probe import main

    assert main([str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
