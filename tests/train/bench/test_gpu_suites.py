"""The placements and positions suites at the gpu budget (issue 42, later runs): the device command of docs/gpu.md
rehearsed on the CPU with --dry-run for each suite, two models of each, continuing from the records a session
brought back."""
from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from hybrid.train.cli import bench as bench_cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)

GPU_DOC = Path(__file__).resolve().parents[3] / "docs" / "gpu.md"
SECTION = "### The `placements` and `positions` suites at the `gpu` budget"


def device_command() -> str:
    section = GPU_DOC.read_text(encoding="utf-8").split(SECTION)[1].split("\n### ")[0]
    (line,) = [line for block in re.findall(r"^```\n(.*?)^```", section, flags=re.S | re.M)
               for line in block.splitlines() if line.startswith("export ")]
    return line


@pytest.mark.parametrize("suite, models", [("placements", "qk,nope"), ("positions", "rope,carope")])
def test_the_device_command_rehearses_and_continues(suite, models, tmp_path, corpus, capsys, records_of):
    line = device_command().replace("S=placements", f"S={suite}")
    assert len(line) < 2000  # the device tool's limit for one command line
    suite_dir = re.search(r"D=(\S+);", line).group(1).replace("$S", suite)
    words = shlex.split(line.split("python3 -m hybrid.train.cli.bench", 1)[1].split("|")[0].replace("$S", suite))
    argv = [w for w in words if w != "2>&1"]
    assert argv[argv.index("--suite") + 1] == suite and argv[argv.index("--budget") + 1] == "gpu"
    assert "--compile" in argv and "--max-minutes" in argv and argv[argv.index("--seeds") + 1] == "0"
    out = argv[argv.index("--out") + 1]
    assert suite_dir == f"{out}/{suite}"  # where the command copies the records in and takes them from
    argv[argv.index("--data") + 1] = str(corpus)
    argv[argv.index("--out") + 1] = str(tmp_path / "a")
    argv += ["--dry-run", "--seq-len", "8", "--window", "4", "--steps", "3", "--models", models.split(",")[0]]
    assert bench_cli.bench_main(argv) == 0  # a first session: one model
    first = records_of(tmp_path / "a" / suite)
    # the next session: a fresh machine, the records committed and copied in; the same command continues
    (tmp_path / "b" / suite).mkdir(parents=True)
    shutil.copy(tmp_path / "a" / suite / "results.jsonl", tmp_path / "b" / suite / "results.jsonl")
    argv[argv.index("--out") + 1] = str(tmp_path / "b")
    argv[argv.index("--models") + 1] = models
    assert bench_cli.bench_main(argv) == 0
    records = records_of(tmp_path / "b" / suite)
    assert [r["run"] for r in records] == [f"{m}/seed0" for m in models.split(",")] and records[0] == first[0]
    assert (tmp_path / "b" / suite / "report.md").is_file() and "report: " in capsys.readouterr().out
