"""Every command line offers the options it offered before issue 43 (``tests/fixtures/pre_one_loop/
cli_options.json``, captured at commit 6b41f74): the same flags, defaults, choices, metavars, groups and help, and
each value read (or refused, with the same one-line error) as before. The flags are generated from the config
fields' metadata now; this is the proof that nothing a user types changed, but for the changes listed here."""
import importlib.util
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[2] / "fixtures"
_spec = importlib.util.spec_from_file_location("cli_options", FIXTURES / "cli_options.py")
cli_options = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli_options)

BEFORE = json.loads((FIXTURES / "pre_one_loop" / "cli_options.json").read_text())

# the commands as a user types them -> their main today
COMMANDS = {
    "hybrid-train": "hybrid.train.cli.lm:train_main",
    "hybrid-generate": "hybrid.train.cli.lm:generate_main",
    "hybrid-synthetic": "hybrid.train.cli.synthetic:main",
    "hybrid-export": "hybrid.train.cli.hf:export_main",
    "hybrid-import": "hybrid.train.cli.hf:import_main",
    "hybrid-eval": "hybrid.train.cli.hf:eval_main",
    "hybrid-rope-analyze": "hybrid.train.cli.rope_analyze:analyze_main",
    "hybrid-bench": "hybrid.train.cli.bench:bench_main",
    "hybrid-distill": "hybrid.train.cli.distill:main",
    "demo": "hybrid.train.demo:main",
    "distill-bench": "hybrid.train.distill.bench:main",
    "passkey-reach": "hybrid.train.tasks.passkey.reach:main",
    "passkey-positions": "hybrid.train.tasks.passkey.positions:main",
    "passkey-probe": "hybrid.train.tasks.passkey.probe:main",
    "recurrence-probe": "hybrid.train.tasks.recurrence_probe:main",
    "bench-speed": "hybrid.train.bench.speed:main",
    "bench-window": "hybrid.train.bench.window:main",
    "bench-packing": "hybrid.train.bench.packing:main",
    "bench-long-context": "hybrid.train.bench.long_context:main",
    "bench-scan": "hybrid.train.bench.scan:main",
    "bench-scan-gpu": "hybrid.train.bench.scan_gpu:main",
    "bench-context-compare": "hybrid.train.bench.context_compare:main",
    "bench-decode-compare": "hybrid.train.bench.decode_compare:main",
}

# what issue 43 changed on purpose: (command, option, field) -> why
CHANGED = {}


def _changed(command: str, option: str, entry: dict) -> dict:
    return {k: v for k, v in entry.items() if (command, option, k) not in CHANGED}


NOW = cli_options.option_sets(COMMANDS)


def _types(sets: dict) -> list:
    return sets["types"]


@pytest.mark.parametrize("command", sorted(BEFORE["commands"]))
def test_every_option_is_offered_and_read_as_before(command):
    before, now = BEFORE["commands"][command], NOW["commands"][command]

    def flat(described, types):
        out = {}
        for name, entry in described["options"].items():
            entry = dict(entry)
            if "type" in entry:
                entry["type"] = types[entry["type"]]
            out[name] = _changed(command, name, entry)
        for sub, d in described["subcommands"].items():
            out.update({f"{sub} {k}": v for k, v in flat(d, types).items()})
        return out

    assert sorted(flat(now, NOW["types"])) == sorted(flat(before, BEFORE["types"]))
    for name, entry in flat(before, BEFORE["types"]).items():
        assert flat(now, NOW["types"])[name] == entry, (command, name)
    assert now["exclusive"] == before["exclusive"]


def test_the_commands_are_the_ones_there_were():
    assert sorted(NOW["commands"]) == sorted(BEFORE["commands"])
