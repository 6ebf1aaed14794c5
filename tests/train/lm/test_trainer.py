"""Trainer: loss goes down, bit-exact resume, checkpoint round trips, torn saves, config rules, decay rule."""
import json
import math
from pathlib import Path

import pytest
import torch

import hybrid.train.loop.checkpoint as ck
from hybrid.kernels.varlen import PackedOffsets
from hybrid.models import HybridConfig, HybridLM
from hybrid.train.loop.checkpoint import CheckpointError, load_checkpoint
from hybrid.train.lm.config import TrainConfig
from hybrid.train.data import prepare_data
from hybrid.train.parallel.distributed import full_optimizer_state
from hybrid.train.loop.optim import param_groups
from hybrid.train.loop.resume import resume_config
from hybrid.train.parallel.sharding import GlobalBatches
from hybrid.train.lm.trainer import Trainer

TINY_MODEL = {"d_model": 32, "n_layers": 3, "n_heads": 2, "window": 16}


def tiny(corpus, out, **kw) -> TrainConfig:
    base = dict(model=dict(TINY_MODEL), data=str(corpus), seq_len=32, batch_size=4, steps=8, lr=1e-2, warmup=2,
                eval_every=0, eval_batches=2, log_every=1, save_every=4, out=str(out))
    return TrainConfig(**{**base, **kw})


def run(config, **kw):
    return Trainer(config, verbose=0, progress=False, **kw).fit()


class Stop(Exception):
    pass


def stop_at(step):
    def hook(record):
        if record["step"] == step:
            raise Stop

    return hook


def test_a_few_steps_lower_the_loss(corpus, tmp_path):
    result = run(tiny(corpus, tmp_path / "run", steps=30, warmup=3, save_every=0, eval_every=15))
    losses = result.losses
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses.values())
    assert losses[30] < losses[1] - 1.5
    assert math.isfinite(result.val_bpb) and result.val_bpb < result.unigram_bpb
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "loss", "lr", "tokens_per_s"} <= set(records[0])
    assert [r["step"] for r in records if "val_loss" in r] == [15, 30]
    assert all({"val_loss", "val_bpb"} <= set(r) for r in records if "val_loss" in r)
    for name in ("loss.png", "train_config.json", "checkpoint/model.safetensors"):
        assert (tmp_path / "run" / name).is_file(), name
    assert result.model_config.vocab_size == 320  # 259 byte tokens rounded up to a multiple of 64


@pytest.mark.parametrize("packing", ["documents", "stream"])
def test_exact_resume_is_bit_exact(corpus, tmp_path, packing):
    config = dict(steps=8, batch_size=2, grad_accum=2, save_every=4, eval_every=4, packing=packing)
    full = run(tiny(corpus, tmp_path / "full", **config))
    with pytest.raises(Stop):  # interrupted after step 6: the checkpoint of step 4 survives
        run(tiny(corpus, tmp_path / "cut", **config), on_log=stop_at(6))
    assert load_checkpoint(tmp_path / "cut").step == 4
    resumed = Trainer.from_checkpoint(tmp_path / "cut", trainer_kwargs=dict(verbose=0)).fit()
    assert sorted(resumed.losses) == [5, 6, 7, 8]
    assert all(resumed.losses[s] == full.losses[s] for s in resumed.losses)  # bit for bit
    assert resumed.val_loss == full.val_loss
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "cut")
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)
    metrics = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if "loss" in r] == list(range(1, 9))  # records after step 4 replaced


def test_validation_scores_the_same_sequences_in_any_layout_of_the_global_batch(corpus, tmp_path):
    """The issue: resumed with --batch-size 2 --grad-accum 2, a --batch-size 4 --eval-batches 2 run scored val on
    half the tokens (eval_batches counted micro-batches). Now eval_batches × the global batch, however laid out."""
    run(tiny(corpus, tmp_path / "run", steps=2, save_every=2))
    evals = {}
    for batch_size, grad_accum in ((4, 1), (2, 2), (1, 4), (3, None)):
        trainer = Trainer.from_checkpoint(tmp_path / "run", batch_size=batch_size, grad_accum=grad_accum,
                                          trainer_kwargs=dict(verbose=0))
        (record,) = [r for r in trainer.fit().history if "val_loss" in r]  # at the final step: evaluates only
        evals[batch_size, trainer.config.grad_accum] = record
    tokens = {r["val_tokens"] for key, r in evals.items() if key != (3, 1)}
    assert tokens == {2 * 4 * 32}  # eval_batches 2 × the global batch of 4 sequences × seq_len 32
    losses = [r["val_loss"] for key, r in evals.items() if key != (3, 1)]
    assert max(losses) - min(losses) < 1e-5 * abs(losses[0])  # equal up to the order of the sums
    assert evals[3, 1]["val_tokens"] == 2 * 3 * 32  # another global batch (3: no layout keeps 4), another size


