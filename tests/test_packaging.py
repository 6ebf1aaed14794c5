"""The library installs one top-level name, ``hybrid``: the collisions with users' own ``train.py``,
``models/`` and ``kernels/`` (and with the published ``kernels`` distribution) cannot happen. The distribution
is named ``hybrid-lm`` (``hybrid`` on the package index is an unrelated project); the import name is ``hybrid``.

Each check runs Python in a subprocess from a directory outside the repository, so that nothing of the
checkout is on ``sys.path`` except through the install itself.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAPPED = {"hybrid": "hybrid", "hybrid.kernels": "kernels", "hybrid.models": "models", "hybrid.train": "train"}
FOREIGN = ("kernels", "models", "train")
IMPORT_ALL = ("import hybrid, hybrid.kernels, hybrid.models, hybrid.train, hybrid.train.bench.speed; "
              "from hybrid import HybridLM, HybridConfig, complex_scan, Trainer; print('ok')")


def run(args, cwd, env=None):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{args} failed in {cwd}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def source_dir(package: str) -> Path:
    """The repository folder an installed package comes from, through the package-dir mapping."""
    top = next(p for p in sorted(MAPPED, key=len, reverse=True) if package == p or package.startswith(p + "."))
    return REPO / MAPPED[top] / Path(*package[len(top):].split(".")[1:])


def test_every_package_folder_is_listed_in_pyproject():
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["package-dir"] == MAPPED
    listed = set(setup["packages"])
    on_disk = {
        ".".join([top, *init.parent.relative_to(REPO / folder).parts])
        for top, folder in MAPPED.items() for init in (REPO / folder).rglob("__init__.py")
    }
    assert on_disk == listed, f"missing from pyproject: {on_disk - listed}; listed but absent: {listed - on_disk}"
    assert all(source_dir(p).is_dir() for p in listed)


def test_the_distribution_is_hybrid_lm_and_installs_the_import_name_hybrid(tmp_path):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "hybrid-lm"
    probe = ("from importlib.metadata import distribution, packages_distributions as p; "
             "print(distribution('hybrid-lm').metadata['Name'], sorted(set(p()['hybrid'])))")
    # from outside the checkout, where a stale hybrid.egg-info of the old name is not on sys.path
    assert run([sys.executable, "-c", probe], cwd=tmp_path).strip() == "hybrid-lm ['hybrid-lm']"
    extras = project["optional-dependencies"]
    assert {"tensorboard", "wandb"} <= set(extras) and any(d.startswith("tensorboard") for d in extras["test"])


def test_installed_names_are_under_hybrid_only(tmp_path):
    probe = ("import importlib.util as u; "
             f"print([n for n in {FOREIGN!r} if u.find_spec(n) is not None])")
    assert run([sys.executable, "-c", probe], cwd=tmp_path).strip() == "[]"
    assert run([sys.executable, "-c", IMPORT_ALL], cwd=tmp_path).strip() == "ok"


@pytest.fixture
def users_project(tmp_path):
    """A user's project with its own ``train.py``, ``models/`` and ``kernels/``, each of which fails loudly."""
    boom = "raise RuntimeError('the user module {} was imported instead of the library')\n"
    (tmp_path / "train.py").write_text(boom.format("train.py"))
    for name in ("models", "kernels"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(boom.format(name))
    return tmp_path


def test_library_and_clis_work_beside_users_train_models_kernels(users_project):
    assert run([sys.executable, "-c", IMPORT_ALL], cwd=users_project).strip() == "ok"
    assert "--preset" in run([sys.executable, "-m", "hybrid.train", "--help"], cwd=users_project)
    bindir = Path(sysconfig.get_path("scripts"))
    for cli in ("hybrid-train", "hybrid-generate"):
        assert "usage" in run([str(bindir / cli), "--help"], cwd=users_project)


def test_wheel_holds_only_hybrid_and_imports_in_a_fresh_venv(tmp_path):
    # build from a copy: setuptools writes build/ into the tree it builds, and a stale build/ would leak old files
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "runs", "*.egg-info", "__pycache__", ".pytest_cache"))
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
         str(source)], cwd=tmp_path)
    (wheel,) = wheels.glob("hybrid_lm-*.whl")  # the distribution hybrid-lm
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
        assert "hybrid/kernels/complex_scan/triton_scan.py" in zf.namelist()
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hybrid"}, tops

    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=False, system_site_packages=False)
    py = fresh / "bin" / "python"
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path).strip())
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
         str(wheel)], cwd=tmp_path)
    # The dependencies (torch, datasets, ...) come from this environment's site-packages, as a plain path:
    # directories named in a .pth file get none of their own .pth files run, so the editable finder of the
    # development install stays out and `hybrid` can only come from the wheel.
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    where = "import hybrid.kernels as k; print(k.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert run([str(py), "-c", where], cwd=tmp_path, env=env).strip().startswith(str(site / "hybrid" / "kernels"))
    assert run([str(py), "-c", IMPORT_ALL], cwd=tmp_path, env=env).strip() == "ok"
    probe = f"import importlib.util as u; print([n for n in {FOREIGN!r} if u.find_spec(n) is not None])"
    assert run([str(py), "-c", probe], cwd=tmp_path, env=env).strip() == "[]"


def test_the_kernels_folder_reached_as_top_level_kernels_registers_nothing():
    """From a checkout's root, ``kernels/`` is also importable as a top-level ``kernels``, a name transformers
    imports to probe for the Hugging Face `kernels` package. That copy must stay empty: a second import of the ops
    would register the custom ops again, and the op would then run the copy's functions, not ``hybrid.kernels``'."""
    code = ("import sys, torch; from hybrid.kernels.complex_scan import triton_scan; import kernels; "
            "calls = []; real = triton_scan.empty_buffer; "
            "triton_scan.empty_buffer = lambda *a: calls.append(a) or real(*a); "
            "from hybrid.kernels import complex_scan; "
            "complex_scan(torch.randn(1, 5, 1, 4), -torch.rand(1, 5, 1, 2), torch.randn(1, 5, 1, 2), backend='triton'); "
            "print(kernels.__all__, sorted(m for m in sys.modules if m.startswith('kernels.')), len(calls))")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "[]", "2"], done.stdout  # y and the final state from hybrid.kernels' module
