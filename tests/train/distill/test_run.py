"""The Distiller's stages (hybrid.train.distill.run): stage 1 lowers every layer's MSE, auto:K keeps the layer that
matters, a run resumes exactly, and a non-finite loss never replaces the last good checkpoint."""
import json
import math

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.loop.checkpoint import capture_rng_state, load_checkpoint, save_checkpoint
from hybrid.train.distill import DistillConfig, Distiller
from hybrid.train.output.metrics import read_metrics
from hybrid.train.data.tokenizer import ByteTokenizer


def write_teacher(path, *, n_layers=3, scale=None, seed=0, pattern=None, **overrides):
    """A random tiny transformer run (byte tokenizer); ``scale``: {layer: factor} on its attention's out_proj;
    ``pattern``: a hybrid teacher's layers instead; ``overrides``: config fields."""
    config = HybridConfig.preset("transformer", d_model=32, n_layers=n_layers, n_heads=2, vocab_size=320,
                                 **overrides)
    if pattern is not None:
        config = config.replace(pattern=pattern)
    torch.manual_seed(seed)
    model = HybridLM(config)
    with torch.no_grad():
        for i, factor in (scale or {}).items():
            model.blocks[i].mixer.out_proj.weight.mul_(factor)
    save_checkpoint(path, model_state=model.state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0,
                    extra={"tokenizer": ByteTokenizer().to_dict()})
    return path


def tiny_run(teacher, corpus, out, **kw):
    base = dict(teacher=str(teacher), data=str(corpus), out=str(out), seq_len=16, batch_size=4, eval_batches=4,
                log_every=1, eval_every=0, save_every=0, device="cpu", select_batches=4)
    return DistillConfig(**{**base, **kw})


def test_stage1_lowers_each_layers_mse(tmp_path, corpus, one_torch_thread):
    teacher = write_teacher(tmp_path / "teacher")
    result = Distiller(tiny_run(teacher, corpus, tmp_path / "out", pattern="RRA", model={"window": 8},
                                align_steps=25, align_lr=1e-2, steps=0, eval_every=25),
                       verbose=0, progress=False).fit()
    init, final = result.summary["align_mse_init"], result.summary["align_mse_final"]
    for i in (0, 1):
        assert final[f"val_mse_layer{i}"] < 0.8 * init[f"val_mse_layer{i}"], (i, init, final)
    assert result.layer_types == "RRA" and result.replaced == [0, 1]


def test_auto_keeps_the_layer_that_matters(tmp_path, corpus, one_torch_thread):
    teacher = write_teacher(tmp_path / "teacher", scale={0: 1e-3, 1: 50.0, 2: 1e-3})
    result = Distiller(tiny_run(teacher, corpus, tmp_path / "out", keep_attention="auto:1", align_steps=3, steps=1),
                       verbose=0, progress=False).fit()
    assert [r["layer"] for r in result.ranking][0] == 1 and result.ranking[0]["kept"]
    assert result.ranking[0]["kl"] > 100 * max(r["kl"] for r in result.ranking[1:])
    assert result.layer_types == "RAR" and result.replaced == [0, 2]
    saved = json.loads((tmp_path / "out" / "layer_ranking.json").read_text())
    assert saved["layer_types"] == "RAR"
    assert [r["layer"] for r in saved["ranking"]] == [r["layer"] for r in result.ranking]
    assert load_checkpoint(tmp_path / "out").config["pattern"] == "RAR"


def test_a_hybrid_teachers_own_layers_stay_as_they_are(tmp_path, corpus, one_torch_thread):
    """auto:K ranks the teacher's attention layers only; its own R layer stays the same R layer, weights and all
    (it became a fresh attention layer). A partial-rotary teacher gives its R layers recurrence.rotary_dim, but
    not when it has R layers of its own, which one recurrence config also serves."""
    teacher = write_teacher(tmp_path / "teacher", pattern="ARA", **{"attention.rotary_dim": 8})
    result = Distiller(tiny_run(teacher, corpus, tmp_path / "out", keep_attention="auto:1", align_steps=1, steps=0),
                       verbose=0, progress=False).fit()
    assert result.layer_types in ("RRA", "ARR") and result.replaced in ([0], [2])
    saved = load_checkpoint(tmp_path / "out")
    assert saved.config["recurrence"]["rotary_dim"] is None
    source = load_checkpoint(teacher).model_state
    own = {k: v for k, v in source.items() if k.startswith("blocks.1.")}
    assert own and all(torch.equal(saved.model_state[k], v) for k, v in own.items())


