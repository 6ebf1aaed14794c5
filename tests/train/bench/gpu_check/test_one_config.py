"""The tests part holds fla-core's autotuners to one config each: the least demanding, found through
``triton.heuristics`` wrappers, in the modules named by the prefix only."""
import subprocess
import sys
import types

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from hybrid.train.bench.gpu_check.one_config import hold_to_one_config  # noqa: E402

CONFIGS = [triton.Config({"BK": 64, "BV": 32}, num_warps=8, num_stages=3),
           triton.Config({"BK": 32, "BV": 32}, num_warps=1, num_stages=2),
           triton.Config({"BK": 32, "BV": 32}, num_warps=4, num_stages=2),
           triton.Config({"BK": 16, "BV": 64}, num_warps=4, num_stages=4)]


def kernels():
    @triton.heuristics({"EVEN": lambda args: args["n"] % 2 == 0})
    @triton.autotune(configs=list(CONFIGS), key=["n"])
    @triton.jit
    def wrapped(x, n, BK: tl.constexpr, BV: tl.constexpr, EVEN: tl.constexpr):
        pass

    @triton.autotune(configs=list(CONFIGS), key=["n"])
    @triton.jit
    def bare(x, n, BK: tl.constexpr, BV: tl.constexpr):
        pass
    return wrapped, bare


def test_each_autotuner_under_the_prefix_keeps_its_least_demanding_config(monkeypatch):
    wrapped, bare = kernels()
    other_wrapped, other_bare = kernels()
    module = types.ModuleType("fakefla.ops.chunk")
    module.wrapped, module.bare, module.alias = wrapped, bare, bare  # an import of it elsewhere: held once
    elsewhere = types.ModuleType("notfla.ops")
    elsewhere.bare = other_bare
    monkeypatch.setitem(sys.modules, "fakefla.ops.chunk", module)
    monkeypatch.setitem(sys.modules, "notfla.ops", elsewhere)
    assert hold_to_one_config("fakefla.") == 2
    for tuner in (wrapped.fn, bare):
        (kept,) = tuner.configs
        assert (kept.kwargs, kept.num_warps, kept.num_stages) == ({"BK": 32, "BV": 32}, 4, 2)
    assert len(other_bare.configs) == len(CONFIGS)  # outside the prefix: untouched
    assert hold_to_one_config("fakefla.") == 0


def test_fla_s_own_kernels_are_held_in_a_child_process():
    """fla-core (in the test extra) imports on the CPU too: its simple-GLA modules' autotuners are found and held
    (in a child process: fla's kernels stay as they are in this one)."""
    pytest.importorskip("fla", reason="fla-core not installed (pip install -e '.[test]' in the hybrid checkout)")
    code = ("from hybrid.train.bench.gpu_check.one_config import hold_to_one_config\n"
            "held = hold_to_one_config()\n"
            "from fla.ops.common.chunk_h import chunk_fwd_kernel_h\n"
            "tuner = chunk_fwd_kernel_h.fn\n"
            "print(held, len(tuner.configs), tuner.configs[0].num_stages, tuner.configs[0].kwargs)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    held, count, stages, kwargs = done.stdout.split(maxsplit=3)
    assert int(held) > 20 and int(count) == 1 and int(stages) == 2, done.stdout
    assert kwargs.strip() in ("{'BK': 32, 'BV': 32}", "{'BK': 16, 'BV': 16}"), done.stdout  # by fla's shared memory
