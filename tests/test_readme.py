"""Every command the README shows works as written in a fresh shell (no virtual environment activated).

The commands are taken from the README's shell code blocks (fences without a language), and every
`.venv/bin/…` command anywhere else in it (inline, or in the demo's printed output). Each is split as bash
would split it, then: `make T` must be a target (`make -n T`); `.venv/bin/X ARGS` must exist and accept ARGS
(X's console-script function is called in-process with ``ARGS --help``: argparse checks every option and value
up to --help, then exits 0); the main programs also start in an environment without the venv on PATH. A bare
`hybrid-train …` would fail in a fresh shell, so it fails here; plain shell tools (mkdir, sed) are checked for
syntax. When the repository has no `.venv` (an install made some other way), the scripts beside the running
interpreter stand in for `.venv/bin`.

Every Python block (```python fences) runs as pasted, each in a fresh namespace: a name a block uses must be
defined in it (the README's models are tiny, so this stays fast).
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from importlib.metadata import entry_points

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
VENV_BIN = REPO / ".venv" / "bin"
BIN = VENV_BIN if (VENV_BIN / "hybrid-train").exists() else Path(sys.executable).parent


def shell_blocks(text: str) -> list[str]:
    """Lines of the fenced blocks without a language (the README's shell blocks)."""
    lines = []
    for info, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if info in ("", "bash", "sh", "shell"):
            lines += [line for line in body.splitlines() if line.strip()]
    return lines


def venv_commands(text: str) -> list[str]:
    """Every `.venv/bin/…` command outside the shell blocks: inline code, or a line of printed output."""
    outside = re.sub(r"^```(?:|bash|sh|shell)\n.*?^```", "", text, flags=re.S | re.M)
    found = re.findall(r"`(\.venv/bin/[^`]+)`", outside)
    found += [m.strip() for m in re.findall(r"(?:^|\s)(\.venv/bin/\S.*)$", outside, flags=re.M) if "`" not in m]
    return found


COMMANDS = sorted(set(shell_blocks(README) + venv_commands(README)))


def bash_words(command: str) -> list[str]:
    """The words bash makes of ``command`` (quotes, $'…' escapes, comments), without running it."""
    script = "set -f\nfor word in " + command + "\ndo printf '%s\\0' \"$word\"; done"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


def fresh_env(tmp_path) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1",
            "HYBRID_CACHE": str(tmp_path / "cache")}


def test_the_readme_shows_commands():
    assert "make demo" in " ".join(COMMANDS) and sum(c.startswith(".venv/bin/hybrid-train") for c in COMMANDS) >= 3
    assert any(c.startswith(".venv/bin/hybrid-generate") for c in COMMANDS)


SHELL_TOOLS = ("mkdir", "sed", "cd", "source")


def script_function(name: str):
    """The function the console script ``name`` calls (``hybrid.train.cli.lm:train_main`` for hybrid-train)."""
    (entry,) = [e for e in entry_points(group="console_scripts") if e.name == name]
    return entry.load()


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses_as_written(command, capsys):
    if command.split()[0] in SHELL_TOOLS:
        assert subprocess.run(["bash", "-n", "-c", command]).returncode == 0, command
        return
    words = bash_words(command)
    program, args = words[0], words[1:]
    if program == "make":
        assert len(args) == 1, command
        proc = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return
    assert program.startswith(".venv/bin/"), f"{command!r}: a fresh shell has no {program!r} on PATH"
    name = program.removeprefix(".venv/bin/")
    assert (BIN / name).exists(), f"{command!r}: {BIN / name} does not exist"
    if name == "torchrun":  # the script's own arguments follow `-m hybrid.train`
        assert args[-2:] != ["-m", "hybrid.train"] and "-m" in args, command
        name, args = "hybrid-train", args[args.index("-m") + 2:]
    try:
        code = script_function(name)([*args, "--help"])
    except SystemExit as e:
        code = e.code
    assert code == 0, f"{command!r}: {capsys.readouterr().err[-500:]}"


