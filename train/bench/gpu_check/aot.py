"""Compile every Triton kernel of the library for a GPU ahead of time, on a machine without one.

    python -m hybrid.train.bench.gpu_check.aot [--arch 90] [--out FILE.md] [--all | --benchmark]

``triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32))`` runs the whole
compiler (TTIR, TTGIR, LLVM IR, PTX and, with the ptxas Triton ships, a cubin) without a GPU. Each row compiles
one specialisation of a kernel: one value of each constexpr, one tile (BT, BP) and warp count, one input dtype.
The default set is a covering set, for both layouts of the scan (``triton_scan``'s tile kernels and
``triton_runs``'s runs kernels): every tile the autotuner may pick (``_FWD_CONFIGS`` / ``_BWD_CONFIGS``,
``RUNS_FWD_CONFIGS`` / ``RUNS_BWD_CONFIGS``), the untuned default tiles, each constexpr branch both ways and each
input dtype at least once.
``--all`` compiles every combination of the flags instead (hundreds of compiles: minutes).

Each compile is told what the JIT would say at the benchmark shape: every pointer 16-byte aligned and every
integer a multiple of 16 (``_aligned``). For each it reports the registers per thread, the spill bytes (stores
+ loads) and the local stack from ``ptxas -v`` on the PTX, the widest global load and store, and the shared
memory Triton reserves for the launch, and the main loop's length in machine instructions (SASS, by the
``cuobjdump`` Triton ships) per pair and time step: the loop handles ``BT·BP`` pair-steps a tile over
``32·num_warps`` threads. The last is what a memory-bound kernel must keep low: at the H100's copy bandwidth a
bf16 pair-step with data-dependent decay moves 16 bytes, time for about 170 instructions per thread and
pair-step at one warp instruction per cycle per scheduler. Compile errors and API drift
between Triton releases show here, before any GPU time is spent. Run with ``TRITON_INTERPRET`` unset: under
the interpreter ``triton.jit`` builds no compilable kernel (the module refuses).
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

__all__ = ["Specialisation", "covering_set", "every_combination", "compile_one", "main"]

_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class Specialisation:
    """One compile: the kernel's name, its constexpr values, the launch's warps and x's dtype."""

    kernel: str  # "forward" | "backward" (tile layout) | "runs forward" | "runs backward"
    constexprs: dict = field(hash=False)
    num_warps: int
    dtype: str  # of x / y / dy / dx: float32, bfloat16 or float16

    def label(self) -> str:
        flags = " ".join(k for k, v in self.constexprs.items() if isinstance(v, bool) and v)
        stages = f" stages={self.constexprs['STAGES']}" if self.constexprs.get("STAGES", 1) > 1 else ""
        return (f"{self.kernel} BT={tile_label(self.constexprs)} BP={self.constexprs['BP']} w={self.num_warps} "
                f"{self.dtype} [{flags}]{stages}")


def tile_label(constexprs: dict) -> str:
    """``64`` (tile layout) or ``32 (4x8)`` (runs layout: S runs of R steps)."""
    from hybrid.kernels.complex_scan.triton_scan import time_tile

    if "S" in constexprs:
        return f"{time_tile(constexprs)} ({constexprs['S']}x{constexprs['R']})"
    return str(constexprs["BT"])


def _kernels():
    from hybrid.kernels.complex_scan import triton_scan

    if triton_scan._INTERPRET:
        raise RuntimeError("aot: TRITON_INTERPRET=1 is set; unset it (the interpreter builds no compilable kernel)")
    return triton_scan


def _kernel_fn(kernel: str):
    from hybrid.kernels.complex_scan import triton_runs

    ts = _kernels()
    return {"forward": ts._scan_fwd_kernel, "backward": ts._scan_bwd_kernel,
            "runs forward": triton_runs.runs_fwd_kernel, "runs backward": triton_runs.runs_bwd_kernel}[kernel]


_FWD_FLAGS = ("LD_STATIC", "TH_STATIC", "HAS_H0", "SAVE_CK")
_BWD_FLAGS = ("LD_STATIC", "TH_STATIC", "HAS_DY", "HAS_DHT", "NEED_DX", "NEED_DLD", "NEED_DTH", "NEED_DH0",
              "SHIFT_GATHER")