def test_resume_extends_the_run_with_a_new_total(corpus, tmp_path):
    run(tiny(corpus, tmp_path / "run", steps=4, warmup=1))
    more = Trainer.from_checkpoint(tmp_path / "run", steps=6, trainer_kwargs=dict(verbose=0)).fit()
    assert sorted(more.losses) == [5, 6] and more.step == 6
    schedule = load_checkpoint(tmp_path / "run").scheduler_state["lr_lambdas"][0]
    assert schedule["total"] == 6


def test_checkpoint_round_trip_through_the_trainer(corpus, tmp_path):
    run(tiny(corpus, tmp_path / "run", steps=4))
    saved = load_checkpoint(tmp_path / "run")
    trainer = Trainer.from_checkpoint(tmp_path / "run", trainer_kwargs=dict(verbose=0))
    trainer.fit()  # at the final step already: restores, evaluates, trains nothing
    model = trainer.model
    assert model.lm_head.weight is model.embed.weight  # still tied
    assert all(torch.equal(v, saved.model_state[k]) for k, v in model.state_dict().items())
    optim_state = full_optimizer_state(model, trainer.optimizer)
    assert optim_state["state"].keys() == saved.optimizer_state["state"].keys()
    for name, state in saved.optimizer_state["state"].items():
        assert all(torch.equal(state[k], optim_state["state"][name][k]) for k in state), name
    assert trainer.scheduler.last_epoch == 4 and trainer.step == 4
    assert trainer.batches.state_dict() == saved.data_state


def test_torn_checkpoint_write_keeps_the_previous_one(corpus, tmp_path, monkeypatch):
    config = dict(steps=8, save_every=2)
    full = run(tiny(corpus, tmp_path / "full", **config))
    real_save, calls = torch.save, []

    def torn(obj, path, *args, **kwargs):  # the second save dies after writing part of its files
        if Path(path).name == ck.STATE:
            calls.append(1)
            if len(calls) == 2:
                Path(path).write_bytes(b"half a file")
                raise OSError("disk full (simulated)")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(OSError, match="simulated"):
        run(tiny(corpus, tmp_path / "cut", **config))
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(tmp_path / "cut").step == 2
    (tmp_path / "cut" / "checkpoint-tmp-killed").mkdir()  # what a SIGKILLed save leaves behind
    resumed = Trainer.from_checkpoint(tmp_path / "cut", trainer_kwargs=dict(verbose=0)).fit()
    assert all(resumed.losses[s] == full.losses[s] for s in range(3, 9))
    assert not list((tmp_path / "cut").glob("checkpoint-tmp-*"))


def test_bad_checkpoints_and_run_directories_are_refused(corpus, tmp_path):
    run(tiny(corpus, tmp_path / "run", steps=2, save_every=0))
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        run(tiny(corpus, tmp_path / "run", steps=2))
    with pytest.raises(ValueError, match="seq_len: cannot change when resuming"):
        Trainer.from_checkpoint(tmp_path / "run", seq_len=64)
    with pytest.raises(ValueError, match="steps: expected .* at least .* step 2"):
        Trainer.from_checkpoint(tmp_path / "run", steps=1)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer.from_checkpoint(tmp_path / "nothing-here")
    state = tmp_path / "run" / "checkpoint" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="trainer_state.pt"):
        Trainer.from_checkpoint(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="data path not found"):
        run(tiny(tmp_path / "no-such-dir", tmp_path / "other"))


