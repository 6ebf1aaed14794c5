"""``python -m hybrid.train.bench.compile_cache``: a command's Triton and Inductor caches saved to one file and
restored under another root in a later run, where they hit. The Triton kernel is compiled for sm_90 ahead of
time (no GPU needed), outside the interpreter that the rest of the suite runs under."""
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest

from hybrid.train.bench import compile_cache

COMPILES = '''
import json, torch, triton, triton.language as tl
from torch._dynamo.utils import counters
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)

signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
kernel = triton.compile(ASTSource(copy_kernel, signature, {"BLOCK": 128}), target=GPUTarget("cuda", 90, 32))
x = torch.randn(37, dtype=torch.float64)
y = torch.compile(lambda t: torch.sin(t) * 2 + t.cos())(x)
torch.testing.assert_close(y, torch.sin(x) * 2 + x.cos(), rtol=1e-12, atol=1e-12)
print(json.dumps({"asm": sorted(kernel.asm), "inductor": dict(counters["inductor"])}))
'''


def wrapped(tmp_path, *args, command=None):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_CACHE_DIR",
                                                               "TORCHINDUCTOR_CACHE_DIR")}
    command = command or [sys.executable, str(tmp_path / "compiles.py")]
    return subprocess.run([sys.executable, "-m", "hybrid.train.bench.compile_cache", *map(str, args), "--",
                           *command], capture_output=True, text=True, env=env, timeout=300)


def last_json(done):
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def test_a_saved_cache_hits_when_restored_under_another_root(tmp_path):
    (tmp_path / "compiles.py").write_text(COMPILES)
    saved = tmp_path / "cache.tgz"
    first = last_json(wrapped(tmp_path, "--root", tmp_path / "first", "--save", saved, "--note", "commit abc"))
    assert {"cubin", "ptx", "ttir"} <= set(first["asm"])  # compiled here, every level of text
    assert first["inductor"].get("fxgraph_cache_miss") == 1 and not first["inductor"].get("fxgraph_cache_hit")
    with tarfile.open(saved) as tar:
        names = tar.getnames()
    assert not [n for n in names if n.endswith(compile_cache.TRITON_TEXTS)], names
    assert any(n.endswith(".cubin") for n in names) and any("/fxgraph/" in n for n in names)

    (tmp_path / "first").rename(tmp_path / "gone")  # nothing of the first root is left to find
    done = wrapped(tmp_path, "--root", tmp_path / "second", "--restore", saved)
    second = last_json(done)
    assert second["asm"] == ["cubin"]  # loaded from the restored, trimmed entry: a fresh compile has every text
    assert second["inductor"].get("fxgraph_cache_hit") == 1 and not second["inductor"].get("fxgraph_cache_miss")
    assert f"restored {saved} into {tmp_path / 'second'}, which holds 1 Triton kernels, 0 autotunings, 1 Inductor " \
           f"graphs (packed made " in done.stdout and "commit abc" in done.stdout
    (group,) = (tmp_path / "second" / "triton").rglob("__grp__*")
    members = json.loads(group.read_text())["child_paths"].values()
    assert members and all(p.startswith(str(tmp_path / "second")) for p in members)


def fake_root(root, incompressible_bytes: int):
    """A Triton entry (binary, metadata, a text) and an Inductor graph of random, incompressible bytes."""
    entry = root / "triton" / "HASH"
    entry.mkdir(parents=True)
    (entry / "k.cubin").write_bytes(b"\0" * 1000)
    (entry / "k.json").write_text("{}")
    (entry / "k.ptx").write_bytes(os.urandom(incompressible_bytes))
    (entry / "__grp__k.json").write_text(json.dumps({"child_paths": {
        n: str(entry / n) for n in ("k.cubin", "k.json", "k.ptx")}}))
    (root / "triton" / "AUTO").mkdir()
    (root / "triton" / "AUTO" / "scan.autotune.json").write_text("{}")
    graph = root / "inductor" / "fxgraph" / "ab" / "entry"
    graph.mkdir(parents=True)
    (graph / "0").write_bytes(os.urandom(incompressible_bytes))


def test_a_file_too_large_leaves_inductor_out_then_everything(tmp_path):
    fake_root(tmp_path / "root", 300_000)
    target = tmp_path / "c.tgz"
    umask = os.umask(0o022)
    try:
        said = compile_cache.save(tmp_path / "root", target, max_mib=1.0)
    finally:
        os.umask(umask)
    assert said.startswith("compile cache: saved 1 Triton kernels, 1 autotunings, 1 Inductor graphs")
    assert target.stat().st_mode & 0o777 == 0o644  # not the private mode of the temporary file it was written as
    said = compile_cache.save(tmp_path / "root", target, max_mib=0.2)  # the .ptx is left out, the graph is not
    assert "saved 1 Triton kernels, 1 autotunings, 0 Inductor graphs" in said and "1 Inductor graphs left out" in said
    with tarfile.open(target) as tar:
        assert not [n for n in tar.getnames() if n.startswith("inductor")]
        group = json.load(tar.extractfile("triton/HASH/__grp__k.json"))
    assert sorted(group["child_paths"]) == ["k.cubin", "k.json"]
    said = compile_cache.save(tmp_path / "root", tmp_path / "none.tgz", max_mib=1e-4)
    assert said.startswith("compile cache: not saved") and not (tmp_path / "none.tgz").exists()
    assert not list(tmp_path.glob("*.part"))