def _forward(bt, bp, warps, flags, dtype):
    return Specialisation("forward", {"BT": bt, "BP": bp, **dict(zip(_FWD_FLAGS, flags))}, warps, dtype)


def _backward(bt, bp, warps, ck_bt, flags, dtype):
    named = dict(zip(_BWD_FLAGS, flags))
    return Specialisation("backward", {"BT": bt, "CK_BT": ck_bt, "BP": bp, **named}, warps, dtype)


_RUNS_BWD_FLAGS = _BWD_FLAGS[:-1]  # the runs backward has no SHIFT_GATHER: a_{t+1} is in the same thread


def _runs_forward(s, r, bp, warps, flags, dtype, stages=1):
    named = dict(zip(_FWD_FLAGS, flags))
    return Specialisation("runs forward", {"S": s, "R": r, "BP": bp, **named, "STAGES": stages}, warps, dtype)


def _runs_backward(s, r, bp, warps, ck_bt, flags, dtype, stages=1):
    named = dict(zip(_RUNS_BWD_FLAGS, flags))
    return Specialisation("runs backward", {"S": s, "R": r, "CK_BT": ck_bt, "BP": bp, **named, "STAGES": stages},
                          warps, dtype)


def _valid_backward(named: dict) -> bool:
    """The host never launches the backward without an upstream gradient or without a gradient to compute."""
    wants = named["NEED_DX"] or named["NEED_DLD"] or named["NEED_DTH"] or named["NEED_DH0"]
    return (named["HAS_DY"] or named["HAS_DHT"]) and wants


def covering_set() -> list[Specialisation]:
    """Every tuned and default tile once, every flag both ways, every dtype (see the module docstring)."""
    ts = _kernels()
    dtypes = list(_DTYPES)
    specs = []
    # forward: the 16 flag combinations, walked beside the tuned tiles (each tile at least twice)
    tiles = ts._FWD_CONFIGS + [ts.default_blocks(4096, 64)]
    for i, flags in enumerate(itertools.product((False, True), repeat=len(_FWD_FLAGS))):
        bt, bp, warps = tiles[i % len(tiles)]
        specs.append(_forward(bt, bp, warps, flags, dtypes[i % 3]))
    # backward: each tuned tile with a checkpoint interval it may follow (BT a multiple of CK_BT); the flags
    # from rows that switch each one on and off, with both ways of fetching a_{t+1}
    rows = [
        # LD    TH     DY     DHT    DX     DLD    DTH    DH0    GATHER
        (False, False, True, False, True, True, True, False, True),
        (True, False, True, True, True, True, True, True, True),
        (False, True, True, True, True, True, True, True, False),
        (True, True, False, True, False, True, True, True, True),
        (False, False, True, True, False, False, True, True, False),
        (False, False, True, False, True, False, False, False, True),
        (True, False, True, False, True, True, False, False, False),
        (False, True, False, True, True, False, True, False, True),
    ]
    bwd_tiles = ts._BWD_CONFIGS + [ts.default_blocks(4096, 64)]
    for i, (flags, (bt, bp, warps)) in enumerate(zip(rows, itertools.cycle(bwd_tiles))):
        specs.append(_backward(bt, bp, warps, _checkpoint_interval(bt, i), flags, dtypes[i % 3]))
    for j, (bt, bp, warps) in enumerate(bwd_tiles[len(rows):]):
        flags = rows[j % len(rows)]
        specs.append(_backward(bt, bp, warps, _checkpoint_interval(bt, j + 1), flags, dtypes[j % 3]))
    specs += _runs_covering_set(rows)
    return specs