def test_a_teacher_with_g_layers_takes_a_pattern_that_repeats_them(tmp_path, corpus, one_torch_thread):
    teacher = write_teacher(tmp_path / "teacher", n_layers=2, pattern="GA")
    result = Distiller(tiny_run(teacher, corpus, tmp_path / "out", pattern="GR", align_steps=1, steps=0),
                       verbose=0, progress=False).fit()
    assert result.layer_types == "GR" and result.replaced == [1]


def _stop_at(step):
    def on_log(record):
        if record["step"] == step and "loss" in record:
            raise KeyboardInterrupt
    return on_log


def test_resume_is_exact_across_both_stages(tmp_path, corpus, one_torch_thread):
    teacher = write_teacher(tmp_path / "teacher")
    kw = dict(keep_attention="auto:1", align_steps=4, steps=4, save_every=2, eval_every=3, ce_weight=0.5)
    Distiller(tiny_run(teacher, corpus, tmp_path / "a", **kw), verbose=0, progress=False).fit()
    with pytest.raises(KeyboardInterrupt):  # in stage 1 (the last checkpoint: step 2)
        Distiller(tiny_run(teacher, corpus, tmp_path / "b", **kw), verbose=0, progress=False, on_log=_stop_at(3)).fit()
    with pytest.raises(KeyboardInterrupt):  # in stage 2 (the last checkpoint: step 6)
        Distiller.from_checkpoint(tmp_path / "b", distiller_kwargs=dict(verbose=0, progress=False,
                                                                        on_log=_stop_at(7))).fit()
    assert load_checkpoint(tmp_path / "b").extra["distill"]["stage"] == "distill"
    Distiller.from_checkpoint(tmp_path / "b", distiller_kwargs=dict(verbose=0, progress=False)).fit()
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    assert a.step == b.step == 8 and a.config == b.config
    for name, value in a.model_state.items():
        torch.testing.assert_close(b.model_state[name], value, rtol=0, atol=0, msg=name)

    def numbers(path):
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in read_metrics(path / "metrics.jsonl")]

    assert numbers(tmp_path / "a") == numbers(tmp_path / "b")
    assert all(math.isfinite(r.get("loss", 0.0)) for r in numbers(tmp_path / "b"))


def test_a_resume_at_the_stage_boundary_writes_the_teachers_record_once(tmp_path, corpus, one_torch_thread):
    """Stage 2's first record (the teacher's figures, at the boundary's step) is kept by the resume, not repeated."""
    teacher = write_teacher(tmp_path / "teacher")
    kw = dict(pattern="RRA", align_steps=4, steps=4, eval_batches=2)
    Distiller(tiny_run(teacher, corpus, tmp_path / "a", **kw), verbose=0, progress=False).fit()
    full = read_metrics(tmp_path / "a" / "metrics.jsonl")
    assert [r["step"] for r in full if "teacher_val_loss" in r] == [4]
    assert load_checkpoint(tmp_path / "a" / "checkpoint-step-4").extra["distill"]["stage"] == "align"
    quiet = dict(verbose=0, progress=False)
    Distiller.from_checkpoint(tmp_path / "a" / "checkpoint-step-4", distiller_kwargs=quiet).fit()
    resumed = read_metrics(tmp_path / "a" / "metrics.jsonl")
    assert [r["step"] for r in resumed if "teacher_val_loss" in r] == [4]
    assert [(r["step"], r["stage"], sorted(r)) for r in resumed] == [(r["step"], r["stage"], sorted(r)) for r in full]