def kernel_entry(root, name: str, cubin_bytes: int, age_s: float):
    """A Triton entry holding one compiled kernel of ``cubin_bytes`` random bytes, made ``age_s`` seconds ago."""
    entry = root / "triton" / f"H{name.upper()}"
    entry.mkdir(parents=True)
    (entry / f"{name}.cubin").write_bytes(os.urandom(cubin_bytes))
    (entry / f"{name}.json").write_text(json.dumps({"name": name, "triton_version": "3.6.0",
                                                    "target": {"backend": "cuda", "arch": 90, "warp_size": 32}}))
    (entry / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {
        n: str(entry / n) for n in (f"{name}.cubin", f"{name}.json")}}))
    for path in entry.iterdir():
        os.utime(path, (path.stat().st_mtime - age_s,) * 2)
    return entry


def test_past_the_cap_triton_keeps_the_librarys_kernels_first_then_the_newest(tmp_path):
    """When Triton's part alone is too large (a warm machine holding two commands' kernels), the save keeps
    the library's kernels (a prewarm's among them) and the autotunings, then Inductor's newest kernels, and says
    how many it left out (before, it saved nothing)."""
    root = tmp_path / "root"
    ours = [kernel_entry(root, f"runs_fwd_kernel_{i}", 100_000, age_s=1000) for i in range(3)]
    inductors = [kernel_entry(root, f"triton_poi_fused_{i}", 100_000, age_s=500 - 100 * i) for i in range(4)]
    (root / "triton" / "AUTO").mkdir()
    (root / "triton" / "AUTO" / "runs_fwd_kernel.autotune.json").write_text("{}")
    (root / "triton" / "prewarm_keys.json").write_text("{}")
    said = compile_cache.save(root, tmp_path / "c.tgz", max_mib=0.5)  # room for about 4 of the 7 kernels
    with tarfile.open(tmp_path / "c.tgz") as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile(compile_cache.MANIFEST))
    assert tmp_path.joinpath("c.tgz").stat().st_size <= 0.5 * 2 ** 20
    kept = {n.split("/")[1] for n in names if n.startswith("triton/") and n.count("/") == 2}
    assert {e.name for e in ours} | {"AUTO"} <= kept, kept
    assert "triton/prewarm_keys.json" in names
    kept_inductors = [e.name for e in inductors if e.name in kept]
    assert kept_inductors == [e.name for e in inductors[::-1]][:len(kept_inductors)]  # the newest ones
    assert 1 <= len(kept_inductors) < len(inductors)
    assert manifest["kernels"] == {"Triton 3.6.0, cuda sm_90": len(ours) + len(kept_inductors)}  # not the wrapper's
    left = len(inductors) - len(kept_inductors)
    assert said.startswith(f"compile cache: saved {len(ours) + len(kept_inductors)} Triton kernels, 1 autotunings, "
                           f"0 Inductor graphs") and f"{left} Triton kernels and 0 autotunings left out" in said, said


def test_a_base_file_is_restored_first_and_left_out_of_the_save(tmp_path, capfd):
    """The prewarm's kernels travel in their own file (``--base``): a session restores them and the earlier
    session's file, and saves only what is not the base's, its own sidecar of keys included, so that the two stay
    under the cap apart."""
    made = tmp_path / "made"
    prewarmed = [kernel_entry(made, f"runs_fwd_kernel_{i}", 1000, age_s=0) for i in range(2)]
    (made / "triton" / "prewarm_keys.json").write_text(json.dumps({e.name: {} for e in prewarmed}))
    assert compile_cache.save(made, tmp_path / "base.tgz").startswith("compile cache: saved 2 Triton kernels")
    earlier = tmp_path / "earlier"
    kernel_entry(earlier, "triton_poi_fused_0", 1000, age_s=0)
    compile_cache.save(earlier, tmp_path / "session.tgz")

    new_kernel = "from pathlib import Path; import os; e = Path(os.environ['TRITON_CACHE_DIR']) / 'HNEW'; " \
                 "e.mkdir(); (e / '__grp__new.json').write_text('{}'); (e / 'new.json').write_text('{}')"
    rc = compile_cache.main(["--root", str(tmp_path / "r"), "--base", str(tmp_path / "base.tgz"), "--restore",
                             str(tmp_path / "session.tgz"), "--save", str(tmp_path / "next.tgz"), "--",
                             sys.executable, "-c", new_kernel])
    said = capfd.readouterr().out
    assert rc == 0, said
    assert "holds 2 Triton kernels" in said and "holds 3 Triton kernels" in said  # the base, then both
    assert "saved 2 Triton kernels, 0 autotunings, 0 Inductor graphs" in said, said
    assert "not the 2 Triton kernels of --base" in said
    with tarfile.open(tmp_path / "next.tgz") as tar:
        entries = {n.split("/")[1] for n in tar.getnames() if n.startswith("triton/")}
    assert entries == {"HTRITON_POI_FUSED_0", "HNEW"}, entries  # no base entry, no prewarm_keys.json


