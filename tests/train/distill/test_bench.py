"""The distillation measurement's table (python -m hybrid.train.cli.studies.distill_bench table) from evaluated run directories."""
import json

from hybrid.train.cli.studies.distill_bench import main


def fake_run(path, bpb, *, distilled):
    path.mkdir()
    figures = {"val_bpb": bpb, **{f"bpb_full_{k}x": bpb + k / 100 for k in (1, 2, 4, 8)}, "bpb_full_8x_last": bpb,
               "decode_16k": {"ms_per_token": 2.0, "state_bytes": 71680}}
    (path / "eval.json").write_text(json.dumps(figures))
    if distilled:
        (path / "distill.json").write_text(json.dumps({"tokens": {"total": 1000}, "tokens_per_s": {"distill": 50.0}}))
    else:
        (path / "train_config.json").write_text(json.dumps({"steps": 10, "batch_size": 2, "grad_accum": 1, "seq_len": 8}))
        (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "tokens_per_s": 10.0 * s}) + "\n"
                                                    for s in (1, 2, 3)))


def test_the_table_gives_mean_and_spread_per_group(tmp_path, capsys):
    fake_run(tmp_path / "a", 2.0, distilled=True)
    fake_run(tmp_path / "b", 2.2, distilled=True)
    fake_run(tmp_path / "t", 1.5, distilled=False)
    assert main(["table", f"distilled={tmp_path / 'a'},{tmp_path / 'b'}", f"teacher={tmp_path / 't'}"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("| model | seeds | training tokens | val bpb at L")
    assert lines[2].startswith("| distilled | 2 | 0.00M | 2.100 ± 0.141 | 2.110 ± 0.141 |")
    assert lines[2].endswith("| 2.0 ± 0.0 | 0.0717 MB | 50 ± 0 |")
    assert lines[3].startswith("| teacher | 1 | 0.00M | 1.500 |") and lines[3].endswith("| 25 |")  # median of 20, 30
