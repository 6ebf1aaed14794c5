"""The prewarm compiles the check's scan kernels for the H100 without a GPU, into the cache entries a device's
JIT looks up: a second process loads every one of them and compiles nothing. ``device_keys`` keys them as
another build of the same Triton release would. Run in child processes: under TRITON_INTERPRET=1 (set for the
rest of the suite) ``triton.jit`` builds nothing compilable, and the prewarm swaps Triton's driver."""
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hybrid.train.bench.gpu_check.triton_compiles import summarize
from hybrid.train.bench.triton_rekey import SIDECAR, this_build


def _prewarm(cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, "-m", "hybrid.train.bench.gpu_check.prewarm", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_a_second_process_loads_every_kernel_the_first_compiled_for_another_build(tmp_path):
    """Compiled for another build of this Triton (a wheel whose libtriton differs), the entries are renamed by
    ``rekey`` (as ``compile_cache`` does after a restore) and then load in a process of this build."""
    import triton

    cache = tmp_path / "cache"
    wheel = _wheel(tmp_path, triton.__version__, {"triton/__init__.py": (Path(triton.__file__).parent /
                                                                        "__init__.py").read_bytes(),
                                                  "triton/_C/libtriton.so": b"another build"})
    # the CUDA tests' first scan case: float32, T = 1, static decay, in the default setting (2 kernels)
    first = _prewarm(cache, "--parts", "correctness", "--limit", "1", "--device-wheel", str(wheel))
    assert first.returncode == 0, first.stderr[-3000:]
    assert re.search(r"sm_90: 2 kernels compiled \([\d.]+ s\), 0 already in", first.stdout), first.stdout
    metadata = [json.loads(p.read_text()) for p in cache.rglob("*.json")
                if not p.name.startswith("__grp__") and p.name != SIDECAR]
    assert sorted(m["name"] for m in metadata) == ["runs_bwd_kernel", "runs_fwd_kernel"]
    for m in metadata:
        assert m["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}, m["target"]
    assert len(list(cache.rglob("*.cubin"))) == 2 and len(json.loads((cache / SIDECAR).read_text())) == 2

    renamed = _rekey(cache)
    assert renamed.returncode == 0, renamed.stderr[-3000:]
    assert re.fullmatch(r"compile cache: 2 prewarmed Triton kernels renamed for this Triton build \([0-9a-f]{12}\)",
                        renamed.stdout.strip()), renamed.stdout
    assert _rekey(cache).stdout.strip() == "None"  # keyed for this build now

    again = _prewarm(cache, "--parts", "correctness", "--limit", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"sm_90: 0 kernels compiled \(0.0 s\), 2 already in", again.stdout), again.stdout


def test_prune_keeps_only_the_kernels_of_the_run(tmp_path):
    """``--prune``: an entry of earlier sources (and its sidecar line) goes; the run's kernels stay and load."""
    cache = tmp_path / "cache"
    first = _prewarm(cache, "--parts", "correctness", "--limit", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    (cache / "STALE").mkdir()
    (cache / "STALE" / "old.cubin").write_bytes(b"old")
    sidecar = cache / SIDECAR
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "STALE": {"parts": [], "build": "b"}}))
    pruned = _prewarm(cache, "--parts", "correctness", "--limit", "1", "--prune")
    assert pruned.returncode == 0, pruned.stderr[-3000:]
    assert "prewarm: --prune: 1 entries of earlier sources or calls removed" in pruned.stdout
    assert "0 kernels compiled" in pruned.stdout and not (cache / "STALE").exists()
    kept = [p.name for p in cache.iterdir() if p.is_dir()]
    assert len(kept) == 2 and sorted(json.loads(sidecar.read_text())) == sorted(kept)


def _rekey(cache: Path) -> subprocess.CompletedProcess:
    code = "import sys; from hybrid.train.bench.triton_rekey import rekey; print(rekey(sys.argv[1]))"
    return subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True, text=True, timeout=120)


