"""hybrid.train.data.sources: the standard library's files, local paths, hub names, a hub that cannot be
reached (offline flag, refused connection) failing at once, and how files become documents (byte-order marks,
.csv cells, binaries)."""
import csv
import gzip
import re
import threading

import pytest

from hybrid.train.data import HubOfflineError, looks_like_hub_name, prepare_data, resolve_source, stdlib_files
from hybrid.train.data.tokenizer import ByteTokenizer


def test_stdlib_files_are_found_sorted_and_exclude_site_packages_and_tests():
    files = stdlib_files()
    assert len(files) > 100
    assert files == stdlib_files()
    names = {f.name for f in files}
    assert {"os.py", "json/__init__.py".split("/")[-1], "functools.py"} <= names
    parts = {p for f in files for p in f.parts}
    assert not parts & {"site-packages", "__pycache__", "test", "tests"}
    assert len(stdlib_files(include_tests=True)) > len(files)


def test_default_source_is_stdlib():
    src = resolve_source(None)
    assert src.kind == "stdlib" and src.key == resolve_source("stdlib").key


@pytest.mark.parametrize("path", ["./no/such/dir", "/no/such/file.txt", "~/nope-hybrid", "data/train.txt",
                                  "a/b/c"])
def test_missing_local_path_is_a_clear_error(path):
    with pytest.raises(FileNotFoundError, match="data path not found"):
        resolve_source(path)


def test_hub_name_heuristic():
    assert looks_like_hub_name("roneneldan/TinyStories") and looks_like_hub_name("wikitext")
    for s in ["./x", "/x", "~/x", "a/b/c", "corpus.txt", "x/y.jsonl", "", "shards.jsonl.gz", "x/y.csv.xz"]:
        assert not looks_like_hub_name(s), s


