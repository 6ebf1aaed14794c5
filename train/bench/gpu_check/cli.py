"""``python -m hybrid.train.bench.gpu_check``: runs the parts one after another, each in a child process with
its own time limit, and writes the outputs after each one (``report.write_outputs``)."""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from ..compile_cache import NOTE_VARIABLE
from ..triton_rekey import build_name
from .triton_compiles import listen, summarize

PARTS = {  # name → default seconds: one H100 command of at most 9 minutes in all (docs/gpu.md splits it in two)
    "correctness": 80,
    "tests": 100,
    "scan": 70,
    "models": 140,
    "decoding": 60,
    "training": 90,
}
DRY_RUN_SECONDS = 120  # per part, on a CPU
GRACE_S = 20  # beyond its limit before a part is killed (it stops itself at its deadline)
RETURNED_LOGS = ("pytest.log", "train.log")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hybrid.train.bench.gpu_check",
                                description="Validate and measure every CUDA path in one command (docs/gpu.md).",
                                allow_abbrev=False)
    p.add_argument("--out", required=True, help="folder for report.md, results.json, the plots and logs (at most "
                                                "8 files; rewritten after every part)")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated parts to run, in this order (default: {','.join(PARTS)})")
    p.add_argument("--budget", type=float, default=None,
                   help=f"total seconds; scales every part's limit (default: their sum, {sum(PARTS.values())} s)")
    p.add_argument("--limits", default="", metavar="PART=S,...",
                   help="seconds for named parts, overriding their share of the budget (e.g. models=200)")
    p.add_argument("--dry-run", action="store_true",
                   help="every part on the CPU at tiny sizes, Triton under TRITON_INTERPRET=1 (what CI runs)")
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed at the end)")
    p.add_argument("--commit", default=None, help="commit to print in the report (default: git's HEAD, if any)")
    p.add_argument("--skip-measured", default=None, metavar="RESULTS_JSON[,...]",
                   help="earlier runs' results.json files: the models and decoding rows they measured are not run "
                        "again (a later GPU session measures the rest)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    return p


def _fail(message: str) -> int:
    print(f"gpu_check: {message}", file=sys.stderr)
    return 2


def _parts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        raise ValueError(f"--parts: expected names among {list(PARTS)}, got {text!r}")
    return names


def _limits(text: str) -> dict[str, float]:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, seconds = item.partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if name not in PARTS or value <= 0:
            raise ValueError(f"--limits: expected PART=SECONDS with PART among {list(PARTS)} and SECONDS > 0, "
                             f"got {item!r}")
        out[name] = value
    return out


def _repo() -> Path | None:
    import hybrid

    root = Path(hybrid.__file__).resolve().parent.parent
    return root if (root / "tests").is_dir() and (root / "pyproject.toml").is_file() else None


def _commit(given: str | None) -> str:
    """``--commit``, else ``$HYBRID_COMMIT`` (docs/gpu.md's device commands set it), else git's HEAD. The device
    machine's copy has no ``.git``, and a git there can find another repository around it."""
    from ...suite.records import COMMIT_VARIABLE

    if given or os.environ.get(COMMIT_VARIABLE):
        return given or os.environ[COMMIT_VARIABLE]
    repo = _repo()
    if repo is not None:
        try:
            return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                                  text=True, timeout=10).stdout.strip() or "unknown"
        except (OSError, subprocess.SubprocessError):
            pass
    return "unknown"


def triton_build() -> str:
    """The short name of ``triton_key()`` (Triton's sources and native library, ``triton_rekey.build_name``): the
    build every Triton cache entry is keyed by, so a prewarmed cache (``prewarm``) is used only where they match."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        return "none"
    return build_name(triton_key())


def device_name(dry_run: bool) -> str:
    """The device the parts measure on, as the report's header names it."""
    import torch

    if torch.cuda.is_available() and not dry_run:
        props = torch.cuda.get_device_properties(0)
        return f"{props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2 ** 30:.0f} GiB)"
    return f"{platform.machine()} CPU, {os.cpu_count()} cores"