def test_rekey_leaves_entries_made_from_other_sources(tmp_path):
    entry = tmp_path / "ABC"
    entry.mkdir()
    (tmp_path / SIDECAR).write_text(json.dumps({"ABC": {"parts": ["s", "12.8-90", "o", "[]"], "build": "b",
                                                        "sources": "another release"}}))
    done = _rekey(tmp_path)
    assert done.stdout.strip() == ("compile cache: 0 prewarmed Triton kernels renamed for this Triton build ("
                                   f"{this_build()[1]['build']}); left 1 made from other Triton sources and 0 by "
                                   "another ptxas or for another target")
    assert entry.is_dir()


def _wheel(path: Path, version: str, files: dict) -> Path:
    wheel = path / f"triton-{version}-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def _keys(wheel: Path) -> subprocess.CompletedProcess:
    code = ("import sys, triton.runtime.cache as c; from hybrid.train.bench.gpu_check.prewarm import device_keys\n"
            "before = c.triton_key()\n"
            "with device_keys(sys.argv[1]) as (key, _):\n"
            "    assert c.triton_key() == key\n"
            "assert c.triton_key() == before\n"
            "print(before); print(key)")
    return subprocess.run([sys.executable, "-c", code, str(wheel)], capture_output=True, text=True, timeout=120)


def test_device_keys_swap_only_the_libtriton_hash(tmp_path):
    import triton

    root = Path(triton.__file__).parent
    other = b"another build of libtriton"
    wheel = _wheel(tmp_path, triton.__version__, {"triton/__init__.py": (root / "__init__.py").read_bytes(),
                                                  "triton/_C/libtriton.so": other})
    done = _keys(wheel)
    assert done.returncode == 0, done.stderr[-3000:]
    ours, theirs = done.stdout.split()
    real = hashlib.sha256((root / "_C" / "libtriton.so").read_bytes()).hexdigest()
    assert real in ours and theirs == ours.replace(real, hashlib.sha256(other).hexdigest())


@pytest.mark.parametrize("version, edited, message", [
    (None, True, "expected the same files as this Triton but for its .so files, got 1 differing, "
                 "e.g. triton/__init__.py"),
    ("0.0.1", False, "expected Triton {version} (this one), got 0.0.1"),
])
def test_device_keys_refuse_another_release_or_other_sources(tmp_path, version, edited, message):
    import triton

    source = (Path(triton.__file__).parent / "__init__.py").read_bytes() + (b"\n# edited\n" if edited else b"")
    wheel = _wheel(tmp_path, version or triton.__version__, {"triton/__init__.py": source,
                                                             "triton/_C/libtriton.so": b"x"})
    done = _keys(wheel)
    assert done.returncode != 0
    assert f"ValueError: --device-wheel: {message.format(version=triton.__version__)}" in done.stderr


def test_bad_parts_get_one_line(tmp_path):
    done = _prewarm(tmp_path, "--parts", "training")
    assert done.returncode == 2
    assert done.stderr.strip() == ("prewarm: --parts: expected names among ['correctness', 'scan', 'models', "
                                   "'decoding'], got 'training'")


def test_the_compile_count_reads_what_triton_reported(tmp_path):
    log = tmp_path / "part.triton"
    assert summarize(log) is None
    log.write_text("loaded runs_fwd_kernel\ncompiled runs_bwd_kernel 2.50\ncompiled runs_fwd_kernel 1.25\n")
    assert summarize(log) == {"loaded": 1, "compiled": 2, "compile_s": 3.8}


def test_the_report_gives_each_part_its_kernels_loaded_and_compiled(tmp_path):
    from hybrid.train.bench.gpu_check.report import write_outputs

    header = {"device": "H100", "date": "2026-11-28", "commit": "abc", "torch": "2.11", "triton": "3.6.0",
              "python": "3.12", "dry_run": False, "command": "python -m hybrid.train.bench.gpu_check"}
    parts = {"correctness": {"status": "finished", "seconds": 80.0, "limit": 200, "rows": 3,
                             "triton": {"loaded": 41, "compiled": 2, "compile_s": 6.5}},
             "scan": {"status": "finished", "seconds": 50.0, "limit": 90, "rows": 0}}
    write_outputs(tmp_path, header, parts, [], [])
    report = (tmp_path / "report.md").read_text()
    assert "| correctness | finished | 80 | 200 | 3 | 41 / 2 (6.5 s) |" in report
    assert "| scan | finished | 50 | 90 | 0 |  |" in report


