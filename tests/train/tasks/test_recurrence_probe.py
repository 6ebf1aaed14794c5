import math

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.tasks import make_task
from hybrid.train.tasks.base import rng_of
from hybrid.train.tasks.recurrence_probe import parity_probe, record_transitions, rounded_angles
from hybrid.train.tasks.train import TEST_SEED


def crafted_parity_model(eps: float, selective: bool = False, held: bool = False) -> tuple[HybridLM, object]:
    """A one-layer data-phase vo-rnn whose every pair turns by exactly π(1 − eps) on ``1`` and exactly 0 on ``0``:
    the embeddings of the bits are ±c·e₀, so the normalised mixer input is ±√d·e₀, and the hard phase map
    θ = π·clamp(z/6 + ½, 0, 1) of z = ±3 − 6·eps gives π(1 − eps) and 0."""
    task = make_task("parity", train_lengths=(3, 12), test_lengths=(12, 30))
    d = 16
    config = HybridConfig.preset("vo-rnn", "tiny", vocab_size=task.vocab_size, d_model=d, n_layers=1, n_heads=2,
                                 rnn_phase="data", rnn_phase_map="pi-hardsigmoid", rnn_selective=selective or held,
                                 **({"rnn_selective_gate": "hardsigmoid"} if held else {}))
    model = HybridLM(config).double().eval()
    with torch.no_grad():
        model.embed.weight.zero_()
        model.embed.weight[task.tokens["1"], 0] = 1e4
        model.embed.weight[task.tokens["0"], 0] = -1e4
        model.embed.weight[task.tokens["<bos>"], 1] = 1e4
        phase = model.blocks[0].mixer.data_phase
        phase.weight.zero_()
        phase.weight[:, 0] = 3.0 / math.sqrt(d)
        phase.bias.fill_(-6.0 * eps)
        if held:  # the hard recurrence gate shut on every token: γ_t = 1 exactly
            mixer = model.blocks[0].mixer
            mixer.recur_gate_weight.zero_()
            mixer.recur_gate_bias.fill_(-100.0)
    return model, task


def test_recorded_transitions_are_the_scan_inputs():
    eps = 0.013
    model, task = crafted_parity_model(eps)
    ids = task.test_batch("30", 5, rng_of(7)).ids
    (theta, log_decay), = record_transitions(model, ids)
    assert theta.shape == log_decay.shape == (5, 31, 2, 4) and theta.dtype == torch.float64
    bits = ids[:, 1:, None, None].expand(-1, -1, 2, 4)
    expected = torch.where(bits == task.tokens["1"], math.pi * (1 - eps), 0.0).double()
    torch.testing.assert_close(theta[:, 1:], expected, rtol=1e-7, atol=1e-7)  # F.hardsigmoid's 1/6 is a float32
    static = model.blocks[0].mixer.log_decay().double()  # (H, P): no selective decay
    torch.testing.assert_close(log_decay, static.expand_as(log_decay), rtol=0, atol=0)
    assert not hasattr(model.blocks[0].mixer, "scan_inputs") or "scan_inputs" not in vars(model.blocks[0].mixer)


@pytest.mark.parametrize("eps", [0.0, 0.002, 0.0047])
def test_the_probe_measures_the_drift_an_angle_error_adds_up_to(eps):
    """Every pair flips by π(1 − eps): the drift of a sequence with n₁ ones is |wrap(−π·eps·n₁)|, the step error
    −eps·(share of ones), and the kept magnitude exp(L·log γ) of the static decay."""
    model, task = crafted_parity_model(eps)
    length, n = 200, 24
    r = parity_probe(model, task, length, n)
    ones = (task.test_batch(str(length), n, rng_of(TEST_SEED)).ids[:, 1:] == task.tokens["1"]).double().sum(1)
    drift = (math.pi - torch.remainder(math.pi + math.pi * eps * ones, 2 * math.pi)).abs() / math.pi
    static = model.blocks[0].mixer.log_decay().detach()  # (H, P): every pair drifts alike, the slowest decay is kept
    h, pair = divmod(int(static.argmax()), static.shape[1])
    assert r["flip_pairs"] == 8 and r["pair"] == [h, pair]
    assert r["theta_one"] == pytest.approx(1 - eps, rel=1e-7) and r["theta_zero"] == pytest.approx(0.0, abs=1e-12)
    assert r["step_error"] == pytest.approx(-eps * float(ones.sum()) / (n * length), rel=1e-5, abs=1e-7)
    assert r["drift"] == pytest.approx(float(drift.mean()), rel=1e-5, abs=1e-6)
    assert r["inverted"] == pytest.approx(float((drift > 0.5).double().mean()))
    log_gamma = float(static[h, pair])
    assert r["log_gamma_one"] == r["log_gamma_zero"] == pytest.approx(log_gamma, rel=1e-12)
    assert r["kept"] == pytest.approx(math.exp(length * log_gamma), rel=1e-9) and r["held"] == 0.0
    if eps == 0.0047:
        assert 0 < r["inverted"] < 1  # ~100 ones × 0.0047π: some sequences have drifted past a quarter turn


