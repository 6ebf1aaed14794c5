"""Every command line offers the options it offered before issue 43 (``tests/fixtures/pre_one_loop/
cli_options.json``, captured at commit 6b41f74): the same flags, dests, actions, defaults, choices, metavars and
nargs, and each value read (or refused, with the same one-line error) as before. The flags are generated from the
run configs' option declarations now, so their help and --help groups are the declarations' (every option still has
help); this is the proof that nothing a user types changed, but for the changes and additions listed here."""
import importlib.util
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[2] / "fixtures"
_spec = importlib.util.spec_from_file_location("cli_options", FIXTURES / "cli_options.py")
cli_options = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli_options)

BEFORE = json.loads((FIXTURES / "pre_one_loop" / "cli_options.json").read_text())

# the commands as a user types them -> their main at 6b41f74 (the fixtures' maker), and where each module went
_maker_spec = importlib.util.spec_from_file_location("make_pre_one_loop", FIXTURES / "make_pre_one_loop.py")
maker = importlib.util.module_from_spec(_maker_spec)
_maker_spec.loader.exec_module(maker)
MOVED = {  # issue 43: every command line in train/cli/ (the studies' in train/cli/studies/)
    "hybrid.train.cli": "hybrid.train.cli.lm", "hybrid.train.tasks.cli": "hybrid.train.cli.synthetic",
    "hybrid.train.hf.cli": "hybrid.train.cli.hf", "hybrid.train.rotary_analysis.cli": "hybrid.train.cli.rope_analyze",
    "hybrid.train.bench.cli": "hybrid.train.cli.bench", "hybrid.train.distill.cli": "hybrid.train.cli.distill",
    "hybrid.train.tasks.passkey_reach": "hybrid.train.cli.studies.passkey_reach",
    "hybrid.train.tasks.passkey_positions": "hybrid.train.cli.studies.passkey_positions",
    "hybrid.train.tasks.passkey_probe": "hybrid.train.cli.studies.passkey_probe",
    "hybrid.train.tasks.recurrence_probe": "hybrid.train.cli.studies.recurrence_probe",
    "hybrid.train.bench.context_compare": "hybrid.train.cli.studies.context_compare",
    "hybrid.train.bench.decode_compare": "hybrid.train.cli.studies.decode_compare",
    "hybrid.train.distill.bench": "hybrid.train.cli.studies.distill_bench",
}
COMMANDS = {command: MOVED.get(target.split(":")[0], target.split(":")[0]) + ":" + target.split(":")[1]
            for command, target in maker.COMMANDS.items()}

