"""hybrid-distill under torchrun (gloo, 2 CPU processes): 2 ranks × batch_size B make the updates of one process
with 2B (the same global batches, gradients averaged), in DDP and sharded by FSDP2, every rank ranks the layers alike
and builds the same student, rank 0 alone writes, and a run resumes on another number of ranks (1 -> 2 -> 1) like an
uninterrupted one."""
import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.loop.checkpoint import capture_rng_state, load_checkpoint, save_checkpoint
from hybrid.train.distill import DistillConfig, Distiller
from hybrid.train.cli.distill import main
from hybrid.train.output.metrics import read_metrics
from hybrid.train.data.tokenizer import ByteTokenizer

# One rank of a torchrun job: the Distiller on the config in argv[1]; every write under --out is counted (audit
# hook), and the rank reports what it built (its ranking, its student, a digest of its final weights) in the file
# argv[2] names with {rank} filled in.
RANK_SCRIPT = r"""
import hashlib, json, os, sys

out = os.path.abspath(json.loads(sys.argv[1])["out"])
writes = []
WRITING = ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate", "os.link", "os.symlink")


def audit(event, args):
    if event == "open":
        path, mode, flags = args
        writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(
            flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
    elif event in WRITING:
        path, writing = args[0], True
    else:
        return
    if writing and isinstance(path, (str, bytes, os.PathLike)):
        if os.path.abspath(os.fsdecode(path)).startswith(out):
            writes.append(event)


sys.addaudithook(audit)
import torch
from hybrid.train.distill import DistillConfig, Distiller

torch.set_num_threads(1)
distiller = Distiller(DistillConfig(**json.loads(sys.argv[1])), verbose=0, progress=False)
result = distiller.fit()
digest = hashlib.sha256()  # of the rank's replica (DDP); under FSDP2 each rank holds a shard, and no digest
for name, value in sorted(distiller.model.state_dict().items()) if not distiller.config.fsdp else ():
    digest.update(name.encode() + value.detach().contiguous().numpy().tobytes())
report = {"rank": int(os.environ["RANK"]), "writes": len(writes), "layer_types": result.layer_types,
          "ranking": result.ranking, "weights": None if distiller.config.fsdp else digest.hexdigest(),
          "val_kl": result.val_kl}
with open(sys.argv[2].format(rank=report["rank"]), "w") as f:
    json.dump(report, f)
# A sharded (FSDP2) student sits in reference cycles: dropped and collected here, not at interpreter shutdown,
# where tearing down what holds the gloo group can abort the rank (docs/training.md, "Leaving the job").
del distiller, result
import gc
gc.collect()
"""


def write_teacher(path):
    """A random tiny transformer run with the byte tokenizer."""
    config = HybridConfig.preset("transformer", d_model=32, n_layers=3, n_heads=2, vocab_size=320)
    torch.manual_seed(0)
    save_checkpoint(path, model_state=HybridLM(config).state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0,
                    extra={"tokenizer": ByteTokenizer().to_dict()})
    return path


def torchrun(nproc, *args, timeout=180):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def train_records(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_two_ranks_make_the_updates_of_one_process_and_agree_on_the_student(tmp_path, corpus, one_torch_thread, fsdp):
    teacher = write_teacher(tmp_path / "teacher")
    # eval_batches None: the last global batches have a single row, so rank 1's share of them is empty
    kw = dict(teacher=str(teacher), data=str(corpus), seq_len=16, keep_attention="auto:1", align_steps=3, steps=3,
              ce_weight=0.5, eval_batches=None, select_batches=20, log_every=1, eval_every=2, save_every=2,
              device="cpu")
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    torchrun(2, str(script), json.dumps({**kw, "out": str(tmp_path / "two"), "batch_size": 2, "fsdp": fsdp}),
             str(tmp_path / "rank{rank}.json"))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1]
    zero, one_ = ranks
    assert one_["writes"] == 0 and zero["writes"] > 0  # rank 0 alone writes --out
    for key in ("layer_types", "ranking", "weights", "val_kl"):  # the same ranking, student and weights everywhere
        assert zero[key] == one_[key], key

    single = Distiller(DistillConfig(**kw, out=str(tmp_path / "one"), batch_size=4), verbose=0, progress=False).fit()
    two, one = tmp_path / "two", tmp_path / "one"
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    assert zero["layer_types"] == single.layer_types
    assert [r["layer"] for r in zero["ranking"]] == [r["layer"] for r in single.ranking]
    # A cost is a KL near 0 (~1e-4) from float32 logits that two ranks compute in batches of 2 and one process in
    # batches of 4: their rounding (~1e-6 of the logits) moves it by ~sqrt(KL)·1e-6 ≈ 1e-8 (1.8e-8 measured), which
    # rel=1e-4 alone (8e-9) did not cover once the teacher's load stopped drawing a random init (other students).
    for a, b in zip(zero["ranking"], single.ranking):
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-4, abs=1e-7)

    a, b = read_metrics(two / "metrics.jsonl"), read_metrics(one / "metrics.jsonl")
    assert [(r["step"], r["stage"], sorted(r)) for r in a] == [(r["step"], r["stage"], sorted(r)) for r in b]
    for ra, rb in zip(a, b):  # one record per step and evaluation (rank 0's), the ranks' means
        for key, value in rb.items():
            if key not in ("stage", "tokens_per_s"):
                assert ra[key] == pytest.approx(value, rel=1e-4, abs=1e-9), (ra["step"], key)

    ckpt_two, ckpt_one = load_checkpoint(two), load_checkpoint(one)
    assert ckpt_two.step == ckpt_one.step == 6 and ckpt_two.config == ckpt_one.config
    assert ckpt_two.extra["distill"]["world_size"] == 2 and ckpt_two.data_state["global_batch"] == 4
    for name, value in ckpt_one.model_state.items():
        torch.testing.assert_close(ckpt_two.model_state[name], value, rtol=1e-4, atol=1e-5, msg=name)
    digest = hashlib.sha256()
    for name, value in sorted(ckpt_two.model_state.items()):
        digest.update(name.encode() + value.contiguous().numpy().tobytes())
    assert fsdp or digest.hexdigest() == zero["weights"]  # the checkpoint holds the ranks' weights