def test_the_models_scan_calls_are_recorded_from_a_training_step():
    """The hybrid's R layers: a static decay and angle on padded rows, a restarted (time-varying) decay on the
    trainer's packed batch (its rows side by side, the angle shared); the gradient reaches x and the decay, not the
    fixed rotary angle."""
    import torch

    from hybrid.models import HybridConfig
    from hybrid.train.bench.gpu_check.prewarm_models import _recording, recorded_scan_calls, replay

    config = HybridConfig.preset("hybrid", "tiny", d_model=64, n_layers=3, n_heads=2, pattern="RRA", window=8,
                                 vocab_size=64)
    calls = recorded_scan_calls(config, tokens=32)
    assert [(c.time_static, c.batch_broadcast, c.needs_grad) for c in calls] == [
        ((False, True), (False, True), (True, True, False, False)),  # packed, one row a window: decay restarted
        ((True, True), (True, True), (True, True, False, False)),  # padded: one decay and angle for all
    ]
    assert {(c.dtype, c.heads, c.head_dim, c.gate_dtypes) for c in calls} == {
        (torch.bfloat16, 2, 32, (torch.float32, torch.float32))}
    recorded = []
    with _recording(recorded):  # a replay makes the call it replays (here on the CPU backend)
        for call in calls:
            replay(call, 3, 17, backend="cpu")
    assert recorded == calls