def test_a_nonfinite_loss_never_replaces_the_last_good_checkpoint(tmp_path, corpus, one_torch_thread, monkeypatch):
    import hybrid.train.distill.stages as run_module

    teacher = write_teacher(tmp_path / "teacher")
    config = tiny_run(teacher, corpus, tmp_path / "out", pattern="RRA", align_steps=2, steps=4, save_every=2,
                      log_every=2)
    distiller = Distiller(config, verbose=0, progress=False)
    real = run_module.distill_loss

    def poisoned(*args, **kwargs):  # from step 3 on, the loss is NaN
        loss, parts = real(*args, **kwargs)
        return (loss * math.nan if distiller.step >= 2 else loss), parts

    monkeypatch.setattr(run_module, "distill_loss", poisoned)
    with pytest.raises(FloatingPointError, match="diverged: the loss or gradient norm was not finite at step 3; "
                                                 "the last good checkpoint is .* \\(step 2\\)"):
        distiller.fit()
    good = load_checkpoint(tmp_path / "out")
    assert good.step == 2 and good.extra["distill"]["stage"] == "align"


def test_set_takes_the_r_layers_dotted_fields_and_their_flat_names(tmp_path, corpus, one_torch_thread):
    teacher = write_teacher(tmp_path / "teacher")
    model = {"recurrence.rotary_dim": 2, "recurrence.hold_below": 0.1, "rnn_selective": True, "window": 8}
    result = Distiller(tiny_run(teacher, corpus, tmp_path / "out", pattern="RRA", model=model, align_steps=1,
                                steps=1), verbose=0, progress=False).fit()
    options = HybridConfig.from_dict(load_checkpoint(tmp_path / "out").config).section("recurrence")
    assert (options.rotary_dim, options.hold_below, options.selective) == (2, 0.1, True)
    assert result.layer_types == "RRA"


@pytest.mark.parametrize("model, message", [
    ({"recurrence.no_such_field": 1}, "--set: expected one of the R layers' fields recurrence.r_min"),
    ({"attention.n_kv_heads": 1}, "got attention.n_kv_heads"),
    ({"rnn_selective": True, "recurrence.selective": True},
     "--set: recurrence.selective: also given as rnn_selective; expected one of the two"),
])
def test_set_refuses_what_is_not_an_r_layer_option_in_one_line(tmp_path, corpus, model, message):
    teacher = write_teacher(tmp_path / "teacher")
    with pytest.raises(ValueError, match=message) as caught:
        Distiller(tiny_run(teacher, corpus, tmp_path / "out", pattern="RRA", model=model, align_steps=1, steps=1),
                  verbose=0, progress=False)
    assert "\n" not in str(caught.value)


def test_accumulated_micro_batches_make_the_update_of_one_batch(tmp_path, corpus, one_torch_thread):
    """On the one loop, a distillation accumulates as hybrid-train does: 2 micro-batches of 2 sequences per step
    make the update of one batch of 4 (the same global batches), in both stages, to float rounding."""
    teacher = write_teacher(tmp_path / "teacher")
    kw = dict(pattern="RRA", align_steps=2, steps=2, ce_weight=0.5)
    one = Distiller(tiny_run(teacher, corpus, tmp_path / "one", batch_size=4, **kw), verbose=0, progress=False).fit()
    two = Distiller(tiny_run(teacher, corpus, tmp_path / "two", batch_size=2, grad_accum=2, **kw),
                    verbose=0, progress=False).fit()
    a, b = load_checkpoint(tmp_path / "one"), load_checkpoint(tmp_path / "two")
    for name, value in a.model_state.items():
        torch.testing.assert_close(b.model_state[name], value, rtol=1e-4, atol=1e-6, msg=name)
    assert two.val_kl == pytest.approx(one.val_kl, rel=1e-4)


def test_packed_offsets_reach_the_device_with_their_host_values_unless_compiled():
    """An eager stage hands the mixers ``PackedOffsets`` carrying the host bounds (no read-back a micro-batch); a
    compiled one the tensor (a host tuple would be a guard that changes every batch)."""
    import torch

    from hybrid.kernels.varlen import PackedOffsets
    from hybrid.train.distill.stages import batch_to_device

    x = y = torch.zeros(1, 7, dtype=torch.long)
    cu = torch.tensor([0, 3, 7])
    _, _, eager = batch_to_device(x, y, cu, torch.device("cpu"), compiled=False)
    assert isinstance(eager, PackedOffsets) and eager.bounds == (0, 3, 7) and torch.equal(eager.cu_seqlens, cu)
    _, _, compiled = batch_to_device(x, y, cu, torch.device("cpu"), compiled=True)
    assert isinstance(compiled, torch.Tensor) and torch.equal(compiled, cu)
    assert batch_to_device(x, y, None, torch.device("cpu"), compiled=False)[2] is None