def test_a_run_resumes_on_two_ranks_then_on_one_like_an_uninterrupted_run(tmp_path, corpus, one_torch_thread):
    teacher = write_teacher(tmp_path / "teacher")
    # a constant lr (no warmup): a run cut after stage 2's first step and extended follows the same schedule
    common = ["--teacher", str(teacher), "--data", str(corpus), "--pattern", "RRA", "--seq-len", "16", "--batch-size",
              "4", "--align-steps", "2", "--min-lr-ratio", "1", "--ce-weight", "0.5", "--eval-batches", "2",
              "--log-every", "1", "--device", "cpu", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "full"), "--steps", "3"]) == 0
    assert main([*common, "--out", str(tmp_path / "cut"), "--steps", "1"]) == 0
    cut = tmp_path / "cut"
    proc = torchrun(2, "-m", "hybrid.train.cli.distill", "--resume", str(cut), "--steps", "2")  # 1 -> 2 ranks
    assert "batch layout: batch_size 2 × grad_accum 1 × 2 ranks keeps the global batch of 4" in proc.stdout
    assert proc.stdout.count("resuming at step 3 (distill)") == 1 and proc.stdout.count("done at step 4") == 1
    ckpt = load_checkpoint(cut)
    assert ckpt.step == 4 and ckpt.extra["distill"]["world_size"] == 2 and ckpt.extra["distill"]["config"][
        "batch_size"] == 2
    assert main(["--resume", str(cut), "--steps", "3", "--quiet"]) == 0  # 2 -> 1 rank: 2 × 2 accumulated
    ckpt = load_checkpoint(cut)
    saved = ckpt.extra["distill"]["config"]
    assert ckpt.step == 5 and ckpt.extra["distill"]["world_size"] == 1
    assert (saved["batch_size"], saved["grad_accum"]) == (2, 2)

    full = {r["step"]: r["loss"] for r in train_records(tmp_path / "full")}
    resumed = {r["step"]: r["loss"] for r in train_records(cut)}
    assert sorted(resumed) == sorted(full) == [1, 2, 3, 4, 5]
    assert all(resumed[s] == full[s] for s in (1, 2, 3))  # one process, the same batches: bit for bit
    assert all(resumed[s] == pytest.approx(full[s], rel=1e-4) for s in (4, 5))  # step 4 on 2 ranks
    final = load_checkpoint(tmp_path / "full").model_state
    for name, value in final.items():
        torch.testing.assert_close(ckpt.model_state[name], value, rtol=1e-4, atol=1e-5, msg=name)

    # the batch layout follows hybrid-train's rules: another --batch-size keeps the global batch through
    # accumulation; a number of ranks no layout fits goes on with a new global batch, and says so
    again = Distiller.from_checkpoint(cut, batch_size=4)
    assert (again.config.batch_size, again.config.grad_accum) == (4, 1)
    assert "batch layout: batch_size 4 × grad_accum 1 × 1 ranks keeps the global batch of 4" in again.notes
    three = Distiller.from_checkpoint(cut, world_size=3)
    assert any("global batch changes from 4 to 12" in note for note in three.notes)
