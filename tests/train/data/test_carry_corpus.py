"""hybrid.train.data.carry_corpus: the carried corpus from a folder of fake packages: what is kept and left out,
fair by bytes across packages, deduplicated, capped, the same folder twice, and read back as documents."""
from __future__ import annotations

import pytest

from hybrid.train.data import carry_corpus, resolve_source


@pytest.fixture
def site(tmp_path):
    """A fake site-packages: three packages (one large), a module file, a dist-info, and what must be left out."""
    root = tmp_path / "site-packages"

    def write(relative, data):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    for i in range(6):
        write(f"big/mod{i}.py", f"# big {i}\n" + "x = 1\n" * 40)  # 250 bytes each
    write("small/__init__.py", "# small\nimport os\n")
    write("small/README.md", "# Small\n\nA package.\n")
    write("small/same.py", "# big 0\n" + "x = 1\n" * 40)  # the same bytes as big/mod0.py
    write("small/empty.py", "  \n")
    write("small/data.bin", b"\x00\x01")
    write("small/latin.py", b"caf\xe9 = 1\n")  # not UTF-8
    write("small/__pycache__/x.py", "cached = 1\n")
    write("small/.hidden.py", "hidden = 1\n")
    write("small/huge.py", "#" * (carry_corpus.MAX_FILE_BYTES + 1))
    write("tiny.py", "tiny = 1\n")
    write("tiny-1.0.dist-info/METADATA", "Name: tiny\n\nThe tiny module.\n")
    write("tiny-1.0.dist-info/RECORD", "tiny.py,,\n")
    write("tiny-1.0.dist-info/top_level.txt", "tiny\n")
    return root


def test_what_is_kept_in_which_order(site, tmp_path):
    chosen = list(carry_corpus.choose([site], max_bytes=10**6))
    names = [name for name, _ in chosen]
    assert sorted(names) == sorted([*(f"big/mod{i}.py" for i in range(6)), "small/README.md", "small/__init__.py",
                                    "tiny-1.0.dist-info/METADATA", "tiny.py"])
    # fair by bytes: each package gives a file in turn until it has given more than the others
    assert names[:4] == ["big/mod0.py", "small/README.md", "tiny-1.0.dist-info/METADATA", "tiny.py"]
    assert names[-1] == "big/mod5.py"
    assert all(data == (site / name).read_bytes() for name, data in chosen)  # byte for byte


def test_the_cap_stops_at_the_first_file_that_would_pass_it(site):
    chosen = list(carry_corpus.choose([site], max_bytes=500))
    assert sum(len(d) for _, d in chosen) == 324  # big/mod1.py (248 bytes) would pass 500
    assert [n for n, _ in chosen] == ["big/mod0.py", "small/README.md", "tiny-1.0.dist-info/METADATA", "tiny.py",
                                      "small/__init__.py"]


def test_build_is_deterministic_and_reads_back_as_documents(site, tmp_path):
    first = carry_corpus.build(tmp_path / "a", max_bytes=10**6, sites=[site])
    second = carry_corpus.build(tmp_path / "b", max_bytes=10**6, sites=[site])
    assert first == second and first["files"] == 10 and first["packages"] == 4
    files = sorted(p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b").as_posix() for p in (tmp_path / "b").rglob("*")
                           if p.is_file())
    assert sum((tmp_path / "a" / f).stat().st_size for f in files) == first["bytes"]
    source = resolve_source(tmp_path / "a")
    assert source.kind == "files" and "(10 files)" in source.description  # every file a document
    assert not (tmp_path / "a.partial").exists()


def test_errors_are_one_line(site, tmp_path, capsys):
    (tmp_path / "there").mkdir()
    assert carry_corpus.main(["--out", str(tmp_path / "there"), "--site", str(site)]) == 2
    assert carry_corpus.main(["--out", str(tmp_path / "new"), "--site", str(site), "--max-mib", "0"]) == 2
    assert carry_corpus.main(["--out", str(tmp_path / "new"), "--site", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"carry_corpus: error: --out: expected a folder that does not exist yet, got {tmp_path / 'there'}",
                   "carry_corpus: error: --max-mib: expected a positive number of MiB, got 0",
                   f"carry_corpus: error: --site: expected a folder, got {tmp_path / 'nowhere'}"]
    assert carry_corpus.main(["--out", str(tmp_path / "new"), "--site", str(site), "--max-mib", "1"]) == 0
    assert "10 files from 4 packages" in capsys.readouterr().out
