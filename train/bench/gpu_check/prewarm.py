"""Compile the scan's Triton kernels for the H100 into Triton's cache folder, on a machine without a GPU, so
that a device session loads them instead of compiling them.

    python -m hybrid.train.bench.gpu_check.prewarm [--parts correctness,scan,models,decoding] [--arch 90]
        [--sms 132] [--device-wheel WHEEL]

On the H100, compiling took most of the check's first parts: 29 scan cases in 170 s, and the scan part's
autotuner compiles 6 tiles forward and 6 backward for every flag combination on first use (docs/gpu.md); so do
the recurrent models of the check's models part and of the ``gpu-long`` budget, and the decoding part's
prefills (``prewarm_models``). Here each scan call the check would make (the CUDA tests' included) runs through
the library's real code path, CPU tensors of the real shapes included, with Triton's driver replaced by one that
names the GPU (``GPUTarget("cuda", arch, 32)``) and launches nothing, and the scan split in time where a GPU of
``--sms`` SMs would split it: every kernel is compiled exactly as the GPU's JIT would compile it, into the same
cache entry. The autotuner compiles every tile it may pick, and never keeps a pick (its timings would be made up);
the backward is compiled for every forward tile the GPU's autotuner may choose (its ``CK_BT``).

Triton's cache key covers its own build (``triton_key``: its Python sources and its ``libtriton`` binary),
the kernel's source, the target and the compiler's options. So run it under the device's Triton version, and,
when this machine's Python differs from the device's, name the device's wheel: ``--device-wheel`` checks that
the wheel is the same release with the same sources, ptxas and libdevice, and keys the entries with its
``libtriton``. Run it under ``compile_cache`` to pack the folder for the device (docs/gpu.md gives the
command). The device's report says how many kernels each part loaded and compiled.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

PARTS = ("correctness", "scan", "models", "decoding")

__all__ = ["compile_only", "device_keys", "correctness_calls", "cuda_test_calls", "scan_calls", "scan_way_calls",
           "planned_calls", "main"]


class _CompileOnlyDriver:
    """Triton's active driver while prewarming: it names the GPU and has no device to launch on."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_benchmarker(self):
        return _compile_without_timing

    def is_active(self):
        return True


def _compile_without_timing(kernel_call, *args, quantiles=None, **kwargs):
    """The autotuner's benchmark: the call compiles its tile (launches are skipped); every tile "takes" 1 ms."""
    kernel_call()
    return [1.0, 1.0, 1.0] if quantiles is not None else 1.0