# what issue 43 changed on purpose: (command, option, field) -> why
CHANGED = {
    ("hybrid-synthetic", "--model", "choices"): "the models only; the parity study's candidates run from its own "
                                                "suite (--suite parity-recipe --models CANDIDATE)",
    ("hybrid-distill", "--lr", "type"): "one declaration of lr: read as a number and checked by the config, as "
                                        "hybrid-train reads it (the same one-line error, from the config)",
    ("hybrid-train", "--preset", "choices"): "issue 46: the vo-gla preset (the G mixer) joins",
    ("hybrid-synthetic", "--preset", "choices"): "issue 46: the vo-gla preset (the G mixer) joins",
    ("bench-long-context", "--presets", "default"): "issue 46: vo-gla is measured beside the other presets",
    ("hybrid-bench", "--set", "type"): "issue 46: HybridConfig gains the gla section, which --set's error names",
    ("hybrid-distill", "--set", "type"): "issue 46: HybridConfig gains the gla section, which --set's error names",
    ("hybrid-train", "--set", "type"): "issue 46: HybridConfig gains the gla section, which --set's error names",
    ("hybrid-synthetic", "--set", "type"): "issue 46: HybridConfig gains the gla section, which --set's error names",
    ("hybrid-eval", "--device", "default"): "issue 47: auto, as every other command (CUDA when there is one)",
    ("hybrid-eval", "--device", "type"): "issue 47: the shared --device flag, checked as it is parsed",
    ("hybrid-eval", "--num-fewshot", "type"): "issue 47: 0 or more (-1 was accepted and handed to lm-eval)",
    ("hybrid-eval", "--max-length", "type"): "issue 47: at least 2, a token of context and one to score (1 was "
                                             "lm-eval's AssertionError)",
    ("hybrid-bench", "--budget", "choices"): "issue 42: the gpu-long budget joins (L 2048 on one H100)",
    ("hybrid-bench", "--budget", "default"): "smoke still, but None in the parser: with --report-only the records' "
                                             "budget, so a report never describes other runs than its tables",
}
# options a command gained: (command, option) -> why
ADDED = {
    ("hybrid-distill", "--grad-accum"): "the data section, shared: the loop accumulates micro-batches for every run",
    ("hybrid-distill", "--on-nonfinite"): "the loop section, shared: the divergence policy is the loop's",
    ("hybrid-distill", "--compile"): "the execution section, shared",
    ("hybrid-distill", "--fsdp"): "the execution section, shared: distillation shards with FSDP2 as hybrid-train",
    ("hybrid-generate", "--prompts"): "issue 45: a file of prompts decoded together with continuous batching",
    ("hybrid-generate", "--max-batch"): "issue 45: how many of those prompts are decoded at once",
    ("hybrid-generate", "--compile"): "the decode steps under torch.compile (generate's and the Decoder's compile), "
                                      "for GPU decoding bound by its ops' dispatch",
    ("hybrid-generate", "--cuda-graph"): "the decode step recorded as a CUDA graph and replayed (generate's and the "
                                         "Decoder's compile='cuda-graph'): GPU decoding bound by kernel launches",
    ("demo", "--overwrite"): "the demo replaces only its own earlier run: a run trained on from it, or another "
                             "folder, is replaced only with --overwrite (no command overwrites a user's run without it)",
    ("hybrid-train", "--cp"): "issue 44: context parallelism, each sequence split across N ranks of a data × context "
                              "mesh",
    **{(command, "--skip-rows-without-text"): "issue 47: the data section's, shared by every command that reads "
                                              "--data: a table file with rows that lack the text column is refused "
                                              "unless this flag trains on the rows that have it"
       for command in ("hybrid-train", "hybrid-distill", "hybrid-bench", "hybrid-rope-analyze")},
    ("hybrid-bench", "--compile"): "issue 42: the execution section's, shared: each run's training step compiled "
                                   "(the gpu-long budget on CUDA)",
    ("hybrid-bench", "--dry-run"): "issue 42: a suite meant for a GPU rehearsed on the CPU at the smoke budget's sizes",
    ("hybrid-eval", "--overwrite"): "an existing --output file is replaced only with it (no command overwrites a "
                                    "user's file without --overwrite)",
    ("hybrid-bench", "--max-minutes"): "issue 42: a suite stopped between runs inside a device's time limit, its "
                                       "records written; the same command continues",
    **{(command, "--threads"): "issue 47: every command that runs torch work takes --threads (only hybrid-bench did)"
       for command in ("hybrid-train", "hybrid-generate", "hybrid-distill", "hybrid-synthetic", "hybrid-export",
                       "hybrid-import", "hybrid-eval", "hybrid-rope-analyze")},
}
GENERATED = ("help", "group")  # the declarations' now


def _changed(command: str, option: str, entry: dict) -> dict:
    return {k: v for k, v in entry.items() if (command, option, k) not in CHANGED and k not in GENERATED}


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

    then, today = flat(before, BEFORE["types"]), flat(now, NOW["types"])
    assert sorted(today) == sorted([*then, *(name for cmd, name in ADDED if cmd == command)])
    for name, entry in then.items():
        assert today[name] == entry, (command, name)
    assert now["exclusive"] == before["exclusive"]
    for name, entry in now["options"].items():  # every option that said what it is still does
        assert entry["help"] or not before["options"].get(name, {"help": "new"})["help"], (command, name)


def test_the_changes_are_the_ones_listed():
    """Each listed change and addition is real (a change that no longer differs is taken off the list)."""
    for command, option, field in CHANGED:
        before = BEFORE["commands"][command]["options"][option]
        now = NOW["commands"][command]["options"][option]
        if field == "type":  # a flag read as text before has no type
            then = BEFORE["types"][before["type"]] if "type" in before else None
            assert then != (NOW["types"][now["type"]] if "type" in now else None), (command, option)
        else:
            assert before[field] != now[field], (command, option, field)
    for command, option in ADDED:
        assert option in NOW["commands"][command]["options"] and option not in BEFORE["commands"][command]["options"]


def test_the_commands_are_the_ones_there_were():
    assert sorted(NOW["commands"]) == sorted(BEFORE["commands"])


@pytest.mark.parametrize("name, added", [
    # issue 44: context parallelism (default 1: as before); issue 47: the data section's new option
    ("TrainConfig", {"cp", "skip_rows_without_text"}),
    ("DistillConfig", {"grad_accum", "on_nonfinite", "compile", "fsdp",  # the sections it now takes whole
                       "skip_rows_without_text"}),
    ("TaskRunConfig", {"min_lr_ratio", "betas"}),  # the optimizer section's, at the values it always used
])
def test_the_run_configs_keep_their_fields_and_defaults(name, added):
    from hybrid.train import TrainConfig
    from hybrid.train.distill import DistillConfig
    from hybrid.train.tasks.train import TaskRunConfig

    config = {"TrainConfig": TrainConfig, "DistillConfig": lambda: DistillConfig(teacher="-", pattern="R"),
              "TaskRunConfig": TaskRunConfig}[name]().to_dict()
    before = BEFORE["configs"][name]
    assert set(config) == set(before) | added
    assert {k: config[k] for k in before} == before
