"""The G parity probe (train/tasks/gla_probe.py): its split of the read-out adds up to the op's, and on a G layer
crafted to be parity's automaton it reads the automaton back."""
import torch

from hybrid import VOGatedLinearAttention
from hybrid.kernels.vo_gla import vo_gla_reference
from hybrid.models import HybridConfig, HybridLM
from hybrid.train.tasks import make_task
from hybrid.train.tasks.gla_probe import gla_parity_probe, last_token_parts

F64 = torch.float64


def test_the_writes_add_up_to_the_read_out():
    """Σ_j parts[:, j] is the op's o_T, for the data phase and the hard gate (some gates held)."""
    torch.manual_seed(46)
    g = VOGatedLinearAttention(12, 2, phase="data", gate="hardsigmoid", hold_below=0.45).double()
    with torch.no_grad():
        for p in g.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(3, 11, 12, dtype=F64)
    parts = last_token_parts(g, x)
    q, k, _ = g._keys(x, None)
    v = g.v_proj(x).unflatten(-1, (2, g.value_dim))
    o, _ = vo_gla_reference(q, k, v, g.log_decay(x), g.angles(x))
    assert bool((parts["log_decay"] == 0).any()) and bool((parts["log_decay"] < 0).any())
    torch.testing.assert_close(parts["parts"].sum(1), o[:, -1], rtol=1e-12, atol=1e-12)
    assert parts["parts"].shape == (3, 11, 2, g.value_dim) and parts["theta"].shape == (3, 11, 2, g.value_dim // 2)


def crafted_parity_model():
    """A one-layer G whose head holds exactly (the hard gate shut) and turns every pair by exactly π on ``1`` and 0
    on ``0`` (the data angles π·σ(±40), rounded to {0, π}): the embeddings of the bits are ±c·e₀."""
    task = make_task("parity", train_lengths=(3, 12), test_lengths=(12, 30))
    config = HybridConfig.preset("vo-gla", "tiny", vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2,
                                 **{"gla.phase": "data", "gla.phase_round": 2, "gla.phase_round_at_inference": True,
                                    "gla.gate": "hardsigmoid"})
    model = HybridLM(config).double().eval()
    with torch.no_grad():
        model.embed.weight.zero_()
        model.embed.weight[task.tokens["1"], 0] = 1e4
        model.embed.weight[task.tokens["0"], 0] = -1e4
        model.embed.weight[task.tokens["<bos>"], 1] = 1e4
        mixer = model.blocks[0].mixer
        mixer.data_phase.weight.zero_()
        mixer.data_phase.weight[:, 0] = 10.0
        mixer.data_phase.bias.zero_()
        mixer.decay_weight.zero_()
        mixer.decay_bias.fill_(-100.0)
    return model, task


def test_the_probe_reads_the_automaton_back():
    model, task = crafted_parity_model()
    r = gla_parity_probe(model, task, 30, 8)
    assert r["counting_pairs"] == 2 * model.blocks[0].mixer.value_dim // 2  # every pair of both heads
    assert (r["theta_one"], r["theta_zero"]) == (1.0, 0.0)
    assert (r["held_one"], r["held_zero"], r["gamma_one"], r["gamma_zero"], r["kept"]) == (1.0, 1.0, 1.0, 1.0, 1.0)
    assert r["anchor_train"] > 0 and r["anchor_long"] > 0 and r["others_long"] > 0


def test_the_command_prints_one_row_per_run_and_refuses_a_model_without_g_in_one_line(tmp_path, capsys):
    from hybrid.train.cli.studies.gla_probe import main
    from hybrid.train.tasks.gla_probe import GLA_PROBE_COLUMNS
    from hybrid.train.tasks.train import TaskRunConfig, train_task

    def run(preset, out, **model):
        config = TaskRunConfig(task="parity", task_params={"train_lengths": [3, 6], "test_lengths": [6, 12]},
                               preset=preset, steps=2, batch_size=4, eval_size=8,
                               model={"d_model": 16, "n_layers": 1, "n_heads": 2, **model})
        train_task(config, out)
        return str(out)

    parity = run("vo-gla", tmp_path / "g", **{"gla.phase": "data"})
    assert main([parity, "--length", "12"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| " + " | ".join(GLA_PROBE_COLUMNS) + " |" and len(lines) == 3
    assert lines[2].startswith(f"| {parity} | ")
    assert main([run("transformer", tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("python -m hybrid.train.cli.studies.gla_probe: error: model: expected a model with a G layer "
                   "(VOGatedLinearAttention), got none")


def test_the_passkey_probe_splits_each_g_heads_read_out_at_the_query(tmp_path, capsys):
    """A tiny GGA passkey run: one row per length, G layer and head; the key's and the rest's parts are the two
    sides of the read-out at the query marker (their sum is `last_token_parts`', tested above), the share between 0
    and 1; the command refuses a parity run in one line."""
    from hybrid.train.cli.studies.gla_probe import main
    from hybrid.train.tasks.gla_probe import PASSKEY_PROBE_COLUMNS, gla_passkey_probe
    from hybrid.train.tasks.train import TaskRunConfig, load_task_run, train_task

    config = TaskRunConfig(task="passkey", task_params={"train_length": 64, "test_lengths": [64, 128], "depths": 3,
                                                        "samples": 1},
                           preset="hybrid", steps=2, batch_size=4, eval_size=4,
                           model={"d_model": 16, "n_layers": 3, "n_heads": 2, "pattern": "GGA", "window": 8,
                                  "gla.gate": "hardsigmoid"})
    train_task(config, tmp_path / "pk")
    model, task = load_task_run(tmp_path / "pk")
    rows = gla_passkey_probe(model, task, 128, depth=0.25, n=3)
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in rows:
        assert r["key"] > 0 and r["other"] > 0 and 0 < r["share"] < 1 and 0 <= r["held"] <= 1
        assert r["share"] == r["key"] / (r["key"] + r["other"]) and r["exact"] in (0.0, 1 / 3, 2 / 3, 1.0)
    assert main(["--passkey", str(tmp_path / "pk"), "--lengths", "64,128"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "| " + " | ".join(PASSKEY_PROBE_COLUMNS) + " |" and len(lines) == 2 + 2 * 4
    parity = TaskRunConfig(task="parity", task_params={"train_lengths": [3, 6], "test_lengths": [6, 12]},
                           preset="vo-gla", steps=1, batch_size=4, eval_size=4, model={"d_model": 16, "n_layers": 1,
                                                                                       "n_heads": 2})
    train_task(parity, tmp_path / "parity")
    assert main(["--passkey", str(tmp_path / "parity")]) == 2
    assert capsys.readouterr().err.strip() == ("python -m hybrid.train.cli.studies.gla_probe: error: run: expected a "
                                               f"passkey run directory, got a parity run at {tmp_path / 'parity'}")