def test_rounded_angles_make_the_flip_exact_and_are_undone():
    model, task = crafted_parity_model(0.02)
    phase = model.blocks[0].mixer.data_phase
    ids = task.test_batch("30", 4, rng_of(3)).ids
    with rounded_angles(model) as n:
        (theta, _), = record_transitions(model, ids)
        assert n == 1 and (phase.round_to, phase.round_at_inference) == (2, True)
    bits = ids[:, 1:, None, None].expand(-1, -1, 2, 4)
    torch.testing.assert_close(theta[:, 1:], torch.where(bits == task.tokens["1"], math.pi, 0.0).double())
    assert (phase.round_to, phase.round_at_inference) == (0, False)
    assert parity_probe(model, task, 60, 8)["theta_one"] == pytest.approx(0.98, rel=1e-7)


def test_the_probe_refuses_a_model_without_a_recurrence():
    task = make_task("parity")
    model = HybridLM(HybridConfig.preset("transformer", "tiny", vocab_size=task.vocab_size, d_model=16,
                                         n_layers=1, n_heads=2))
    with pytest.raises(ValueError, match="^model: expected a model with a VO-RoPE recurrence layer, got none$"):
        record_transitions(model, torch.zeros(1, 3, dtype=torch.long))


def test_the_command_prints_one_row_per_run_and_refuses_another_task_in_one_line(tmp_path, capsys):
    from hybrid.train.cli.studies.recurrence_probe import main
    from hybrid.train.tasks.recurrence_probe import PROBE_COLUMNS
    from hybrid.train.tasks.train import TaskRunConfig, train_task

    def run(task, out, **params):
        config = TaskRunConfig(task=task, task_params=params, preset="vo-rnn", steps=2, batch_size=4, eval_size=8,
                               model={"d_model": 16, "n_layers": 1, "n_heads": 2, "rnn_phase": "data"})
        train_task(config, out)
        return str(out)

    parity = run("parity", tmp_path / "parity", train_lengths=[3, 6], test_lengths=[6, 12])
    assert main([parity, parity, "--length", "12"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| " + " | ".join(PROBE_COLUMNS) + " |" and len(lines) == 4
    assert lines[2].startswith(f"| {parity} | ") and lines[2] == lines[3]
    mod5 = run("mod5", tmp_path / "mod5", train_lengths=[3, 6], test_lengths=[6, 12])
    assert main([mod5]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("python -m hybrid.train.cli.studies.recurrence_probe: error: run: expected a parity run directory, "
                   f"got a mod5 run at {mod5}")


def test_state_magnitudes_are_the_final_state_pairs_and_the_growth_their_ratio():
    """The median |s_T| per pair from the recurrent route (one token at a time) matches the probe's parallel
    one, and the probe's growths are the ratios of those at the test and training lengths."""
    from hybrid.train.tasks.recurrence_probe import state_magnitudes

    model, task = crafted_parity_model(0.003)
    expected = {}
    for length in (task.longest_train_length, 50):
        ids = task.test_batch(str(length), 16, rng_of(TEST_SEED)).ids
        with torch.no_grad():
            _, state = model(ids, mode="recurrent")
        scan = state.layers[0].scan.double()  # (16, H, hd)
        expected[length] = torch.sqrt(scan[..., 0::2] ** 2 + scan[..., 1::2] ** 2).median(0).values
        torch.testing.assert_close(state_magnitudes(model, task, length, 16), expected[length], rtol=1e-9, atol=0)
    r = parity_probe(model, task, 50, 16)
    ratio = expected[50] / expected[task.longest_train_length]
    h, p = r["pair"]
    assert r["carrier_growth"] == pytest.approx(float(ratio[h, p]), rel=1e-9)
    hc, pc = r["most_changed_pair"]
    assert r["most_changed_growth"] == pytest.approx(float(ratio[hc, pc]), rel=1e-9)
    assert abs(math.log(r["most_changed_growth"])) >= abs(math.log(r["carrier_growth"])) - 1e-12


def test_a_quarter_turn_pair_counts_mod_4_and_is_no_flip_pair():
    model, task = crafted_parity_model(0.5)  # z = 3 − 3 on 1: θ = π/2 exactly; 0 on 0
    assert parity_probe(model, task, 40, 8) == {"length": 40, "sequences": 8, "flip_pairs": 0}


def test_a_shut_hard_gate_holds_every_bit_exactly():
    model, task = crafted_parity_model(0.0, held=True)
    r = parity_probe(model, task, 60, 8)
    assert (r["held"], r["kept"], r["log_gamma_one"], r["log_gamma_zero"]) == (1.0, 1.0, 0.0, 0.0)
