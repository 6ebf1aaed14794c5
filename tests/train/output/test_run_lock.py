"""One writer per run directory (hybrid.train.run_lock): every command that writes a run or suite directory holds
an exclusive flock on DIR/.hybrid.lock for its life; a second writer is refused at once, in one line naming the
holder's pid, and changes nothing. Each writer is tried against a directory another writer holds."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.cli.bench import bench_main
from hybrid.train.loop.checkpoint import capture_rng_state, save_checkpoint
from hybrid.train.cli.lm import train_main
from hybrid.train.lm.config import TrainConfig
from hybrid.train.cli.distill import main as distill_main
from hybrid.train.distill.config import DistillConfig
from hybrid.train.cli.hf import export_main, import_main
from hybrid.train.cli.rope_analyze import analyze_main
from hybrid.train.output.run_lock import LOCK_FILE, RunDirBusy, RunDirLock, lock_run_dir
from hybrid.train.cli.synthetic import main as synthetic_main
from hybrid.train.data.tokenizer import ByteTokenizer


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def write_run(path: Path, extra: dict | None = None) -> Path:
    config = HybridConfig.preset("transformer", d_model=16, n_layers=2, n_heads=2, vocab_size=320)
    save_checkpoint(path, model_state=HybridLM(config).state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state={"global_batch": 4}, step=2,
                    extra={"tokenizer": ByteTokenizer().to_dict(), **(extra or {})})
    return path


@pytest.fixture
def world(tmp_path):
    """A teacher run, a corpus, a resumable hybrid-train run and a resumable hybrid-distill run (their records
    only: every writer is refused before it reads more)."""
    teacher = write_run(tmp_path / "teacher")
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(6):
        (texts / f"doc{i}.txt").write_text(f"document {i} " * 40)
    train_run = write_run(tmp_path / "train-run", {
        "train_config": TrainConfig(preset="transformer", data=str(texts), out=str(tmp_path / "train-run")).to_dict(),
        "global_batch": 4})
    distill_config = DistillConfig(teacher=str(teacher), pattern="R", data=str(texts), out=str(tmp_path / "d-run"))
    distill_run = write_run(tmp_path / "d-run", {"distill": {
        "config": distill_config.to_dict(), "stage": "align", "stage_step": 0, "world_size": 1,
        "teacher": {"path": str(teacher.resolve()), "sha256": "0" * 64}}})
    return {"teacher": teacher, "texts": texts, "train-run": train_run, "d-run": distill_run, "tmp": tmp_path}


def llama_dir(path: Path) -> Path:
    pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


TINY = ["--preset", "transformer", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--steps", "1",
        "--device", "cpu", "--quiet"]

# (program, main, argv(world), the directory it writes)
WRITERS = [
    ("hybrid-train", train_main, lambda w: ["--data", str(w["texts"]), *TINY, "--out", str(w["tmp"] / "out")], "out"),
    ("hybrid-train", train_main, lambda w: ["--resume", str(w["train-run"]), "--quiet"], "train-run"),
    ("hybrid-distill", distill_main, lambda w: ["--teacher", str(w["teacher"]), "--pattern", "R", "--data",
                                                str(w["texts"]), "--quiet", "--out", str(w["tmp"] / "out")], "out"),
    ("hybrid-distill", distill_main, lambda w: ["--resume", str(w["d-run"]), "--quiet"], "d-run"),
    ("hybrid-synthetic", synthetic_main, lambda w: ["--task", "parity", "--budget", "smoke", "--quiet", "--out",
                                                    str(w["tmp"] / "out")], "out"),
    ("hybrid-synthetic", synthetic_main, lambda w: ["--suite", "state-tracking", "--budget", "smoke", "--quiet",
                                                    "--out", str(w["tmp"] / "out")], "out"),
    ("hybrid-bench", bench_main, lambda w: ["--suite", "baselines", "--quiet", "--out", str(w["tmp"] / "out")],
     "out/baselines"),
    ("hybrid-export", export_main, lambda w: [str(w["teacher"]), str(w["tmp"] / "out")], "out"),
    ("hybrid-import", import_main, lambda w: [str(llama_dir(w["tmp"] / "llama")), str(w["tmp"] / "out")], "out"),
    ("hybrid-rope-analyze", analyze_main, lambda w: [str(w["teacher"]), "--data", str(w["texts"]), "--tokens", "64",
                                                     "--seq-len", "16", "--p-max", "16", "--no-figures", "--quiet", "--out",
                                                     str(w["tmp"] / "out")], "out"),
]


@pytest.mark.parametrize("prog, main, argv, target", WRITERS, ids=[f"{w[0]}-{i}" for i, w in enumerate(WRITERS)])
def test_a_second_writer_is_refused_naming_the_holder(prog, main, argv, target, world, capsys, one_line_error,
                                                      one_torch_thread):
    args = argv(world)  # before the lock: building the inputs may write (a transformers folder)
    directory = world["tmp"] / target
    with RunDirLock(directory, command="another-writer"):
        before = snapshot(directory)
        capsys.readouterr()
        assert main(args) == 2
        one_line_error(capsys, prog, "expected a directory no other process is writing", str(directory),
                       f"pid {os.getpid()}, another-writer")
        assert snapshot(directory) == before
    assert not (directory / LOCK_FILE).exists()


def test_the_lock_names_another_process_and_dies_with_it(tmp_path, capsys, one_line_error, one_torch_thread):
    """A writer in another process (flock, then its pid in the file): hybrid-train is refused naming that pid;
    once the holder is killed (SIGKILL: no clean-up), the lock is free and the stale file blocks no one."""
    out = tmp_path / "dup"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(out / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, f'{os.getpid()} hybrid-train\\n'.encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert train_main([*TINY, "--out", str(out)]) == 2
        one_line_error(capsys, "hybrid-train", f"which pid {holder.pid}, hybrid-train is writing")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / LOCK_FILE).exists()  # stale: nothing removed it
    with lock_run_dir(out, command="next") as lock:
        assert lock.held and (out / LOCK_FILE).read_text() == f"{os.getpid()} next\n"
    assert not (out / LOCK_FILE).exists() and out.is_dir()  # a folder it did not create stays


def test_the_lock_leaves_nothing_behind_and_is_exclusive_within_a_process(tmp_path):
    target = tmp_path / "a" / "b" / "run"
    lock = lock_run_dir(target, command="first")
    with pytest.raises(RunDirBusy, match=rf"^--out: expected a directory no other process is writing, got {target}, "
                                         rf"which pid {os.getpid()}, first is writing"):
        lock_run_dir(target, command="second")
    assert target.is_dir()  # the refused writer removed nothing of the holder's
    lock.release()
    assert not (tmp_path / "a").exists()  # the folders the lock created, with nothing else in them, are gone
    lock.release()  # twice is harmless
    with lock_run_dir(target, command="again"):
        (target / "metrics.jsonl").write_text("")
    assert sorted(p.name for p in target.iterdir()) == ["metrics.jsonl"]  # written into: kept
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="^--out: expected a directory, got the file"):
        lock_run_dir(tmp_path / "afile", command="x")


def test_a_directory_the_system_refuses_is_one_line_naming_the_argument(tmp_path, capsys, one_line_error,
                                                                        monkeypatch):
    """The issue: `--out /proc/x` was "hybrid-train: error: /proc/x: No such file or directory", naming no argument."""
    if Path("/proc/self").is_dir():
        assert train_main(["--out", "/proc/x", "--steps", "1", "--quiet"]) == 2
        one_line_error(capsys, "hybrid-train", "out: expected a directory this process can create and write, got "
                                               "/proc/x (/proc/x: No such file or directory)")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / "run"))

    monkeypatch.setattr(Path, "mkdir", refuse)  # a read-only parent, whoever runs the test (root is never refused)
    with pytest.raises(ValueError, match=r"^--out: expected a directory this process can create and write, got "
                                         r".*run \(.*run: Permission denied\)$"):
        lock_run_dir(tmp_path / "ro" / "run", command="x")