@contextlib.contextmanager
def compile_only(arch: int = 90, sms: int = 132):
    """Inside, every Triton kernel of the library compiles for ``sm_{arch}`` and none launches; the scan takes
    CPU tensors on its Triton backend, and splits them in time where a GPU of ``sms`` SMs would (``time_split``:
    its pieces are kernels of their own, an initial state and a final state's gradient among them)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("prewarm: unset TRITON_INTERPRET (the interpreter compiles nothing)")
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    from hybrid.kernels.complex_scan import interface, time_split, triton_scan

    saved = (JITFunction.run, Autotuner.run, Autotuner._bench, interface._interpreting,
             triton_scan.triton_forward, triton_scan.triton_backward, time_split.pieces_for, time_split._sm_count)
    jit_run, tune_run, bench, _, forward, backward, pieces_for, _ = saved

    def pieces_on_the_gpu(B, T, H, P, device, backend):
        return pieces_for(B, T, H, P, torch.device("cuda", 0) if device.type == "cpu" else device, backend)

    def run_without_launch(self, *args, grid, warmup, **kwargs):
        return jit_run(self, *args, grid=grid, warmup=True, **kwargs)

    def tune_every_time(self, *args, **kwargs):
        self.cache.clear()  # no pick is kept in memory ...
        self.cache_results = False  # ... nor on disk: the GPU times its own
        return tune_run(self, *args, **kwargs)

    noting: list = []  # the tiles of the forward being tuned
    forward_tiles: set = set()  # the tiles the last tuned forward could pick, for the backward that follows it

    def bench_noting_tile(self, *args, config, **meta):
        if noting:
            noting[-1].add(triton_scan.time_tile(config.kwargs))
        return bench(self, *args, config=config, **meta)

    def forward_noting_tiles(*args, **kwargs):
        noting.append(set())
        try:
            out = forward(*args, **kwargs)
        finally:
            tiles = noting.pop()
        # the next backward follows the GPU's pick among these (ck_tile < 0: the runs layout)
        forward_tiles.clear()
        forward_tiles.update(-t if out[3] < 0 else t for t in tiles)
        return out

    def backward_for_every_tile(x, log_decay, theta, checkpoints, ck_tile, *rest):
        for tile in sorted(forward_tiles) or [ck_tile]:  # each call here follows its own forward
            grads = backward(x, log_decay, theta, checkpoints, tile, *rest)
        return grads

    active = driver._active  # None until a driver was asked for (there is none without a GPU)
    driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", arch, 32)))
    JITFunction.run, Autotuner.run, Autotuner._bench = run_without_launch, tune_every_time, bench_noting_tile
    interface._interpreting = lambda: True  # the Triton backend on CPU tensors
    triton_scan.triton_forward, triton_scan.triton_backward = forward_noting_tiles, backward_for_every_tile
    time_split.pieces_for = pieces_on_the_gpu
    time_split._sm_count = lambda index: sms
    try:
        yield
    finally:
        (JITFunction.run, Autotuner.run, Autotuner._bench, interface._interpreting,
         triton_scan.triton_forward, triton_scan.triton_backward, time_split.pieces_for, time_split._sm_count) = saved
        driver._active = active
        for tuned in triton_scan._TUNED.values():  # tuned later on a real device
            tuned.cache.clear()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def device_keys(wheel: str | Path):
    """Inside, Triton keys its cache entries as the Triton of ``wheel`` (the device's build) would; yields that
    ``triton_key()`` and the sha256 of the wheel's ``libtriton``. The wheel must be this Triton's release with
    byte-identical files except its native libraries."""
    import triton
    import triton.runtime.cache as cache

    wheel = Path(wheel)
    root = Path(triton.__file__).parent
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith("triton/") and not n.endswith("/")]
        if not names:
            raise ValueError(f"--device-wheel: expected a Triton wheel, got {wheel} (no triton/ files)")
        version = wheel.name.split("-")[1] if wheel.name.count("-") >= 2 else "?"
        if version != triton.__version__:
            raise ValueError(f"--device-wheel: expected Triton {triton.__version__} (this one), got {version}")
        differ = [n for n in names if not n.endswith(".so") and
                  (not (root / n[len("triton/"):]).is_file()
                   or _sha256((root / n[len("triton/"):]).read_bytes()) != _sha256(z.read(n)))]
        if differ:
            raise ValueError(f"--device-wheel: expected the same files as this Triton but for its .so files, got "
                             f"{len(differ)} differing, e.g. {differ[0]}")
        library = z.read("triton/_C/libtriton.so")
    library_sha256 = _sha256(library)
    ours = os.path.realpath(root / "_C" / "libtriton.so")
    with tempfile.TemporaryDirectory() as tmp:
        theirs = Path(tmp) / "libtriton.so"
        theirs.write_bytes(library)

        def redirected(path, *args, **kwargs):
            return open(theirs if os.path.realpath(path) == ours else path, *args, **kwargs)
        cache.open = redirected  # module globals come before builtins: only triton_key reads a binary here
        try:
            key = cache.triton_key.__wrapped__()
        finally:
            del cache.open
    original = cache.triton_key
    cache.triton_key = lambda: key
    try:
        yield key, library_sha256
    finally:
        cache.triton_key = original


def _scan_case_calls(prefix: str, setting: tuple, cases):
    """(label, setting, call) running each ``(dtype, T, mode, kw)`` case as ``scan_errors`` runs the Triton
    backend: ``complex_scan(backend="triton")`` forward and backward."""
    import torch

    from .numerics import scan_case, triton_scan_run

    for dtype, T, mode, kw in cases:
        label = f"{prefix} {setting[0]}/{setting[1]} {str(dtype).replace('torch.', '')} T={T} {mode} {kw or ''}"

        def call(dtype=dtype, T=T, mode=mode, kw=kw):
            triton_scan_run(*scan_case(torch.device("cpu"), dtype, T, mode, **kw), dtype)
        yield label, setting, call


def correctness_calls(setting: tuple, cases: slice = slice(None)):
    """The correctness part's scan cases (a slice of ``_scan_cases``) in one kernel setting."""
    from .part_correctness import _scan_cases

    yield from _scan_case_calls("correctness", setting, _scan_cases(SimpleNamespace(dry_run=False))[cases])


def cuda_test_calls(setting: tuple):
    """The scan cases of the CUDA tests (``pytest -m cuda``, which the check's tests part runs): the prewarm's
    ``correctness`` part compiles them too, the rows cut in time and the windows run as rows included."""
    import torch

    from .numerics import SPLIT_CASES, cuda_test_cases, split_case_errors, windows_as_rows_errors

    yield from _scan_case_calls("CUDA tests", setting, cuda_test_cases())
    for case in SPLIT_CASES:
        yield (f"CUDA tests {setting[0]}/{setting[1]} split in time {case[0]} T={case[1]} {case[2]}", setting,
               lambda case=case: split_case_errors(torch.device("cpu"), case))
    yield (f"CUDA tests {setting[0]}/{setting[1]} packed windows as rows", setting,
           lambda: windows_as_rows_errors(torch.device("cpu")))


def scan_calls(rows):
    """(label, setting, call) for the scan part's ``rows`` (``speed_rows``), forward alone and
    forward+backward, at the part's shape."""
    import torch

    from .part_scan import SHAPE, _inputs, _ours
    from .scan_ways import scan_fn

    for setting, dtype, mode, _ in rows:
        for passes in ("fwd", "fwd+bwd"):
            def call(dtype=dtype, mode=mode, passes=passes):
                x, ld, th = _inputs(SHAPE, dtype, mode, torch.device("cpu"), grad=passes != "fwd")
                scan_fn(_ours("triton"), x, ld, th, passes)()
            yield f"scan {setting[0]}/{setting[1]} {str(dtype).replace('torch.', '')} {mode} {passes}", setting, call


def scan_way_calls(setting: tuple):
    """(label, setting, call) for the scan part's rows that time one scan several ways (``scan_packed_rows``: a
    packed batch as one row and as a row per window; ``scan_long_row``: one long row in one pass and split in
    time), each forward alone and forward+backward, at the part's sizes."""
    import torch

    from . import scan_long_row, scan_packed_rows
    from .scan_ways import scan_fn, with_grad

    for module in (scan_packed_rows, scan_long_row):
        def ways(module=module):
            return module.ways(torch.device("cpu"), False, "triton", "ours")
        for i, (name, _, _) in enumerate(ways()[1]):
            for passes in ("fwd", "fwd+bwd"):
                def call(module=module, i=i, passes=passes):
                    leaves, found, _ = ways(module)
                    scan_fn(found[i][1], *with_grad(leaves, passes), passes)()
                yield f"scan {setting[0]}/{setting[1]} {name} {passes}", setting, call


def _at(setting: tuple, calls):
    """``prewarm_models``' (label, call) pairs as the plan's (label, setting, call)."""
    for label, call in calls:
        yield label, setting, call


def planned_calls(parts):
    """Every call of ``parts``, in the order a device session reaches them (docs/gpu.md, "The next session's
    order": the CUDA tests, the ``gpu-long`` budget, then the check's parts), so that an interrupted prewarm has
    done the first ones; a rerun loads what is done and goes on. Left out: the correctness grid in the tile
    layout, which runs last and passed on the H100 twice (its 90 kernels would take 4 of the cache file's 15 MiB)."""
    from .part_correctness import FIRST_PASS
    from .part_scan import DEFAULT, speed_rows
    from .prewarm_models import check_model_scan_calls, prefill_scan_calls, suite_scan_calls, tiny_model_scan_calls

    first, explored = speed_rows()
    plan = [("correctness", lambda: cuda_test_calls(DEFAULT)),
            ("correctness", lambda: _at(DEFAULT, tiny_model_scan_calls())),  # the CUDA model tests' tiny models
            ("models", lambda: _at(DEFAULT, suite_scan_calls())),  # the gpu-long budget: training, evaluations
            ("correctness", lambda: correctness_calls(DEFAULT, slice(None, FIRST_PASS))),
            ("scan", lambda: scan_calls(first)),
            ("scan", lambda: scan_way_calls(DEFAULT)),
            ("decoding", lambda: _at(DEFAULT, prefill_scan_calls())),  # the decoding part's chunked prefills
            ("models", lambda: _at(DEFAULT, check_model_scan_calls())),  # the models part, RetNet's carry included
            ("correctness", lambda: correctness_calls(DEFAULT, slice(FIRST_PASS, None))),
            ("scan", lambda: scan_calls(explored))]
    for part, calls in plan:
        if part in parts:
            yield from calls()


def _prune(folder: Path, used: dict) -> int:
    """Remove the entries of Triton's cache ``folder`` not in ``used`` (a run's noted keys), and their lines of
    the key sidecar; returns how many went."""
    import json
    import shutil

    from ..triton_rekey import SIDECAR

    gone = [entry for entry in folder.iterdir() if entry.is_dir() and entry.name not in used]
    for entry in gone:
        shutil.rmtree(entry)
    sidecar = folder / SIDECAR
    if sidecar.is_file():
        kept = {k: v for k, v in json.loads(sidecar.read_text()).items() if k in used}
        sidecar.write_text(json.dumps(kept, indent=0, sort_keys=True))
    return len(gone)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.bench.gpu_check.prewarm", allow_abbrev=False,
                                description="Compile the scan's Triton kernels for a GPU into Triton's cache "
                                            "folder, without a GPU (docs/gpu.md).")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, among {','.join(PARTS)}")
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability as an int (default 90: H100)")
    p.add_argument("--sms", type=int, default=132,
                   help="the GPU's SMs, where the scan's time split looks (default 132: an H100 SXM or an H200)")
    p.add_argument("--device-wheel", default=None, metavar="WHEEL",
                   help="the device's Triton wheel, when this machine's Python differs from the device's")
    p.add_argument("--prune", action="store_true",
                   help="once the run has ended, keep in Triton's cache folder only the kernels it compiled or "
                        "loaded (those of earlier sources or calls go)")
    p.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)  # first N calls (tests)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or any(p not in PARTS for p in parts):
        print(f"prewarm: --parts: expected names among {list(PARTS)}, got {args.parts!r}", file=sys.stderr)
        return 2
    import triton
    from triton import knobs

    from hybrid.kernels.complex_scan.triton_scan import scan_layout

    from ..triton_rekey import identity, noting_keys, this_build

    from .triton_compiles import listen, summarize

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        log = Path(tmp) / "compiles"
        listen(log)
        try:
            build = identity(*stack.enter_context(device_keys(args.device_wheel))) if args.device_wheel \
                else this_build()[1]
        except ValueError as exc:
            print(f"prewarm: {exc}", file=sys.stderr)
            return 2
        # each entry's key parts beside it, so that a device with another build of this release renames them
        folder = knobs.cache.dir
        noted = stack.enter_context(noting_keys(Path(folder), build))
        start = time.monotonic()
        with compile_only(args.arch, args.sms):
            for i, (label, setting, call) in enumerate(planned_calls(parts)):
                if args.limit is not None and i >= args.limit:
                    break
                before = summarize(log) or {"compiled": 0}
                t0 = time.monotonic()
                with scan_layout(*setting):
                    call()
                now = summarize(log) or {"compiled": 0}
                print(f"{time.monotonic() - t0:6.1f} s  {now['compiled'] - before['compiled']:3d} compiled  {label}",
                      flush=True)
        counts = summarize(log) or {"loaded": 0, "compiled": 0, "compile_s": 0.0}
        used = dict(noted)
    if args.prune:  # (not reached when the run was interrupted)
        print(f"prewarm: --prune: {_prune(Path(folder), used)} entries of earlier sources or calls removed")
    print(f"prewarm: Triton {triton.__version__} (build {build['build']}), sm_{args.arch}: {counts['compiled']} "
          f"kernels compiled ({counts['compile_s']} s), {counts['loaded']} already in {folder}; "
          f"{time.monotonic() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