def _runs_covering_set(rows) -> list[Specialisation]:
    """The runs layout: each of its tuned tiles and its default tile once forward and once backward (with a
    checkpoint interval it may follow) at the default pipelining, beside flag rows that switch each flag both ways
    (the backward's rows less SHIFT_GATHER), and the other pipelining once each way; its unrolled runs make each
    compile take seconds, so not every forward combination."""
    from hybrid.kernels.complex_scan import triton_runs

    dtypes = list(_DTYPES)
    fwd_rows = [  # LD, TH, H0, CK
        (False, False, False, True), (True, False, True, False), (False, True, False, True),
        (True, True, True, True), (False, False, True, False), (True, True, False, False),
        (False, True, True, True)]
    stages = _kernels()._STAGES  # the default pipelining ($HYBRID_SCAN_STAGES)
    fwd_tiles = triton_runs.RUNS_FWD_CONFIGS + [triton_runs.runs_default(4096, 64, False)]
    specs = [_runs_forward(*tile, flags, dtypes[i % 3], stages)
             for i, (tile, flags) in enumerate(zip(fwd_tiles, itertools.cycle(fwd_rows)))]
    bwd_tiles = triton_runs.RUNS_BWD_CONFIGS + [triton_runs.runs_default(4096, 64, False)]
    for i in range(max(len(rows), len(bwd_tiles))):
        s, r, bp, warps = bwd_tiles[i % len(bwd_tiles)]
        ck_bt = s * r if i % 2 == 0 or s * r <= 32 else s * r // 2
        specs.append(_runs_backward(s, r, bp, warps, ck_bt, rows[i % len(rows)][:-1], dtypes[(i + 1) % 3], stages))
    # the loop at the other pipelining (unpipelined, or 3 stages), once each way
    other = 1 if stages > 1 else 3
    specs.append(_runs_forward(*triton_runs.RUNS_FWD_CONFIGS[0], fwd_rows[0], "bfloat16", stages=other))
    specs.append(_runs_backward(*triton_runs.RUNS_BWD_CONFIGS[0], 32, rows[0][:-1], "bfloat16", stages=other))
    return specs


def _checkpoint_interval(bt: int, i: int) -> int:
    """A forward tile (the checkpoint interval) that the backward tile ``bt`` may follow: bt itself or a half."""
    return bt if i % 2 == 0 or bt <= 32 else bt // 2


def every_combination() -> list[Specialisation]:
    """Every flag combination the host can launch, at each tuned tile, in bfloat16 (many compiles)."""
    ts = _kernels()
    from hybrid.kernels.complex_scan import triton_runs

    specs = [_forward(bt, bp, w, flags, "bfloat16")
             for (bt, bp, w) in ts._FWD_CONFIGS
             for flags in itertools.product((False, True), repeat=len(_FWD_FLAGS))]
    for bt, bp, w in ts._BWD_CONFIGS:
        for flags in itertools.product((False, True), repeat=len(_BWD_FLAGS)):
            if _valid_backward(dict(zip(_BWD_FLAGS, flags))):
                specs.append(_backward(bt, bp, w, bt, flags, "bfloat16"))
    specs += [_runs_forward(s, r, bp, w, flags, "bfloat16")
              for (s, r, bp, w) in triton_runs.RUNS_FWD_CONFIGS
              for flags in itertools.product((False, True), repeat=len(_FWD_FLAGS))]
    for s, r, bp, w in triton_runs.RUNS_BWD_CONFIGS:
        for flags in itertools.product((False, True), repeat=len(_RUNS_BWD_FLAGS)):
            if _valid_backward(dict(zip(_RUNS_BWD_FLAGS, flags))):
                specs.append(_runs_backward(s, r, bp, w, s * r, flags, "bfloat16"))
    return specs


_MODES = {"dependent": (False, False), "static": (True, True), "mixed": (True, False)}  # (LD_STATIC, TH_STATIC)


def benchmark_set(dtype: str = "bfloat16") -> list[Specialisation]:
    """Every tuned tile of both layouts at the flags of the scan's speed benchmark (gpu_check's ``scan`` part): the
    forward saving checkpoints, the backward with an upstream gradient and every gradient but the initial state's,
    for data-dependent, static and mixed (static decay, dependent angle) decay. Like for like across layouts."""
    from hybrid.kernels.complex_scan import triton_runs

    ts = _kernels()
    specs = []
    for mode, (ld, th) in _MODES.items():
        fwd = (ld, th, False, True)
        bwd = (ld, th, True, False, True, True, True, False)
        specs += [_forward(bt, bp, w, fwd, dtype) for bt, bp, w in ts._FWD_CONFIGS]
        specs += [_backward(bt, bp, w, bt, bwd + (True,), dtype) for bt, bp, w in ts._BWD_CONFIGS]
        for stages in (1, 3):
            specs += [_runs_forward(s, r, bp, w, fwd, dtype, stages) for s, r, bp, w in triton_runs.RUNS_FWD_CONFIGS]
            specs += [_runs_backward(s, r, bp, w, s * r, bwd, dtype, stages)
                      for s, r, bp, w in triton_runs.RUNS_BWD_CONFIGS]
    return specs