@pytest.mark.parametrize("name", ["hybrid-train", "hybrid-generate", "torchrun"])
def test_readme_programs_start_in_a_fresh_shell(name, tmp_path):
    assert any(c.startswith(f".venv/bin/{name}") for c in COMMANDS)
    proc = subprocess.run([str(BIN / name), "--help"], cwd=REPO, env=fresh_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "usage" in proc.stdout.lower(), proc.stderr[-2000:]


def test_the_readme_shows_the_conveniences_of_issue_28():
    """--config, --log and --overwrite are shown; the resume line points to docs/training.md; the distribution
    name is hybrid-lm."""
    shown = " ".join(COMMANDS)
    assert ".venv/bin/hybrid-train --config runs/mine/train_config.json" in shown
    assert "--log tensorboard" in shown and "--overwrite" in shown
    assert "`hybrid-lm`" in README and "pip install 'hybrid[" not in README
    resume = README[README.index("`--resume DIR` continues"):]
    assert "docs/training.md" in resume.split("\n\n")[0]


def test_the_readme_config_and_log_commands_do_what_they_say(tmp_path, monkeypatch):
    """The --config command reads a run's train_config.json, its flags over the file; --log's package is there."""
    import json

    from hybrid.train import TrainConfig
    from hybrid.train.cli.lm import train_config_from_args, train_parser
    from hybrid.train.output.tracking import check_trackers

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    saved = TrainConfig(steps=2000, out="runs/mine", model={"window": 32})
    (tmp_path / "runs" / "mine" / "train_config.json").write_text(json.dumps(saved.to_dict(), indent=2))
    for command in COMMANDS:
        if not command.startswith(".venv/bin/hybrid-train "):
            continue
        words = bash_words(command)
        args = train_parser().parse_args(words[1:])
        if args.config is not None:
            assert TrainConfig(**train_config_from_args(args)) == saved.replace(steps=4000, out="runs/again")
        if "log" in vars(args):
            check_trackers(args.log)  # tensorboard is in the test extra


def python_blocks(text: str) -> list[str]:
    """The README's ```python blocks, in order."""
    return [body for info, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M) if info == "python"]


def test_the_readme_shows_python_blocks():
    blocks = python_blocks(README)
    assert len(blocks) >= 3 and any("HybridLM(config)" in b for b in blocks) and any("complex_scan(" in b for b in blocks)


@pytest.mark.parametrize("index", range(len(python_blocks(README))))
def test_readme_python_block_runs_as_pasted(index, one_torch_thread):
    """Each block runs alone, in a namespace of its own: every name it uses is defined in it."""
    import torch

    torch.manual_seed(0)
    block = python_blocks(README)[index]
    namespace: dict = {"__name__": f"readme_block_{index}"}
    exec(compile(block, f"README.md python block {index}", "exec"), namespace)


def test_the_readme_says_what_recurrence_phase_holds():
    """The API tour's comment: phase None by default, which is the "static" rotation (carope with rotary.carope)."""
    from hybrid.models import HybridConfig

    config = HybridConfig.preset("hybrid", "tiny", **{"attention.window": 256})
    assert (config.attention.window, config.recurrence.phase, config.rotary.base) == (256, None, 10000.0)
    assert config.resolved_rnn_phase == "static"
    assert HybridConfig.preset("hybrid", "tiny", carope=True).resolved_rnn_phase == "carope"
    assert "(256, None, 10000.0)" in README and 'phase None: "static"' in README


def test_the_readme_says_what_suite_all_runs():
    """hybrid-synthetic --suite all: the state-tracking and MQAR tasks, every suite model (not the passkey suites)."""
    from hybrid.train.tasks.suites import BUDGETS, MODELS, SUITES, build_specs

    assert set(SUITES["all"]) == set(SUITES["state-tracking"]) | set(SUITES["mqar"])
    specs = build_specs("all", BUDGETS["smoke"])
    assert {s.model for s in specs} == set(MODELS)
    assert {s.config["task"] for s in specs} == set(SUITES["all"])
    line = next(c for c in COMMANDS if "--suite all" in c and "hybrid-synthetic" in c)
    assert "state tracking + MQAR, every model" in line