def test_the_backward_is_compiled_for_every_tile_the_tuned_forward_may_pick(tmp_path):
    """Two forward tiles (32 and 64 steps) and one backward tile that fits both: the GPU's autotuner may pick
    either forward tile, and the backward's CK_BT follows it, so the prewarm compiles that backward twice."""
    code = """
import torch
from hybrid.kernels.complex_scan import triton_scan
from hybrid.train.bench.gpu_check.numerics import scan_case, triton_scan_run
from hybrid.train.bench.gpu_check.prewarm import compile_only
from hybrid.train.bench.gpu_check.triton_compiles import listen, summarize
triton_scan._FWD_CONFIGS = [(32, 16, 4), (64, 16, 4)]  # (BT, BP, warps): the tile layout compiles fastest
triton_scan._BWD_CONFIGS = [(64, 16, 4)]
triton_scan._AUTOTUNE_MIN_WORK = 0
listen("compiles")
with compile_only(), triton_scan.scan_layout("tile"):
    triton_scan_run(*scan_case(torch.device("cpu"), torch.float32, 64, "dependent", B=1, H=1, D=32), torch.float32)
print(open("compiles").read())
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(line.split()[1] for line in done.stdout.splitlines() if line.startswith("compiled"))
    assert names == ["_scan_bwd_kernel", "_scan_bwd_kernel", "_scan_fwd_kernel", "_scan_fwd_kernel"], done.stdout


def test_inside_compile_only_the_scan_splits_in_time_where_the_gpu_would():
    """One long row of an R layer (32 pieces), the models part's 32K rows (16), no split for 32 rows of 2048 nor for
    the torch backend; the CPU's own rule (no split) again afterwards."""
    code = """
import torch
from hybrid.kernels.complex_scan import interface, time_split
from hybrid.train.bench.gpu_check.prewarm import compile_only
cpu = torch.device("cpu")
shapes = [(1, 65536, 8, 32), (2, 32768, 8, 32), (32, 2048, 8, 32), (1, 8192, 3, 16)]
with compile_only(sms=132):
    print([interface.time_split.pieces_for(*s, cpu, "triton") for s in shapes],
          time_split.pieces_for(*shapes[0], cpu, "torch"))
print([interface.time_split.pieces_for(*s, cpu, "triton") for s in shapes], [time_split.pieces_for(*s, cpu, "triton")
                                                                              for s in shapes])
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["[32, 16, 1, 8] 1", "[1, 1, 1, 1] [1, 1, 1, 1]"]


def test_the_plan_holds_the_cuda_tests_split_and_packed_cases_and_the_scan_parts_ways():
    from hybrid.train.bench.gpu_check.part_scan import DEFAULT
    from hybrid.train.bench.gpu_check.prewarm import cuda_test_calls, scan_way_calls

    tail = [label for label, _, _ in cuda_test_calls(DEFAULT)][-3:]
    assert [label.split(" ", 3)[-1] for label in tail] == [
        "split in time torch.float32 T=252 dependent", "split in time torch.bfloat16 T=252 mixed",
        "packed windows as rows"]
    ways = [label.split(" ", 2)[-1] for label, _, _ in scan_way_calls(DEFAULT)]
    assert ways == [f"ours, {way} {passes}" for way in ("a row per window", "one packed row (auto: 1 pieces)",
                                                        "split in time (auto: 1 pieces)", "one pass")
                    for passes in ("fwd", "fwd+bwd")]


def test_retention_s_carry_and_the_prefill_s_chunks_are_recorded():
    """RetNet's carry across tiles: one scan step a tile (1/64 of a padded row's tokens), float32 states as pairs
    (Dk·Dv), its decay per tile and head; a chunked prefill: an initial state, no gradient; the evaluations."""
    from fractions import Fraction

    import torch

    from hybrid.models import HybridConfig
    from hybrid.train.bench.gpu_check.prewarm_models import (recorded_eval_calls, recorded_prefill_calls,
                                                             recorded_scan_calls)

    retnet = HybridConfig.preset("retnet", "tiny", d_model=64, n_layers=1, n_heads=2, vocab_size=64)
    calls = recorded_scan_calls(retnet, tokens=256)
    assert {(c.dtype, c.heads, c.head_dim, c.time_ratio, c.steps(2048)) for c in calls} == {
        (torch.float32, 2, 32 * 32, Fraction(1, 32), 64), (torch.float32, 2, 32 * 32, Fraction(1, 64), 32)}
    assert {c.needs_grad for c in calls} == {(True, False, False, False)}

    hybrid = HybridConfig.preset("hybrid", "tiny", d_model=64, n_layers=2, n_heads=2, pattern="RA", window=8,
                                 vocab_size=64)
    prefill = recorded_prefill_calls(hybrid, chunk=16)
    assert [(c.has_initial_state, c.needs_grad, c.time_ratio) for c in prefill] == [
        (True, (False, False, False, False), Fraction(1))]
    # the evaluations: bf16-autocast validation of packed windows, float32 measurements after training
    evaluated = recorded_eval_calls(hybrid, tokens=64)
    assert {(c.dtype, c.time_static[0], c.has_initial_state, any(c.needs_grad)) for c in evaluated} == {
        (torch.bfloat16, False, False, False), (torch.float32, True, True, False)}


def test_the_tiny_models_scan_calls_are_recorded_at_their_own_sizes():
    """The model checks' and CUDA model tests' passes: float32 rows of 200 with gradients, bf16-autocast rows of
    256, the modes' chunks of 20 from a state, and RetNet's carry."""
    from hybrid.train.bench.gpu_check.prewarm_models import tiny_model_scan_calls

    labels = [label for label, _ in tiny_model_scan_calls()]
    for want in ("float32 H4 D32 decay static, angle static, grads xd, 2 x 200",
                 "bfloat16 H4 D32 decay dependent, angle static, grads xd, 2 x 256",
                 "float32 H4 D32 decay static, angle static, an initial state, grads -, 2 x 20"):
        assert f"tiny models: {want}" in labels, labels
    assert any("D1024" in label for label in labels), labels  # retention's (Dk·Dv) states