def _header(args, argv) -> dict:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return {"device": device_name(args.dry_run), "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version(), "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "commit": _commit(args.commit), "dry_run": args.dry_run,
            "compile_cache": os.environ.get(NOTE_VARIABLE, "not carried: Triton's and Inductor's default folders"),
            "triton_build": triton_build(),
            "command": "python -m hybrid.train.bench.gpu_check " + " ".join(argv)}


def _read_rows(log: Path, part: str) -> list[dict]:
    if not log.exists():
        return []
    rows = []
    for line in log.read_text().splitlines():
        try:
            rows.append({"part": part, **json.loads(line)})
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
    return rows


def _run_part(name: str, limit: float, args, work: Path) -> tuple[dict, list[dict]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "hybrid.train.bench.gpu_check", "--out", str(work), "--child", name,
           "--seconds", str(limit), "--work", str(work)] + (["--dry-run"] if args.dry_run else [])
    if args.skip_measured:
        cmd += ["--skip-measured", str(args.skip_measured)]
    print(f"\n=== part {name}: limit {limit:.0f} s ===", flush=True)
    start = time.monotonic()
    try:
        rc = subprocess.run(cmd, env=env, timeout=limit + GRACE_S).returncode
        status = "finished" if rc == 0 else f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
        status = "killed at its limit"
    seconds = time.monotonic() - start
    rows = _read_rows(work / f"{name}.jsonl", name)
    counts = summarize(work / f"{name}.triton")
    return {"status": status, "seconds": round(seconds, 1), "limit": round(limit), "rows": len(rows),
            **({"triton": counts} if counts else {})}, rows


def _child(args) -> int:
    import torch

    from .context import CheckContext, measured_rows

    work = Path(args.work)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    ctx = CheckContext(part=args.child, device=device, dry_run=args.dry_run,
                       deadline=time.monotonic() + args.seconds, log=work / f"{args.child}.jsonl",
                       work=work, repo=_repo(),
                       measured=measured_rows(args.skip_measured, device_name(args.dry_run))
                       if args.skip_measured else None)
    module = importlib.import_module(f"{__package__}.part_{args.child}")
    listen(work / f"{args.child}.triton")  # the report's count of Triton kernels loaded / compiled
    try:
        module.run(ctx)
    except Exception as exc:  # noqa: BLE001 - recorded, so the report says where the part broke
        ctx.record(args.child, ok=False, error=f"{type(exc).__name__}: {exc}"[:400],
                   traceback=traceback.format_exc().splitlines()[-12:])
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.child:
        return _child(args)
    try:
        names = _parts(args.parts)
        limits = _limits(args.limits)
    except ValueError as exc:
        return _fail(str(exc))
    if args.budget is not None and args.budget <= 0:
        return _fail(f"--budget: expected seconds > 0, got {args.budget}")
    if args.skip_measured:
        from .context import measured_rows

        try:
            print(f"--skip-measured: {len(measured_rows(args.skip_measured))} rows measured earlier are skipped")
        except ValueError as exc:
            return _fail(str(exc))
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        return _fail("no CUDA device visible: the check measures a GPU; --dry-run rehearses it on the CPU")
    out = Path(args.out)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    from .report import write_outputs
    from .targets import evaluate

    header = _header(args, argv)
    default_total = sum(PARTS[n] for n in names)
    scale = 1.0 if args.budget is None else args.budget / default_total
    parts, rows = {}, []
    try:
        for name in names:
            limit = limits.get(name, DRY_RUN_SECONDS if args.dry_run else PARTS[name] * scale)
            parts[name], found = _run_part(name, limit, args, work)
            rows += found
            write_outputs(out, header, parts, rows, evaluate(rows))
            for log in RETURNED_LOGS:
                if (work / log).exists():
                    shutil.copyfile(work / log, out / log)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in rows if r.get("ok") is False]
    broken = [n for n, s in parts.items() if s["status"] != "finished"]
    print(f"\ngpu_check: {len(rows)} rows in {out}/report.md; {len(failed)} failed checks; "
          f"parts not finished: {', '.join(broken) or 'none'}")
    for r in failed:
        print(f"  FAILED {r['part']}/{r['section']}: " + json.dumps({k: v for k, v in r.items()
                                                                    if k not in ('part', 'section')}, default=str)[:300])
    return 1 if failed or broken else 0
