"""Context parallelism equals one rank: every op, mixer and preset run on a sequence split across 2 and 3 gloo
ranks gives one process's outputs and gradients (float64, relative error ≤ 1e-12): static and data-dependent
decay and phase, the conv (a halo inside one shard and across two), windows shorter and longer than a shard and
global attention, packed documents with boundaries before, at and after the shard edges and across every shard,
initial and final states. The cases are in `cases_kernels.py` and `cases_layers.py`; `conftest.py` runs them."""
import pytest

from hybrid.models import PRESETS

TOLERANCE = 1e-12  # float64; the errors measured are below 1e-14
LAYERS = {
    "ops": lambda name: name.split()[0] in ("scan", "retention", "retention,", "gla", "conv", "attention"),
    "mixers": lambda name: name.split()[0].rstrip(",") in ("R", "A", "M", "G"),
    "models": lambda name: name.startswith("model "),
}


def test_every_case_belongs_to_a_layer(cp_results):
    names = {name for cases in cp_results.values() for name in cases}
    assert names and all(sum(belongs(name) for belongs in LAYERS.values()) == 1 for name in names)


def test_every_preset_has_a_model_case(cp_results):
    """Every preset runs context-parallel (none is refused) and is compared with one rank."""
    names = {name for cases in cp_results.values() for name in cases}
    missing = [preset for preset in PRESETS if not any(name.startswith(f"model {preset}") for name in names)]
    assert not missing, f"presets without a context-parallel model case: {missing}"


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_context_parallel_equals_one_rank(cp_results, size, layer):
    cases = {name: ranks for name, ranks in cp_results[size].items() if LAYERS[layer](name)}
    assert len(cases) >= 10  # the suite ran (a filter or a broken registry would leave nothing to compare)
    failures = []
    for name, ranks in cases.items():
        assert len(ranks) == size, f"{name}: {len(ranks)} of {size} ranks reported"
        for rank, checks in enumerate(ranks):
            if "error" in checks:
                failures.append(f"{name} (rank {rank}/{size}) raised:\n{checks['error']}")
                continue
            failures += [f"{name} (rank {rank}/{size}): {check} off by {err:.3g}"
                         for check, err in checks.items() if not abs(err) <= TOLERANCE]
    assert not failures, "\n".join(failures)
