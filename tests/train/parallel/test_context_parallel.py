"""`hybrid-train --cp N` on the CPU (torchrun, gloo): a 2-rank context-parallel run's losses equal a 1-rank run's for
10 steps, and a run resumes across cp sizes (saved with --cp 1, resumed with --cp 2 under FSDP2; saved with --cp 2,
resumed with --cp 1) like the uninterrupted run, with documents packed or as one stream, and 4 ranks as 2 data
groups × 2 context ranks train like one process; what has no context-parallel path is refused in one line.

The model, one R, one G and one windowed A layer (the scan's and the G mixer's carries, the conv's and the window's
halos), trains in float64 with packed documents crossing the shard edges (the default packing), so every loss
recorded by the context-parallel runs equals the one-rank run's to the arithmetic's order: the tolerance, 1e-12
relative, is float64 rounding through 10 AdamW steps (the errors measured are below 1e-14)."""
import json
import os
import subprocess
import sys

import pytest

from hybrid.train.cli.lm import train_main
from hybrid.train.loop.checkpoint import load_checkpoint

TOLERANCE = 1e-12
ARGS = ["--d-model", "16", "--n-layers", "3", "--n-heads", "2", "--window", "6", "--seq-len", "24", "--batch-size", "2",
        "--lr", "1e-2", "--warmup", "2", "--log-every", "1", "--eval-every", "0", "--eval-batches", "2", "--device",
        "cpu", "--set", 'dtype="float64"', "--set", 'pattern="RGA"', "--quiet"]


def torchrun(*args, timeout=120, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m",
           "hybrid.train", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def losses(run_dir) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def assert_equal_losses(got: dict, want: dict, steps) -> None:
    assert sorted(got) == list(steps)
    errors = {s: abs(got[s] - want[s]) / abs(want[s]) for s in steps}
    assert max(errors.values()) <= TOLERANCE, errors


def test_two_context_ranks_train_and_resume_like_one(corpus, tmp_path, capsys, one_line_error):
    common = ["--data", str(corpus), "--steps", "10", "--save-every", "5", "--keep", "3", *ARGS]
    one, two = tmp_path / "cp1", tmp_path / "cp2"
    assert train_main([*common, "--out", str(one)]) == 0
    torchrun(*common, "--out", str(two), "--cp", "2")
    want = losses(one)
    assert_equal_losses(losses(two), want, range(1, 11))
    ckpt = load_checkpoint(two)
    assert ckpt.extra["global_batch"] == 2 and ckpt.extra["world_size"] == 2  # 1 data group of 2 context ranks
    assert ckpt.data_state == load_checkpoint(one).data_state

    # The resumed runs record once, at step 10 (--log-every 5: the mean of steps 6 … 10), so their files hold steps
    # 1 … 5 from before the cut and this one record from after it.
    resumed_mean = {10: sum(want[s] for s in range(6, 11)) / 5}
    # saved with --cp 1, resumed on 2 ranks with --cp 2 (and FSDP2): the same global batch, the same losses
    torchrun("--resume", str(one / "checkpoint-step-5"), "--steps", "10", "--log-every", "5", "--cp", "2", "--fsdp",
             "--device", "cpu", "--quiet")
    assert_equal_losses({s: v for s, v in losses(one).items() if s > 5}, resumed_mean, [10])
    assert sorted(losses(one)) == [1, 2, 3, 4, 5, 10]
    # saved with --cp 2, resumed on one process: --cp 1 is asked for, and the message says so
    assert train_main(["--resume", str(two / "checkpoint-step-5"), "--device", "cpu", "--quiet"]) == 2
    one_line_error(capsys, "hybrid-train", "got 2, the checkpoint's (the run was saved with --cp 2); pass --cp 1")
    assert train_main(["--resume", str(two / "checkpoint-step-5"), "--steps", "10", "--log-every", "5", "--cp", "1",
                       "--device", "cpu", "--quiet"]) == 0
    assert_equal_losses({s: v for s, v in losses(two).items() if s > 5}, resumed_mean, [10])
    assert sorted(losses(two)) == [1, 2, 3, 4, 5, 10]
    assert load_checkpoint(one).step == load_checkpoint(two).step == 10


def test_stream_packing_on_two_context_ranks_trains_like_one(corpus, tmp_path):
    """``--packing stream``: each window is one sequence whose recurrences and attention read across the eos, so the
    shards carry every state across their edges (no document boundary stops a carry)."""
    common = ["--data", str(corpus), "--steps", "4", "--save-every", "0", "--packing", "stream", *ARGS]
    assert train_main([*common, "--out", str(tmp_path / "one")]) == 0
    torchrun(*common, "--out", str(tmp_path / "two"), "--cp", "2")
    assert_equal_losses(losses(tmp_path / "two"), losses(tmp_path / "one"), range(1, 5))


def test_two_data_groups_of_two_context_ranks_train_like_one(corpus, tmp_path):
    """4 ranks as a 2 data × 2 context mesh under FSDP2 (the parameters sharded over all four, torchtitan's
    ``dp_shard_cp``): each data group reads half the global batch and splits its sequences in two, and the losses
    are one process's with the whole batch."""
    batch = ARGS.index("--batch-size") + 1
    common = ["--data", str(corpus), "--steps", "4", "--save-every", "4", *ARGS]
    one = list(common)
    one[len(common) - len(ARGS) + batch] = "4"  # one process: the global batch of 2 groups × 2
    assert train_main([*one, "--out", str(tmp_path / "one")]) == 0
    torchrun(*common, "--out", str(tmp_path / "four"), "--cp", "2", "--fsdp", nproc=4, timeout=240)
    assert_equal_losses(losses(tmp_path / "four"), losses(tmp_path / "one"), range(1, 5))
    ckpt = load_checkpoint(tmp_path / "four")
    assert ckpt.extra["global_batch"] == 4 and ckpt.extra["world_size"] == 4


@pytest.mark.parametrize("flags, needles", [
    (["--cp", "2", "--seq-len", "25"], ["seq_len: expected a multiple of cp=2", "got 25"]),
    (["--cp", "2", "--compile"], ["compile: expected False with cp > 1"]),
    (["--cp", "2", "--preset", "transformer", "--set", 'rope_scaling={"rope_type": "dynamic", "factor": 2.0, '
      '"original_max_position_embeddings": 8}'], ["cp: expected 1 for this model", "rotary.scaling", "got 2"]),
    (["--cp", "2"], ["cp: expected a divisor of WORLD_SIZE=1", "got 2"]),
    # every preset has a context-parallel path: vo-gla (the G mixer) passes the model check and meets the job's
    (["--cp", "2", "--preset", "vo-gla"], ["cp: expected a divisor of WORLD_SIZE=1", "got 2"]),
])
def test_refusals_are_one_line(corpus, tmp_path, capsys, one_line_error, flags, needles):
    """A length that does not divide into the shards, an option without a context-parallel path, and a job that
    does not divide into context groups."""
    base = ["--data", str(corpus), "--out", str(tmp_path / "run"), "--steps", "1", "--device", "cpu", "--d-model",
            "16", "--n-layers", "1", "--n-heads", "2", "--quiet"]
    assert train_main([*base, *flags]) == 2
    one_line_error(capsys, "hybrid-train", *needles)