def _signature(fn, spec: Specialisation) -> dict:
    """Triton's type string for every argument: pointers to x-like tensors in the dtype, the rest float32."""
    x_like = {"x_ptr", "y_ptr", "dy_ptr", "dx_ptr"}  # (the runs kernels read them as whole pairs: same pointers)
    sig = {}
    for name in fn.arg_names:
        if name in spec.constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*" + (_DTYPES[spec.dtype] if name in x_like else "fp32")
        else:
            sig[name] = "i32"
    return sig


def _aligned(fn, spec: Specialisation) -> dict:
    """Every pointer 16-byte aligned and every integer a multiple of 16: what the JIT tells the compiler at the
    benchmark shape (B8·T8192·H16·D128: torch's allocations are aligned, and T, H, P and the strides are all
    multiples of 16), which decides how wide the loads and stores can be."""
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name not in spec.constexprs}


def _ptxas_path(arch: int) -> str:
    from triton.backends.nvidia import compiler as nv

    try:
        tool = nv.get_ptxas(arch)
    except TypeError:  # older Triton: get_ptxas() takes no arch
        tool = nv.get_ptxas()
    return tool.path if hasattr(tool, "path") else tool[0]


_USAGE = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")


_ACCESS = re.compile(r"\b(ld|st)\.global(?:\.[a-z0-9_]+)*?(?:\.v(\d))?\.(?:b|f|u|s)(\d+)\b")


_ASYNC_COPY = re.compile(r"\bcp\.async\.c[ag]\.shared(?:::cta)?\.global(?:\.[a-z0-9_:]+)*"
                         r"\s+\[[^\]]*\],\s*\[[^\]]*\],\s*(0x[0-9a-f]+|\d+)")


def access_widths(ptx: str) -> dict:
    """The widest global load and store in bytes per thread and instruction (``ld.global.v4.b32``: 16); a load
    the loop's pipelining made an asynchronous copy into shared memory (``cp.async ..., 0x4``) counts its size."""
    widest = {"ld": 0, "st": 0}
    for op, vec, bits in _ACCESS.findall(ptx):
        widest[op] = max(widest[op], int(vec or 1) * int(bits) // 8)
    for size in _ASYNC_COPY.findall(ptx):
        widest["ld"] = max(widest["ld"], int(size, 0))
    return {"load_bytes": widest["ld"], "store_bytes": widest["st"]}


_SASS_INSTR = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+([^;]*);")
_BRANCH_BACK = re.compile(r"\bBRA\s+(?:0x)?([0-9a-f]+)")


def main_loop_instructions(cubin: bytes, arch: int) -> int | None:
    """Machine instructions in the kernel's longest backward branch (its loop over time tiles), from ``cuobjdump
    -sass``; None where Triton ships no cuobjdump."""
    tool = os.path.join(os.path.dirname(_ptxas_path(arch)), "cuobjdump")
    if not os.path.exists(tool):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(cubin)
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    instructions = [(int(addr, 16), text) for addr, text in _SASS_INSTR.findall(sass)]
    loops = []
    for addr, text in instructions:
        target = _BRANCH_BACK.search(text)
        if target and int(target.group(1), 16) < addr:
            loops.append((int(target.group(1), 16), addr))
    if not loops:
        return None
    start, end = max(loops, key=lambda loop: loop[1] - loop[0])
    return sum(start <= addr <= end for addr, _ in instructions)


def resource_usage(ptx: str, arch: int) -> dict:
    """Registers, spill bytes and stack frame of the PTX, as ``ptxas -v`` reports them."""
    target = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as fh:
            fh.write(ptx)
        done = subprocess.run([_ptxas_path(arch), "-v", f"--gpu-name={target}", src, "-o", os.path.join(tmp, "k.o")],
                              capture_output=True, text=True, check=True)
    report = done.stdout + done.stderr
    regs = _USAGE.search(report)
    spills = _SPILL.search(report)
    stack = _STACK.search(report)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_bytes": (int(spills.group(1)) + int(spills.group(2))) if spills else None,
            "stack_bytes": int(stack.group(1)) if stack else None}