def test_a_missing_or_broken_file_is_a_cold_start_and_the_command_still_runs(tmp_path, capfd):
    show_cache = [sys.executable, "-c", "import os, sys; print(os.environ['TRITON_CACHE_DIR']); sys.exit(3)"]
    rc = compile_cache.main(["--root", str(tmp_path / "r"), "--restore", str(tmp_path / "absent.tgz"), "--",
                             *show_cache])
    said = capfd.readouterr().out
    assert rc == 3  # the command's own exit status
    assert f"cold start: no file at {tmp_path / 'absent.tgz'}" in said and str(tmp_path / "r" / "triton") in said
    (tmp_path / "broken.tgz").write_bytes(b"not a tar")
    rc = compile_cache.main(["--root", str(tmp_path / "r"), "--restore", str(tmp_path / "broken.tgz"), "--",
                             sys.executable, "-c", "pass"])
    assert rc == 0 and "cold start: could not restore" in capfd.readouterr().out


@pytest.mark.parametrize("args,message", [
    ([], "COMMAND: expected '-- COMMAND [ARG ...]' to run, got nothing"),
    (["--save", "EXISTING", "--", "true"], "--save: expected a new file (or --overwrite), got"),
    (["--max-mib", "0", "--", "true"], "--max-mib: expected a size > 0, got 0"),
])
def test_bad_arguments_get_one_line(tmp_path, capsys, args, message):
    (tmp_path / "EXISTING").write_text("a user's file")
    args = [str(tmp_path / a) if a == "EXISTING" else a for a in args]
    assert compile_cache.main(args) == 2
    said = capsys.readouterr().err
    assert message in said and len(said.strip().splitlines()) == 1
    assert (tmp_path / "EXISTING").read_text() == "a user's file"


def test_the_gpu_checks_report_says_what_was_restored(tmp_path):
    """The check under the wrapper, as docs/gpu.md runs it: its header names the caches, and the saved file is
    an eighth file at most beside its outputs."""
    out = tmp_path / "out"
    check = [sys.executable, "-m", "hybrid.train.bench.gpu_check", "--out", str(out), "--dry-run", "--parts",
             "models", "--limits", "models=1"]
    done = wrapped(tmp_path, "--root", tmp_path / "r", "--restore", tmp_path / "none.tgz", "--save",
                   out / "compile_cache.tgz", command=check)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    header = json.loads((out / "results.json").read_text())["header"]
    assert header["compile_cache"] == f"cold start: no file at {tmp_path / 'none.tgz'}"
    assert f"Compile caches at the start: cold start: no file at {tmp_path / 'none.tgz'}; Triton build " \
        f"{header['triton_build']}." in (out / "report.md").read_text()
    assert re.fullmatch(r"[0-9a-f]{12}", header["triton_build"])
    assert (out / "compile_cache.tgz").is_file() and len(list(out.iterdir())) <= 8


def test_suite_records_say_what_the_wrapper_restored(monkeypatch):
    """hybrid-bench's records (their ``machine``) carry the wrapper's note, so a first step's seconds are read as
    warm or cold."""
    from hybrid.train.suite.records import machine

    monkeypatch.delenv(compile_cache.NOTE_VARIABLE, raising=False)
    assert "compile_cache" not in machine()
    monkeypatch.setenv(compile_cache.NOTE_VARIABLE, "restored 3 Triton kernels")
    assert machine()["compile_cache"] == "restored 3 Triton kernels"


def device_lines() -> list[str]:
    """The device command lines of docs/gpu.md that train or check (one shell line each)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "gpu.md").read_text(encoding="utf-8")
    return [line for line in doc.splitlines() if line.startswith("export ")
            and ("hybrid.train.bench.gpu_check" in line or "hybrid.train.cli.bench" in line)]


def test_every_device_command_runs_under_the_wrapper_as_documented():
    """docs/gpu.md's commands restore the committed files (the prewarm's as --base), save into $OUT beside at most
    seven other files, and give the wrapper arguments it takes: a typo there would cost a device session its warm
    start."""
    import shlex

    lines = device_lines()
    assert len(lines) >= 5
    for line in lines:
        assert len(line) < 2000  # the device tool's limit for one command line
        words = shlex.split(line.split("python3 -m hybrid.train.bench.compile_cache", 1)[1].split("|")[0])
        args = compile_cache.parser().parse_args(words)
        assert args.base.as_posix() == "docs/research/gpu/prewarm_cache.tgz"
        assert args.restore.as_posix() == "docs/research/gpu/compile_cache.tgz"
        assert args.save.as_posix() == "$OUT/compile_cache.tgz" and args.command[0] == "--"
        assert args.command[1] in ("python3", "timeout") and args.root.as_posix() == "/tmp/hcc"