def _bounded(fn, seconds=60):
    """Run fn in a thread; fail instead of hanging."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"call did not return within {seconds} s"
    return out


def test_hub_dataset_offline_flag_raises_at_once(tmp_path):
    out = _bounded(lambda: prepare_data("someone/some-dataset", cache_dir=tmp_path))
    err = out.get("error")
    assert isinstance(err, HubOfflineError) and isinstance(err, RuntimeError)
    assert "offline" in str(err) and "HF_HUB_OFFLINE" in str(err) and "--data /path/to/texts" in str(err)


def test_unreachable_hub_raises_without_retrying(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused, whatever the network
    out = _bounded(lambda: prepare_data("no-such-user-hybrid/no-such-dataset", cache_dir=tmp_path))
    err = out.get("error")
    assert isinstance(err, HubOfflineError), err
    assert "127.0.0.1:9" in str(err) and "--data" in str(err)


def _as_read(raw: bytes) -> str:
    """A text file's document, computed here: a leading UTF-8 byte-order mark dropped, invalid bytes U+FFFD,
    CRLF / CR newlines as LF."""
    raw = raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw
    return raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def test_a_byte_order_mark_is_not_part_of_a_document(tmp_path, documents_of):
    """The issue: a file starting with EF BB BF was trained on with those 3 bytes as its first tokens. Only the
    leading mark goes; invalid UTF-8 is still replaced by U+FFFD; a compressed file is read the same way (it kept
    its mark, and invalid UTF-8 in it failed the whole preparation)."""
    root = tmp_path / "texts"
    root.mkdir()
    raws = {"a.py": b"\xef\xbb\xbfprint('hi')\r\n", "b.txt": b"plain file\n",
            "c.txt": b"\xef\xbb\xbfab\xffcd \xef\xbb\xbf kept inside\rend",
            "d.md": b"\xef\xbb\xbf\xef\xbb\xbftwo marks"}
    for name, raw in raws.items():
        (root / name).write_bytes(raw)
    packed = b"\xef\xbb\xbfcompressed \xff\r\n"  # datasets kept its mark, and failed on the invalid byte
    (root / "e.txt.gz").write_bytes(gzip.compress(packed))
    data = prepare_data(root, cache_dir=tmp_path / "c", valid_fraction=0.3)
    want = sorted(_as_read(raw) for raw in [*raws.values(), packed])
    assert documents_of(data) == want
    assert {"print('hi')\n", "compressed \ufffd\n", "ab\ufffdcd \ufeff kept inside\nend", "\ufefftwo marks"} < set(want)
    single = tmp_path / "one.txt"
    single.write_bytes(b"\xef\xbb\xbf" + "a single document of some length, é. ".encode() * 20)
    one = prepare_data(single, cache_dir=tmp_path / "c")
    tok = ByteTokenizer()
    assert tok.decode(one.train.tolist()) + tok.decode(one.valid.tolist()) == _as_read(single.read_bytes())
    assert one.stats["train_bytes"] + one.stats["valid_bytes"] == len(single.read_bytes()) - 3


@pytest.mark.parametrize("compress", [False, True])
def test_every_csv_cell_is_text(tmp_path, compress, documents_of):
    """The issue: pandas read the cells "None", "NA", "null", "nan", "N/A"… as missing values and dropped those
    documents (10 in the file, 2 prepared); "123" was a number, refused. An empty cell is an empty document, skipped;
    a byte-order mark before the header does not hide the column."""
    cells = ["None", "NA", "null", "nan", "N/A", "#N/A", "n/a", "NULL", "NaN", "-nan", "", "123", "1.5", "True",
             "multi\nline, \"quoted\"", "a real document"]
    path = tmp_path / "docs.csv"
    with open(path, "w", newline="", encoding="utf-8-sig") as f:
        writer = csv.writer(f)
        writer.writerow(["n", "text"])
        writer.writerows([i, cell] for i, cell in enumerate(cells))
    if compress:
        path = tmp_path / "docs.csv.gz"
        path.write_bytes(gzip.compress((tmp_path / "docs.csv").read_bytes()))
    data = prepare_data(path, cache_dir=tmp_path / "c", valid_fraction=0.2)
    with open(tmp_path / "docs.csv", newline="", encoding="utf-8-sig") as f:
        want = sorted(row["text"] for row in csv.DictReader(f) if row["text"])
    assert data.stats["documents"] == len(cells) - 1 == len(want)
    assert documents_of(data) == want


def test_a_csv_row_with_more_fields_than_its_header_is_refused(tmp_path):
    """pandas read a first row of one field too many as an index column, and trained on the wrong column ("1",
    "2", "3" for "hello there", "world wide", "foo bar"): the row is named instead."""
    path = tmp_path / "r.csv"
    path.write_text("text,id\nhello there,1\nworld wide,2,x\nfoo bar,3\n")
    with pytest.raises(ValueError, match=rf"^data: expected at most 2 fields a row in {path}, as its header has, got 3 "
                                         r"at line 3; quote a field that holds a comma$"):
        prepare_data(path, cache_dir=tmp_path / "c")


def test_binary_files_are_counted_where_they_are_skipped(corpus_dir, tmp_path):
    """The data line names a folder's binaries beside its empty files, and a folder of binaries only says why no
    text file was found."""
    root, texts = corpus_dir
    source = resolve_source(root)
    assert source.description == (f"files:{root} ({len(texts)} files; skipped 1 empty file (empty.txt); "
                                  f"1 binary file (blob.bin))")
    binaries = tmp_path / "binaries"
    binaries.mkdir()
    for name in ("a.bin", "b.png", "c.dat", "d.txt"):
        (binaries / name).write_bytes(b"head\0" + bytes(range(256)))
    with pytest.raises(ValueError, match=rf"^no text files found under {re.escape(str(binaries))} \(skipped 4 binary "
                                         rf"files \(a\.bin, b\.png, c\.dat, …\)\)$"):
        resolve_source(binaries)