def compile_one(spec: Specialisation, arch: int = 90) -> dict:
    """Compile ``spec`` for ``sm_<arch>``; returns its row (or the error, in one line)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hybrid.kernels.complex_scan.triton_scan import FP_FUSION, time_tile

    fn = _kernel_fn(spec.kernel)
    row = {"kernel": spec.kernel, "label": spec.label(), "dtype": spec.dtype, "num_warps": spec.num_warps,
           **{k: v for k, v in spec.constexprs.items()}, "BT": time_tile(spec.constexprs)}
    start = time.perf_counter()
    try:
        src = ASTSource(fn, _signature(fn, spec), dict(spec.constexprs), attrs=_aligned(fn, spec))
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": spec.num_warps, **FP_FUSION})  # as the launches ask
        row.update(ok=True, shared_bytes=int(compiled.metadata.shared), has_cubin="cubin" in compiled.asm)
        row.update(resource_usage(compiled.asm["ptx"], arch))
        row.update(access_widths(compiled.asm["ptx"]))
        loop = main_loop_instructions(compiled.asm["cubin"], arch) if "cubin" in compiled.asm else None
        pair_steps = time_tile(spec.constexprs) * spec.constexprs["BP"] / (32 * spec.num_warps)
        row["loop_per_pair_step"] = None if loop is None else round(loop / pair_steps, 1)
    except Exception as exc:  # noqa: BLE001 - a compile error is the finding: keep it in the table
        row.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
    row["compile_s"] = round(time.perf_counter() - start, 2)
    return row


def table(rows: list[dict], arch: int) -> str:
    import triton

    head = [f"Triton {triton.__version__}, ahead of time for sm_{arch} (no GPU): {len(rows)} specialisations, "
            f"{sum(not r['ok'] for r in rows)} failed.", "",
            "| kernel | BT | BP | warps | dtype | flags | registers | spill B | stack B | shared B | widest load B | "
            "widest store B | loop instr. / pair-step | compile s |",
            "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        flags = " ".join(k for k in dict.fromkeys(_FWD_FLAGS + _BWD_FLAGS) if r.get(k) is True)
        if r.get("STAGES", 1) > 1:
            flags += f" STAGES={r['STAGES']}"
        if r["ok"]:
            cells = [r["registers"], r["spill_bytes"], r["stack_bytes"], r["shared_bytes"], r["load_bytes"],
                     r["store_bytes"], "" if r.get("loop_per_pair_step") is None else r["loop_per_pair_step"]]
        else:
            cells = ["FAILED: " + r["error"], "", "", "", "", "", ""]
        head.append(f"| {r['kernel']} | {tile_label(r)} | {r['BP']} | {r['num_warps']} | {r['dtype']} | {flags} | "
                    + " | ".join(str(c) for c in cells) + f" | {r['compile_s']} |")
    return "\n".join(head) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (default: 90, the H100 / H200)")
    p.add_argument("--all", action="store_true", help="every flag combination at every tuned tile (slow)")
    p.add_argument("--benchmark", action="store_true",
                   help="every tuned tile of both layouts at the speed benchmark's flags, bf16 (like for like)")
    p.add_argument("--out", help="also write the table (markdown) here")
    args = p.parse_args(argv)
    specs = every_combination() if args.all else benchmark_set() if args.benchmark else covering_set()
    rows = []
    for spec in specs:
        rows.append(compile_one(spec, args.arch))
        print(("ok    " if rows[-1]["ok"] else "FAIL  ") + spec.label(), flush=True)
    text = table(rows, args.arch)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
