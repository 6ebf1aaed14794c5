"""hybrid.kernels.env: one scheme for the kernels' environment variables, old names kept with a deprecation line."""
from __future__ import annotations

import os
import subprocess
import sys
import types
import warnings

import pytest
import torch

from hybrid.kernels.causal_conv import fused, resolve_conv_backend, select_conv_backend
from hybrid.kernels.complex_scan import cpu_scan, resolve_backend
from hybrid.kernels.env import read_deprecated, read_env
from hybrid.kernels.window_attention import resolve_window_backend

NEW, OLD = "HYBRID_TEST_OP_BACKEND", "HYBRID_TEST_OLD_BACKEND"  # names of this file's own
CHOICES = ("auto", "fast", "slow")
CPU = torch.device("cpu")
VARIABLES = ("HYBRID_SCAN_BACKEND", "HYBRID_BACKEND", "HYBRID_CPU_SCAN", "HYBRID_WINDOW_BACKEND",
             "HYBRID_CONV_BACKEND", NEW, OLD)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_unset_or_empty_gives_the_default(monkeypatch):
    assert read_env(NEW, CHOICES, "auto", old=OLD) == "auto"
    monkeypatch.setenv(NEW, "  ")
    monkeypatch.setenv(OLD, "")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty old variable is unset: no warning
        assert read_env(NEW, CHOICES, "auto", old=OLD) == "auto"


def test_the_value_is_stripped_and_lower_cased(monkeypatch):
    monkeypatch.setenv(NEW, " Fast ")
    assert read_env(NEW, CHOICES, "auto") == "fast"


def test_old_name_works_and_warns_once(monkeypatch):
    old = "HYBRID_TEST_OLD_A"  # a name of this test alone: the warning comes once per name and process
    monkeypatch.setenv(old, "slow")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert read_env(NEW, CHOICES, "auto", old=old) == "slow"
    assert [(w.category, str(w.message)) for w in caught] == [
        (FutureWarning, f"${old} is deprecated: use ${NEW} instead")]


def test_new_name_wins_and_the_old_one_still_warns(monkeypatch):
    old = "HYBRID_TEST_OLD_B"
    monkeypatch.setenv(old, "slow")
    monkeypatch.setenv(NEW, "fast")
    with pytest.warns(FutureWarning, match=rf"\${old} is deprecated"):
        assert read_env(NEW, CHOICES, "auto", old=old) == "fast"


@pytest.mark.parametrize("use_old", [False, True], ids=["new", "old"])
def test_bad_value_is_one_line_naming_the_variable(monkeypatch, use_old):
    name = OLD if use_old else NEW
    monkeypatch.setenv(name, "warp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError) as err:
            read_env(NEW, CHOICES, "auto", old=OLD)
    assert str(err.value) == f"{name}: expected one of ('auto', 'fast', 'slow'), got 'warp'"


def test_read_deprecated_returns_the_value_and_warns(monkeypatch):
    old = "HYBRID_TEST_OLD_C"
    assert read_deprecated(old, "$NEW=x") is None
    monkeypatch.setenv(old, " 0 ")
    with pytest.warns(FutureWarning, match=rf"\${old} is deprecated: use \$NEW=x instead"):
        assert read_deprecated(old, "$NEW=x") == "0"


# ---------------------------------------------------------------------------------------------- each op


def test_scan_backend_variable(monkeypatch):
    monkeypatch.setenv("HYBRID_SCAN_BACKEND", "Reference")
    assert resolve_backend(None, CPU) == "reference"
    assert resolve_backend("torch", CPU) == "torch"  # the argument wins over the variable
    monkeypatch.setenv("HYBRID_SCAN_BACKEND", "fast")
    with pytest.raises(ValueError, match=r"^HYBRID_SCAN_BACKEND: expected one of \('auto', 'triton', 'cpu', "
                                         r"'torch', 'reference'\), got 'fast'$"):
        resolve_backend(None, CPU)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # warned once per process: see the test below
def test_scan_old_names_work(monkeypatch):
    monkeypatch.setenv("HYBRID_BACKEND", "reference")
    assert resolve_backend(None, CPU) == "reference"
    monkeypatch.setenv("HYBRID_SCAN_BACKEND", "torch")
    assert resolve_backend(None, CPU) == "torch"  # the new name wins
    monkeypatch.delenv("HYBRID_BACKEND")
    monkeypatch.delenv("HYBRID_SCAN_BACKEND")
    monkeypatch.setenv("HYBRID_CPU_SCAN", "0")
    assert not cpu_scan.available()
    assert resolve_backend(None, CPU) == "torch"


def test_scan_old_names_warn_once_each_in_a_fresh_process():
    code = (
        "import warnings, torch\n"
        "from hybrid.kernels.complex_scan import cpu_scan, resolve_backend\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    got = [resolve_backend(None, torch.device('cpu')) for _ in range(2)]\n"
        "    got += [cpu_scan.available() for _ in range(2)]\n"
        "print(got)\n"
        "for w in caught: print(w.category.__name__, w.message)\n"
    )
    env = {**os.environ, "HYBRID_BACKEND": "torch", "HYBRID_CPU_SCAN": "0"}
    env.pop("HYBRID_SCAN_BACKEND", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "['torch', 'torch', False, False]",
        "FutureWarning $HYBRID_BACKEND is deprecated: use $HYBRID_SCAN_BACKEND instead",
        "FutureWarning $HYBRID_CPU_SCAN is deprecated: use $HYBRID_SCAN_BACKEND=torch instead",
    ]


def test_window_backend_variable(monkeypatch):
    q = torch.zeros(1, 3, 2, 4)
    monkeypatch.setenv("HYBRID_WINDOW_BACKEND", "reference")
    assert resolve_window_backend(None, q) == "reference"
    assert resolve_window_backend("blocked", q) == "blocked"
    monkeypatch.setenv("HYBRID_WINDOW_BACKEND", "dense")
    with pytest.raises(ValueError, match=r"^HYBRID_WINDOW_BACKEND: expected one of .*got 'dense'$"):
        resolve_window_backend(None, q)


def test_conv_backend_variable_takes_every_backend(monkeypatch):
    x, w = torch.zeros(1, 2, 8), torch.zeros(8, 4)
    for value in ("torch", "reference"):
        monkeypatch.setenv("HYBRID_CONV_BACKEND", value)
        assert select_conv_backend("cpu", 8, 4, torch.float32) == resolve_conv_backend(None, x, w) == value
    assert resolve_conv_backend("torch", x, w) == "torch"  # the argument wins over the variable
    monkeypatch.setenv("HYBRID_CONV_BACKEND", "causal_conv1d")
    monkeypatch.setitem(sys.modules, "causal_conv1d", None)  # the package does not import
    fused.causal_conv1d_module.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"^HYBRID_CONV_BACKEND: 'causal_conv1d' needs the causal_conv1d package"):
            resolve_conv_backend(None, x, w)
        stand_in = types.SimpleNamespace(causal_conv1d_fn=None, causal_conv1d_update=None)  # never called here
        monkeypatch.setitem(sys.modules, "causal_conv1d", stand_in)
        fused.causal_conv1d_module.cache_clear()
        assert select_conv_backend("cpu", 8, 4, torch.float32) == "causal_conv1d"  # forced, as asked
    finally:
        fused.causal_conv1d_module.cache_clear()
    monkeypatch.setenv("HYBRID_CONV_BACKEND", "bogus")
    with pytest.raises(ValueError, match=r"^HYBRID_CONV_BACKEND: expected one of .*got 'bogus'$"):
        select_conv_backend("cpu", 8, 4, torch.float32)
