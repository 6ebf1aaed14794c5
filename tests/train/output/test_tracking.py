"""--log tensorboard / wandb (hybrid.train.output.tracking): the records of metrics.jsonl and the config, read back from
what the tracker wrote; suites and synthetic runs logged from their files; plain progress lines in a log."""
import glob
import json
import struct
import sys

import pytest

from hybrid.train.cli.lm import train_main
from hybrid.train.output.metrics import read_metrics

TINY = ["--preset", "transformer", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "32",
        "--batch-size", "4", "--warmup", "1", "--eval-batches", "1", "--device", "cpu", "--quiet"]


def tensorboard_scalars(logdir) -> dict:
    """{tag: [(step, value)]} of every event file in ``logdir``, as TensorBoard shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}, acc


def tensorboard_hparams(acc) -> dict:
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    return {k: getattr(v, v.WhichOneof("kind")) for k, v in hparams.items()}


def expected(records, key) -> list:
    return [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in records if key in r]


def test_tensorboard_holds_every_metrics_record_and_the_config(corpus, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (it is in the test extra: pip install -e '.[test]')")
    out = tmp_path / "run"
    common = ["--data", str(corpus), "--out", str(out), *TINY, "--log-every", "1", "--eval-every", "2"]
    assert train_main([*common, "--steps", "4", "--save-every", "2", "--log", "tensorboard", "--set", "rope_base=5000"]) == 0
    records = read_metrics(out / "metrics.jsonl")
    scalars, acc = tensorboard_scalars(out / "tensorboard")
    for key in ("loss", "lr", "tokens_per_s", "grad_norm", "val_loss", "val_bpb", "val_tokens"):
        assert scalars[key] == expected(records, key), key
    hparams = tensorboard_hparams(acc)
    assert hparams["lr"] == pytest.approx(2e-3) and hparams["preset"] == "transformer"
    assert hparams["model.rope_base"] == 5000 and hparams["log"] == '["tensorboard"]'

    # a resumed run continues the same log: the steps after the checkpoint once each, as in metrics.jsonl
    assert train_main(["--resume", str(out), "--steps", "6", "--quiet"]) == 0
    records = read_metrics(out / "metrics.jsonl")
    scalars, _ = tensorboard_scalars(out / "tensorboard")
    assert [s for s, _ in scalars["loss"]] == [1, 2, 3, 4, 5, 6] and scalars["loss"] == expected(records, "loss")

    # --overwrite starts the log over with the run
    assert train_main([*common, "--steps", "2", "--overwrite", "--log", "tensorboard"]) == 0
    scalars, _ = tensorboard_scalars(out / "tensorboard")
    assert [s for s, _ in scalars["loss"]] == [1, 2]


def test_a_missing_tracker_package_is_one_line_before_training(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert train_main(["--data", str(corpus), "--out", str(tmp_path / "r"), *TINY, "--steps", "2",
                       "--log", "tensorboard"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'hybrid-lm[tensorboard]'" in err, err
    assert not (tmp_path / "r").exists()


def wandb_records(path):
    """The protobuf records of a W&B run file (``run-ID.wandb``: a 7-byte header, then LevelDB log records in
    32 KiB blocks: crc32c, length, type; FULL = 1, FIRST = 2, MIDDLE = 3, LAST = 4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, pending, block = open(path, "rb").read(), 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb_offline_holds_every_metrics_record_and_the_config(corpus, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed (the wandb extra is not in the test extra)")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "hybrid-tests")
    out = tmp_path / "run"
    assert train_main(["--data", str(corpus), "--out", str(out), *TINY, "--log-every", "1", "--eval-every", "2",
                       "--steps", "3", "--log", "wandb"]) == 0
    (path,) = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, config = [], {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            history.append({k: v for k, v in items.items() if not k.startswith("_")})  # _step, _runtime: W&B's
        elif kind == "run":
            config = {i.key: json.loads(i.value_json) for i in record.run.config.update}
            assert record.run.display_name == "run" and record.run.project == "hybrid-tests"
    records = read_metrics(out / "metrics.jsonl")
    assert len(history) == len(records)
    for got, want in zip(history, records):
        assert got == pytest.approx(want, rel=1e-6)
    assert config["lr"] == 2e-3 and config["model"]["d_model"] == 32 and config["log"] == ["wandb"]
    assert (out / "wandb" / "hybrid-run-id").read_text().strip() in path


def test_a_synthetic_run_is_logged_with_its_results(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (it is in the test extra: pip install -e '.[test]')")
    from hybrid.train.cli import synthetic as cli

    out = tmp_path / "parity"
    assert cli.main(["--task", "parity", "--budget", "smoke", "--out", str(out), "--log", "tensorboard"]) == 0
    err = capsys.readouterr().err
    # stderr is not a terminal here: plain lines, one per tenth of the steps, no carriage returns
    assert "\r" not in err and "parity: 3/3 steps (100%)" in err, err
    scalars, acc = tensorboard_scalars(out / "tensorboard")
    results = json.loads((out / "results.json").read_text())
    assert scalars["loss"] == expected(read_metrics(out / "metrics.jsonl"), "loss")
    assert scalars["final/accuracy/20"] == [(3, pytest.approx(results["accuracy"]["20"]))]
    assert tensorboard_hparams(acc)["task"] == "parity"


def test_replay_logs_a_finished_run_once(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (it is in the test extra: pip install -e '.[test]')")
    from hybrid.train.output.tracking import replay_run

    run = tmp_path / "suite" / "hybrid" / "seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 5, "loss": 2.5, "lr": 0.001}\n{"step": 10, "val_bpb": 3.0}\n')
    summary = {"val_bpb": 3.0, "decode": {"4096": {"ms_per_token": 1.5}}, "status": "finished"}
    assert replay_run(["tensorboard"], run, {"model": {"window": 32}}, summary=summary) == ["tensorboard"]
    assert replay_run(["tensorboard"], run, {"model": {"window": 32}}, summary=summary) == []  # already logged
    scalars, acc = tensorboard_scalars(run / "tensorboard")
    assert scalars["loss"] == [(5, 2.5)] and scalars["val_bpb"] == [(10, 3.0)]
    assert scalars["final/decode/4096/ms_per_token"] == [(10, 1.5)]
    assert tensorboard_hparams(acc)["model.window"] == 32


def test_a_bench_suite_logs_each_finished_run(tmp_path, corpus, capsys, one_torch_thread):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (it is in the test extra: pip install -e '.[test]')")
    from hybrid.train.cli.bench import bench_main

    argv = ["--suite", "baselines", "--models", "transformer-window", "--budget", "smoke", "--seq-len", "8",
            "--window", "4", "--steps", "3", "--data", str(corpus), "--out", str(tmp_path / "bench"), "--log", "tensorboard"]
    assert bench_main(argv) == 0
    run = tmp_path / "bench" / "baselines" / "transformer-window" / "seed0"
    record = json.loads((tmp_path / "bench" / "baselines" / "results.jsonl").read_text().splitlines()[0])
    scalars, acc = tensorboard_scalars(run / "tensorboard")
    assert scalars["loss"] == expected(read_metrics(run / "metrics.jsonl"), "loss")
    assert scalars["final/val_bpb"][0][1] == pytest.approx(record["metrics"]["val_bpb"])
    assert tensorboard_hparams(acc)["train.seq_len"] == 8
    err = capsys.readouterr().err
    assert "\r" not in err and "baselines: 3/3 steps (100%)" in err  # plain progress lines in a log
