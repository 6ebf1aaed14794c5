"""hybrid.train.data.pinned_corpus and ``carry_corpus --pinned``: wheels found or fetched, laid out as
site-packages holds them, and a pinned build that does not give the pinned digest removed, not carried. (The
real wheels come from the package index: docs/gpu.md's build prints the digest that the command checks.)"""
from __future__ import annotations

import subprocess
import zipfile

import pytest

from hybrid.train.data import carry_corpus, pinned_corpus


def make_wheel(folder, name, version, files):
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for relative, text in files.items():
            archive.writestr(relative, text)
    return path


def test_wheels_unpack_as_site_packages_without_their_data_folders(tmp_path):
    wheel = make_wheel(tmp_path, "demo", "1.0", {
        "demo/__init__.py": "x = 1\n", "demo/docs/guide.md": "# Guide\n",
        "demo-1.0.dist-info/METADATA": "Name: demo\n\nA demo.\n",
        "demo-1.0.data/scripts/demo-run": "#!/bin/sh\n"})
    site = pinned_corpus.unpack([wheel], tmp_path / "site")
    found = sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file())
    assert found == ["demo-1.0.dist-info/METADATA", "demo/__init__.py", "demo/docs/guide.md"]
    chosen = dict(carry_corpus.choose([site], max_bytes=10**6))
    assert set(chosen) == set(found)


def test_wheels_already_fetched_are_not_fetched_again(tmp_path, monkeypatch):
    make_wheel(tmp_path, "demo_pkg", "1.0", {"demo_pkg/a.py": "a = 1\n"})
    make_wheel(tmp_path, "demo_pkg", "2.0", {"demo_pkg/a.py": "a = 2\n"})

    def no_pip(*args, **kwargs):
        raise AssertionError("pip was called for a wheel that is there")

    monkeypatch.setattr(subprocess, "run", no_pip)
    (found,) = pinned_corpus.download(tmp_path, ["demo-pkg==2.0"])
    assert found.name == "demo_pkg-2.0-py3-none-any.whl"


def test_a_wheel_pip_cannot_fetch_is_one_line(tmp_path, monkeypatch):
    def failing_pip(cmd, **kwargs):
        assert cmd[3:5] == ["download", "--quiet"] and "--only-binary=:all:" in cmd and cmd[-1] == "nothing==0.1"
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: x\nERROR: No matching distribution found\n")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(ValueError, match=r"^pinned wheels: expected pip to download 1 pure-Python wheels into .*, "
                                         r"got: ERROR: No matching distribution found$"):
        pinned_corpus.download(tmp_path, ["nothing==0.1"])


def test_a_pinned_build_with_another_digest_is_removed(tmp_path, monkeypatch, capsys):
    wheel = make_wheel(tmp_path, "demo", "1.0", {"demo/__init__.py": "x = 1\n"})
    monkeypatch.setattr(pinned_corpus, "download", lambda folder: [wheel])
    out = tmp_path / "corpus"
    assert carry_corpus.main(["--out", str(out), "--pinned"]) == 2
    err = capsys.readouterr().err
    assert f"--pinned: expected sha256 {pinned_corpus.PINNED_DIGEST}, got " in err and err.count("\n") == 1
    assert not out.exists()
    # at another size there is no pinned digest to hold it to: the folder is kept, its digest printed
    assert carry_corpus.main(["--out", str(out), "--pinned", "--max-mib", "1"]) == 0
    assert (out / "demo" / "__init__.py").read_text() == "x = 1\n" and "sha256" in capsys.readouterr().out
    assert carry_corpus.main(["--out", str(tmp_path / "other"), "--pinned", "--site", str(tmp_path)]) == 2
    assert "--pinned: expected no --site beside it" in capsys.readouterr().err
