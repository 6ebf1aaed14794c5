"""What a distillation prints and writes beside its checkpoints: the plan it announces, the layer ranking
(``layer_ranking.json``), the summary (``distill.json``) and the closing lines naming the run directory's files."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..output.metrics import METRICS_FILE, read_metrics

__all__ = ["PLOT_FILE", "RANKING_FILE", "SUMMARY_FILE", "CONFIG_FILE", "announce", "ranking_lines", "write_ranking",
           "summary", "layout"]

PLOT_FILE, RANKING_FILE, SUMMARY_FILE = "loss.png", "layer_ranking.json", "distill.json"
CONFIG_FILE = "distill_config.json"


def announce(run, resumed: bool) -> str:
    """The first lines: the teacher, the student, the data, both stages' plans, and the notes."""
    c, s, t, env = run.config, run.data.stats, run.teacher, run.env
    mode = f"pattern {c.pattern}" if c.pattern is not None else f"keep-attention {c.keep_attention}"
    what = f"resuming at step {run.loop.step} ({run.stage.name})" if resumed else "distilling"
    if env.distributed:
        per_step = (f"{run.global_batch} × {c.seq_len} tokens per step (batch_size {c.batch_size} × grad_accum "
                    f"{c.grad_accum} × {env.world_size} ranks, {run.wrap})")
    else:
        per_step = f"{run.global_batch} × {c.seq_len} tokens per step"
    lines = [f"{what}: teacher {t.path} (layers {t.config.layer_types}, {t.model.num_parameters():,} parameters) -> "
             f"{mode}, window {run.align_config.window or 'global'}",
             f"data: {s['source']}: {s['train_tokens']:,} train / {s['valid_tokens']:,} valid tokens ({s['tokenizer']})",
             f"stage 1 (align {len(run.align_layers)} R layers): {c.align_steps} steps, lr {c.align_lr:g}; stage 2 (KL, "
             f"τ={c.temperature:g}, ce_weight {c.ce_weight:g}, train {c.train}): {c.steps} steps, lr {c.lr:g}; "
             f"{per_step} (packing {c.packing})"]
    lines += [f"note: {note}" for note in run.notes if isinstance(note, str)]
    for note in (n for n in run.notes if isinstance(n, dict)):
        lines.append(f"note: copied {note['copied']} teacher tensors; R layers {note['mapped_layers']} from the "
                     f"attention they replace (V, O)")
        if "decay" in note:
            per_layer = (f"layer {i}: {', '.join(f'{g:.3f}' for g in gs)}" for i, gs in note["decay"].items())
            lines.append("note: decay γ per head from the attention's mean distance: " + "; ".join(per_layer))
    return "\n".join(lines)


def ranking_lines(ranking: list[dict]) -> str:
    rows = (f"  {r['rank']:>2}. layer {r['layer']:>3}  KL {r['kl']:.5f}  "
            f"{'kept as attention' if r['kept'] else 'replaced by R'}" for r in ranking)
    return "layer ranking (KL of the teacher with only that layer replaced, nats/token):\n" + "\n".join(rows)


def write_ranking(out: Path, teacher: Path, k: int, layer_types: str, ranking: list[dict], batches: int) -> None:
    (out / RANKING_FILE).write_text(json.dumps(
        {"teacher": str(teacher), "k": k, "layer_types": layer_types,
         "metric": "mean per-token KL(teacher || teacher with only this layer replaced by its stage-1 R layer), nats, "
                   f"over {batches} validation batches",
         "ranking": ranking}, indent=2) + "\n")


def summary(run, teacher: dict, final: dict) -> dict:
    """``distill.json``: the student against the teacher, the tokens and speed of each stage, the alignment."""
    c = run.config
    records = read_metrics(run.out / METRICS_FILE)
    speeds = {stage: [r["tokens_per_s"] for r in records if r.get("stage") == stage and "tokens_per_s" in r]
              for stage in ("align", "distill")}
    align_final = next((r for r in reversed(records) if r.get("stage") == "align"
                        and any(k.startswith("val_mse") for k in r)), None)
    tokens = run.global_batch * c.seq_len
    model = run.stage.model
    return {
        "teacher": str(run.teacher.path), "teacher_layer_types": run.teacher.config.layer_types,
        "layer_types": model.config.layer_types, "replaced": run.replaced,
        "window": model.config.attention.window, "ranking": run.ranking, **teacher, **final,
        "tokens": {"align": c.align_steps * tokens, "distill": c.steps * tokens, "total": c.total_steps * tokens},
        "tokens_per_s": {k: statistics.median(v) if v else None for k, v in speeds.items()},
        "align_mse_init": run.align_init,
        "align_mse_final": None if align_final is None else {k: v for k, v in align_final.items()
                                                               if k.startswith("val_")},
    }


def layout(run, s: dict) -> str:
    """The closing lines: the student's figures and what the run directory holds."""
    return (f"done at step {run.loop.step}: student {s['layer_types']} (R at {s['replaced']}, window {s['window']}): "
            f"val_bpb {s['val_bpb']:.4f} (teacher {s['teacher_val_bpb']:.4f}), KL to the teacher "
            f"{s['val_kl']:.4f} nats/token\n"
            f"run directory {run.out}/\n"
            f"  checkpoint/          the student (hybrid-generate, hybrid-export, load_run open it); resumable\n"
            f"  {METRICS_FILE:<20} stage 1 and stage 2 records (JSON lines)\n"
            f"  {PLOT_FILE:<20} both stages' curves\n"
            + (f"  {RANKING_FILE:<20} the layer ranking\n" if run.ranking else "")
            + f"  {SUMMARY_FILE:<20} the summary; {CONFIG_FILE}: the run's options")