@pytest.mark.parametrize("field,value", [("steps", 0), ("lr", -1.0), ("preset", "gpt"), ("size", "huge"),
                                         ("warmup", 5000), ("betas", (0.9,)), ("device", "tpu"),
                                         ("eval_batches", 0), ("valid_fraction", 1.0), ("model", "RRA"),
                                         ("keep", 0), ("on_nonfinite", "ignore"), ("warmup", -1)])
def test_train_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        TrainConfig(**{field: value})


def test_train_config_round_trips_as_plain_values():
    c = TrainConfig(model={"pattern": "RA"}, betas=(0.8, 0.9), eval_batches=None, grad_clip=0)
    assert c.grad_clip is None
    assert TrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_weight_decay_only_on_linear_and_embedding_weights():
    model = HybridLM(HybridConfig.preset("hybrid", "tiny", carope=True, rnn_selective=True, **TINY_MODEL))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    linear = {n + ".weight" for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    assert set(decay["names"]) == linear - {"lm_head.weight"}  # the tied head is the embedding, counted once
    assert any(n.endswith("decay_nu") for n in no_decay["names"])
    assert any("gate_weight" in n for n in no_decay["names"]) and any("carope" in n for n in no_decay["names"])
    kinds = ("norm", "conv", "decay_nu", "gate", "carope")
    assert all(any(k in n for k in kinds) for n in no_decay["names"])
    n_params = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n_params == model.num_parameters()


def test_global_batches_do_not_depend_on_the_rank_layout(corpus):
    data = prepare_data(str(corpus))
    one = GlobalBatches(data, seq_len=16, batch_size=4, grad_accum=1, seed=3)
    two = [GlobalBatches(data, seq_len=16, batch_size=1, grad_accum=2, seed=3, rank=r, world_size=2)
           for r in range(2)]
    for _ in range(3):
        (x, y, cu), = one.next_step()
        assert cu is None  # packing="stream" (GlobalBatches' default)
        parts = [two[r].next_step() for r in range(2)]
        rows = torch.cat([parts[r][a][0] for a in range(2) for r in range(2)])  # micro a, rank r
        assert torch.equal(rows, x)
    state = one.state_dict()
    assert state["samples_total"] == 12 and state["samples_in_epoch"] == 12
    half = GlobalBatches(data, seq_len=16, batch_size=2, grad_accum=1, seed=3)
    assert half.load_state_dict(state)  # 12 is a multiple of 2: exact
    (x_half, _, _), = half.next_step()
    (x_one, _, _), = one.next_step()
    assert torch.equal(x_half, x_one[:2])


def test_global_batches_packed_by_documents(corpus):
    """packing="documents": each micro-batch is one row with an offset at every window start and every eos."""
    data = prepare_data(str(corpus))
    stream = GlobalBatches(data, seq_len=16, batch_size=4, grad_accum=1, seed=3)
    packed = GlobalBatches(data, seq_len=16, batch_size=4, grad_accum=1, seed=3, packing="documents")
    eos = data.tokenizer.eos_id
    for _ in range(3):
        (x, y, _), = stream.next_step()
        (px, py, cu), = packed.next_step()
        assert torch.equal(px, x.reshape(1, -1)) and torch.equal(py, y.reshape(1, -1))
        starts = set(cu[:-1].tolist())
        want = {r * 16 for r in range(4)} | {i for i in range(64) if i % 16 and int(px[0, i]) == eos}
        assert starts == want and int(cu[-1]) == 64 and cu.dtype == torch.int64


def test_resume_keeps_the_global_batch_on_a_new_rank_count():
    saved = TrainConfig(batch_size=4, grad_accum=1)
    config, notes = resume_config(saved, saved_global_batch=8, world_size=1, out="x")  # was 2 ranks × 4
    assert (config.batch_size, config.grad_accum) == (4, 2) and "keeps the global batch" in notes[0]
    config, notes = resume_config(saved, saved_global_batch=4, world_size=2, out="x", grad_accum=1)
    assert (config.batch_size, config.grad_accum) == (2, 1)
    config, notes = resume_config(saved, saved_global_batch=4, world_size=3, out="x")
    assert (config.batch_size, config.grad_accum) == (4, 1) and "global batch changes" in notes[0]
    config, _ = resume_config(TrainConfig(model={"window": 16}), saved_global_batch=16, world_size=1, out="x",
                              model={"window": 16}, steps=5000, eval_every=7)
    assert config.steps == 5000 and config.eval_every == 7 and config.out == "x"
    with pytest.raises(ValueError, match="model: cannot change"):
        resume_config(saved, saved_global_batch=4, world_size=1, out="x", model={"n_layers": 2})


def test_documents_packing_feeds_document_offsets_to_training_and_validation(corpus, tmp_path, monkeypatch):
    """packing="documents": every forward of training and validation gets the windows as one packed row with
    an offset at each window start and each eos, with their host values (``PackedOffsets``: the model reads
    nothing back from the device), and builds no decoding state; "stream" passes no offsets."""
    seen = []
    original = HybridLM.forward

    def spy(self, ids, *args, cu_seqlens=None, output_final_state=True, **kw):
        if cu_seqlens is not None:
            assert isinstance(cu_seqlens, PackedOffsets) and list(cu_seqlens.bounds) == cu_seqlens.cu_seqlens.tolist()
        seen.append((tuple(ids.shape), None if cu_seqlens is None else list(cu_seqlens.bounds), output_final_state,
                     ids[0].tolist()))
        return original(self, ids, *args, cu_seqlens=cu_seqlens, output_final_state=output_final_state, **kw)

    monkeypatch.setattr(HybridLM, "forward", spy)
    docs = run(tiny(corpus, tmp_path / "docs", steps=3, eval_every=3, save_every=0, packing="documents"))
    packed = [s for s in seen if s[0][1] > 1]
    assert packed and all(s[0][0] == 1 and s[1] is not None and s[2] is False for s in packed)
    eos = prepare_data(str(corpus)).tokenizer.eos_id
    for shape, cu, _, ids in packed:
        L = 32 if shape[1] % 32 == 0 else shape[1]
        want = sorted({i for i in range(0, shape[1], L)} | {i for i, t in enumerate(ids) if t == eos and i % L})
        assert cu[:-1] == want and cu[-1] == shape[1]
    assert any(len(cu) > shape[1] // 32 + 1 for shape, cu, _, _ in packed)  # some window holds a document start
    seen.clear()
    stream = run(tiny(corpus, tmp_path / "stream", steps=3, eval_every=3, save_every=0, packing="stream"))
    assert seen and all(s[1] is None and s[2] is False for s in seen)
    assert docs.losses[1] == stream.losses[1] or docs.losses[3] != stream.losses[3]  # the contexts differ


def test_compiled_training_on_packed_documents_compiles_once_for_every_document_count(corpus, tmp_path, monkeypatch,
                                                                                    graph_recorder):
    """--compile with packing="documents": the document count N changes from step to step, the graphs do not. The
    stage hands the model the offsets with their host values (no read back), the model hands its compiled blocks
    the tensor alone, marked dynamic in its length (``HybridLM.blocks_run_as``), and the blocks' training path reads
    no Python value of N. A counting backend stands in for inductor."""
    import hybrid.train.lm.stage as stage

    counting, counts = graph_recorder(), []
    graphs = counting.graphs
    compile_ = torch.compile

    def on_device(cu, device, compiled):
        assert not compiled
        counts.append(cu.numel() - 1)
        return original_on_device(cu, device, compiled)

    original_on_device = stage.packed_on_device
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compile_(model, backend=counting))
    monkeypatch.setattr(stage, "packed_on_device", on_device)
    torch.compiler.reset()
    trainer = Trainer(tiny(corpus, tmp_path / "run", steps=6, seq_len=64, save_every=0, packing="documents",
                           compile=True), verbose=0, progress=False)
    trainer.fit()
    torch.compiler.reset()
    assert len(set(counts)) >= 3, f"document counts {counts}: the test needs several"
    kinds = set(trainer.model_config.layer_types)  # the tiny hybrid's R and A: one graph serves each kind, every N
    assert len(kinds) == 2 and len(graphs) == len(kinds), f"{len(graphs)} graphs for document counts {counts}"


def test_runs_saved_before_packing_resume_on_the_stream(corpus, tmp_path):
    run(tiny(corpus, tmp_path / "old", steps=4, save_every=2, packing="stream"))
    ckpt = load_checkpoint(tmp_path / "old")
    record = dict(ckpt.extra["train_config"])
    del record["packing"]  # as a checkpoint of an earlier release records it
    ck.save_checkpoint(tmp_path / "old", model_state=ckpt.model_state, config=ckpt.config,
                       optimizer_state=ckpt.optimizer_state, scheduler_state=ckpt.scheduler_state,
                       rng_state=ckpt.rng_state, data_state=ckpt.data_state, step=ckpt.step,
                       extra={**ckpt.extra, "train_config": record})
    trainer = Trainer.from_checkpoint(tmp_path / "old", steps=6, trainer_kwargs=dict(verbose=0))
    assert trainer.config.packing == "stream"


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_resume_between_two_records_writes_the_uninterrupted_runs_records(corpus, tmp_path):
    """Probe finding 6: with --log-every 4 --save-every 6, a run interrupted after step 8 resumed from step 6, and
    its step-8 record averaged steps 7-8 only (5-6 were in no record). The sums since the last record are a
    checkpoint part now: every record equals the uninterrupted run's, the losses bit for bit; only the measured
    tokens_per_s differs."""
    config = dict(steps=16, log_every=4, save_every=6, eval_every=0)
    run(tiny(corpus, tmp_path / "full", **config))
    with pytest.raises(Stop):
        run(tiny(corpus, tmp_path / "cut", **config), on_log=stop_at(8))
    assert load_checkpoint(tmp_path / "cut").step == 6
    Trainer.from_checkpoint(tmp_path / "cut", trainer_kwargs=dict(verbose=0)).fit()
    full, cut = _records(tmp_path / "full"), _records(tmp_path / "cut")
    assert [r["step"] for r in cut] == [r["step"] for r in full] == [4, 8, 12, 16, 16]
    strip = lambda r: {k: v for k, v in r.items() if k != "tokens_per_s"}  # noqa: E731
    assert [strip(r) for r in cut] == [strip(r) for r in full]  # loss, lr, grad_norm, val_*: bit for bit


def test_a_checkpoint_without_the_pending_record_still_resumes(corpus, tmp_path):
    """A checkpoint written before the pending record was a part resumes as before: the next record averages the
    steps since the resume."""
    run(tiny(corpus, tmp_path / "old", steps=8, log_every=4, save_every=6))
    ckpt = load_checkpoint(tmp_path / "old" / "checkpoint-step-6")
    assert ckpt.extra["pending_record"]["steps"] == 2  # steps 5 and 6, not recorded yet
    extra = {k: v for k, v in ckpt.extra.items() if k != "pending_record"}
    ck.save_checkpoint(tmp_path / "older", model_state=ckpt.model_state, config=ckpt.config,
                       optimizer_state=ckpt.optimizer_state, scheduler_state=ckpt.scheduler_state,
                       rng_state=ckpt.rng_state, data_state=ckpt.data_state, step=ckpt.step, extra=extra)
    resumed = Trainer.from_checkpoint(tmp_path / "older", trainer_kwargs=dict(verbose=0)).fit()
    assert sorted(resumed.losses) == [8] and math.isfinite(resumed.losses[8])


def test_resuming_a_finished_run_writes_no_second_evaluation(corpus, tmp_path):
    """Probe finding 10: each resume of a finished run appended another identical evaluation record at its last
    step. It is figured for the result and shown, not written again."""
    first = run(tiny(corpus, tmp_path / "run", steps=4))
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    for _ in range(2):
        again = Trainer.from_checkpoint(tmp_path / "run", trainer_kwargs=dict(verbose=0)).fit()
        assert again.step == 4 and again.val_loss == first.val_loss
        assert [r["step"] for r in again.history] == [4] and "val_loss" in again.history[0]
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    (tmp_path / "run" / "metrics.jsonl").unlink()  # a record that is not there is written
    Trainer.from_checkpoint(tmp_path / "run", trainer_kwargs=dict(verbose=0)).fit()
    assert [r["step"] for r in _records(tmp_path / "run") if "val_loss" in r] == [4]
