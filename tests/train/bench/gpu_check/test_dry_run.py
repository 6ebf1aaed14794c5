"""The GPU check's command rehearsed on the CPU (``--dry-run``): every part runs at tiny sizes, the Triton
kernels under the interpreter, and the outputs are what a GPU command can bring back (at most 8 files, each
under 16 MiB, at most two folders down: here none). This is what keeps the command from rotting between GPU
sessions."""
import json
import os
import subprocess
import sys

import pytest

from hybrid.train.bench.gpu_check.part_decoding import STEPS


def run_check(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k != "HYBRID_WINDOW_BACKEND"}
    return subprocess.run([sys.executable, "-m", "hybrid.train.bench.gpu_check", "--out", str(tmp_path / "out"),
                           *args], capture_output=True, text=True, env=env, timeout=900)


def test_every_part_runs_and_reports(tmp_path):
    done = run_check(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all((out / f).is_file() and (out / f).stat().st_size < 16 << 20 for f in files)
    assert {"report.md", "results.json", "pytest.log", "train.log"} <= set(files), files
    results = json.loads((out / "results.json").read_text())
    assert set(results["parts"]) == {"correctness", "tests", "scan", "models", "decoding", "training"}
    assert all(p["status"] == "finished" for p in results["parts"].values()), results["parts"]
    sections = {r["section"] for r in results["rows"] if "skipped" not in r}
    assert {"scan", "window", "conv", "compile", "pytest", "scan speed", "models", "decoding", "training",
            "samples"} <= sections, sections
    assert not [r for r in results["rows"] if r.get("ok") is False]
    decoding = [r for r in results["rows"] if r["section"] == "decoding"]
    assert {r["step"] for r in decoding} == set(STEPS), decoding
    assert not [r for r in decoding if "error" in r], decoding
    report = (out / "report.md").read_text()
    assert "DRY RUN" in report and "## Targets" in report and "| training | finished |" in report


def test_a_part_past_its_limit_stops_and_the_report_says_so(tmp_path):
    """A part that runs out of time records what it skipped, and the outputs are written all the same."""
    done = run_check(tmp_path, "--dry-run", "--parts", "models", "--limits", "models=1")
    out = tmp_path / "out"
    results = json.loads((out / "results.json").read_text())
    skipped = [r for r in results["rows"] if "skipped" in r]
    assert skipped and all(r["reason"].startswith("time") for r in skipped)
    assert "### Not run" in (out / "report.md").read_text()
    assert done.returncode == 0  # nothing failed: the part ended itself at its deadline


@pytest.mark.parametrize("args,message", [
    (["--parts", "scan,gpu"], "--parts: expected names among"),
    (["--dry-run", "--limits", "scan=0"], "--limits: expected PART=SECONDS"),
    (["--dry-run", "--budget", "-1"], "--budget: expected seconds > 0, got -1.0"),
    (["--dry-run", "--skip-measured", "no-such/results.json"], "--skip-measured: expected a results.json"),
])
def test_bad_arguments_get_one_line(tmp_path, args, message):
    done = run_check(tmp_path, *args)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
