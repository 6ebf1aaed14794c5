"""A distillation run's loss.png (hybrid.train.distill.plot): drawn from the records of both stages, with or
without the teacher's line, and from a run that has only one stage's records."""
import json

from hybrid.train.distill.plot import plot_stages

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_both_stages_are_drawn_from_the_metrics_file(tmp_path):
    records = [{"step": 1, "stage": "align", "loss": 0.9, "mse_layer0": 0.9, "mse_layer1": 1.1},
               {"step": 2, "stage": "align", "val_mse_layer0": 0.5, "val_mse_layer1": 0.6},
               {"step": 3, "stage": "distill", "loss": 0.4},
               {"step": 4, "stage": "distill", "loss": 0.3, "val_kl": 0.2, "val_loss": 1.4}]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    for teacher in (1.2, None):
        out = plot_stages(metrics, tmp_path / f"loss-{teacher}.png", teacher_val_loss=teacher)
        assert out == tmp_path / f"loss-{teacher}.png" and out.read_bytes()[:8] == PNG_MAGIC
    metrics.write_text(json.dumps(records[0]) + "\n")  # stage 1 only (a run stopped in it)
    assert plot_stages(metrics, tmp_path / "align.png").read_bytes()[:8] == PNG_MAGIC
