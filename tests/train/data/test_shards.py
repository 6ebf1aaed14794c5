"""Data that crashed or hung (hybrid.train.data.shards): empty shards are skipped and said, a corpus of empty
shards is the one-line "no non-empty documents" error, rows without the text column are refused (or skipped with
--skip-rows-without-text, which the data line then reports), and only regular files are read (a FIFO never hangs a
command). The rules hold for every command that reads --data: hybrid-train, hybrid-distill, hybrid-bench and
hybrid-rope-analyze."""
import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.bench import harness
from hybrid.train.cli.bench import bench_main
from hybrid.train.loop.checkpoint import capture_rng_state, save_checkpoint
from hybrid.train.cli.lm import train_main
from hybrid.train.data import prepare_data
from hybrid.train.cli.distill import main as distill_main
from hybrid.train.cli.rope_analyze import analyze_main
from hybrid.train.data.tokenizer import ByteTokenizer


@contextmanager
def no_hang(seconds: int = 60):
    """Fail instead of hanging (a FIFO opened for reading blocks until a writer comes)."""
    def fail(*_):
        raise TimeoutError(f"hung for {seconds} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def rows(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


def texts(n: int, start: int = 0) -> list[dict]:
    return [{"text": f"row {i}: " + "words and more words " * 8} for i in range(start, start + n)]


@pytest.fixture
def shards(tmp_path):
    """A sharded corpus: two real shards, an empty one, one of blank lines, an empty parquet and a FIFO."""
    root = tmp_path / "shards"
    root.mkdir()
    rows(root / "part-0.jsonl", texts(20))
    rows(root / "part-2.jsonl", texts(20, 20))
    (root / "part-1.jsonl").write_text("")
    (root / "part-3.jsonl").write_text("\n\n  \n")
    (root / "part-4.parquet").write_bytes(b"")
    os.mkfifo(root / "part-5.jsonl")
    return root


def test_empty_shards_and_a_fifo_are_skipped_and_said(shards):
    with no_hang():
        data = prepare_data(shards)
    s = data.stats
    assert s["documents"] == 40
    assert s["source"] == (f"files:{shards} (2 files; skipped 3 empty files (part-1.jsonl, part-3.jsonl, "
                           f"part-4.parquet); 1 entry that is not a regular file (part-5.jsonl: FIFO))")


def test_a_corpus_of_empty_shards_is_the_no_documents_error(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    (root / "a.jsonl").write_text("")
    (root / "b.jsonl").write_text("\n")
    for data in (root, root / "a.jsonl"):
        with pytest.raises(ValueError, match=r"^no non-empty documents in files:.*\(skipped \d empty files? \("):
            prepare_data(data)
    (root / "c.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^no non-empty documents in files:.*c\.parquet \(skipped 1 empty file "
                                         r"\(c\.parquet\)\)"):
        prepare_data(root / "c.parquet")  # the issue's `Parquet file size is 0 bytes`, now naming the file


def test_a_fifo_as_data_or_alone_in_a_folder_is_one_error(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    with no_hang():
        with pytest.raises(ValueError, match=r"^data: expected a regular file or a directory, got .*pipe\.jsonl "
                                             r"\(FIFO\)$"):
            prepare_data(tmp_path / "pipe.jsonl")
        with pytest.raises(ValueError, match=r"^no text files found under .* \(skipped 1 entry that is not a regular "
                                             r"file \(pipe\.jsonl: FIFO\)\)$"):
            prepare_data(tmp_path)


def test_a_broken_parquet_is_named(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"^data: expected a parquet file, got .*bad\.parquet \("):
        prepare_data(tmp_path / "bad.parquet")


def mixed(root: Path) -> Path:
    """The issue's `.jsonl` whose rows alternate {"text": …} and {"txt": …}, beside a shard of "text" only."""
    root.mkdir()
    alternate = [{"text": r["text"]} if i % 2 == 0 else {"txt": r["text"]} for i, r in enumerate(texts(10))]
    rows(root / "mixed.jsonl", alternate)
    rows(root / "good.jsonl", texts(10, 100))
    return root


def test_rows_without_the_text_column_are_refused_naming_file_line_and_count(tmp_path):
    root = mixed(tmp_path / "mixed")
    with pytest.raises(ValueError, match=r"^data: expected a 'text' field in every row, got 5 rows without it in "
                                         r".*mixed\.jsonl \(the first at line 2\); .*--skip-rows-without-text"):
        prepare_data(root)


def test_rows_without_the_text_column_with_the_flag_are_skipped_and_reported(tmp_path):
    root = mixed(tmp_path / "mixed")
    for cached in (False, True):  # the count is reported from the cache too
        data = prepare_data(root, skip_rows_without_text=True)
        assert data.stats["cache_hit"] == cached and data.stats["documents"] == 15
        assert data.stats["source"].endswith(", 5 table rows without 'text' skipped (--skip-rows-without-text)")


def test_shards_of_another_schema_are_refused_or_skipped(tmp_path):
    """A shard whose rows all lack the column, beside shards that have it (the files' columns differ)."""
    root = tmp_path / "schemas"
    root.mkdir()
    rows(root / "a.jsonl", texts(6))
    rows(root / "b.jsonl", [{"body": "no text here"}] * 3)
    with pytest.raises(ValueError, match=r"got 3 rows without it in .*b\.jsonl \(the first at line 1\)"):
        prepare_data(root)
    data = prepare_data(root, skip_rows_without_text=True)
    assert data.stats["documents"] == 6 and "3 table rows without 'text' skipped" in data.stats["source"]
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq_root = tmp_path / "parquet"
    pq_root.mkdir()
    pq.write_table(pa.table({"text": ["a document " * 5] * 4}), pq_root / "a.parquet")
    pq.write_table(pa.table({"content": ["elsewhere"] * 2}), pq_root / "b.parquet")
    with pytest.raises(ValueError, match=r"got 2 rows without it in .*b\.parquet \(the first at row 1\)"):
        prepare_data(pq_root)
    assert prepare_data(pq_root, skip_rows_without_text=True).stats["documents"] == 4


def test_a_file_with_no_text_column_at_all_keeps_its_message(tmp_path):
    rows(tmp_path / "rows.jsonl", [{"body": "x", "n": 1}] * 3)
    with pytest.raises(ValueError, match=r"^data: expected a column 'text' in .*rows\.jsonl, got the columns"):
        prepare_data(tmp_path / "rows.jsonl")


# ------------------------------------------------------------------------------------------- compressed files

COMPRESSORS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}


def compressed(path: Path, suffix: str) -> Path:
    """``path`` compressed beside itself as ``path + suffix`` (the original removed)."""
    import importlib

    out = path.with_name(path.name + suffix)
    out.write_bytes(importlib.import_module(COMPRESSORS[suffix]).compress(path.read_bytes()))
    path.unlink()
    return out


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
def test_a_compressed_table_is_read_as_its_table_not_as_text(tmp_path, suffix, documents_of):
    """The issue: `d.jsonl.gz` was trained on as raw JSON text (`{"text": ...`), as were `.json.gz` and `.csv.gz`."""
    want = sorted(r["text"] for r in texts(6))
    jsonl = compressed(rows(tmp_path / "d.jsonl", texts(6)), suffix)
    array = tmp_path / "a.json"
    array.write_text(json.dumps(texts(6)))
    table = tmp_path / "t.csv"
    table.write_text("n,text\n" + "".join(f'{i},"{r["text"]}"\n' for i, r in enumerate(texts(6))))
    for path in (jsonl, compressed(array, suffix), compressed(table, suffix)):
        assert documents_of(prepare_data(path, cache_dir=tmp_path / "c", valid_fraction=0.2)) == want, path.name
    notes = tmp_path / "notes.txt"
    notes.write_text('{"text": "a text file stays one document"}')
    data = prepare_data(compressed(notes, suffix), cache_dir=tmp_path / "c")
    tok = ByteTokenizer()
    assert tok.decode(data.train[1:].tolist()) + tok.decode(data.valid[1:].tolist()) == \
        '{"text": "a text file stays one document"}'


def test_a_folder_reads_compressed_files_as_their_uncompressed_names(tmp_path, documents_of):
    """`.jsonl.gz` shards are tables there too, a `.txt.gz` a text document (it was left out as binary), and `.csv`
    / `.json` (compressed or not) stay text documents, as the docs say of folders; a blank compressed shard is
    skipped."""
    root = tmp_path / "corpus"
    root.mkdir()
    compressed(rows(root / "part-0.jsonl", texts(4)), ".gz")
    compressed(rows(root / "part-1.jsonl", texts(2, 10)), ".xz")
    compressed(rows(root / "part-2.jsonl", []), ".gz")  # an empty shard
    (root / "notes.txt").write_text("plain notes")
    compressed(root / "notes.txt", ".bz2")
    (root / "fixture.csv").write_text("a,b\n1,2\n")
    (root / "package.json").write_text('{"name": "x"}')
    compressed(root / "package.json", ".gz")
    data = prepare_data(root, cache_dir=tmp_path / "c")
    assert documents_of(data) == sorted([r["text"] for r in texts(4) + texts(2, 10)]
                                     + ["plain notes", "a,b\n1,2\n", '{"name": "x"}'])
    assert f"files:{root} (5 files; skipped 1 empty file (part-2.jsonl.gz))" in data.stats["source"]


def test_compressed_rows_are_checked_like_plain_ones(tmp_path):
    alternate = [{"text": "kept"}, {"txt": "no text"}, {"text": 7}]
    path = compressed(rows(tmp_path / "mixed.jsonl", alternate), ".gz")
    with pytest.raises(ValueError, match=r"got 1 row without it in .*mixed\.jsonl\.gz \(the first at line 2\)"):
        prepare_data(path, cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match=r"^data: expected a string \(or null\) .*, got 7 \(int\) at .*mixed\.jsonl"
                                         r"\.gz line 3, column 'text'$"):
        prepare_data(path, cache_dir=tmp_path / "c", skip_rows_without_text=True)


def test_a_compressed_parquet_or_an_unreadable_compression_is_one_error(tmp_path, monkeypatch):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": ["a document"] * 3}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"^data: expected an uncompressed \.parquet file \(parquet compresses its "
                                         r"own columns\), got .*t\.parquet\.gz$"):
        prepare_data(compressed(tmp_path / "t.parquet", ".gz"), cache_dir=tmp_path / "c")
    from fsspec.compression import compr

    monkeypatch.delitem(compr, "zstd", raising=False)  # as without the zstandard package
    (tmp_path / "d.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd not really")
    with pytest.raises(ValueError, match=r"^data: expected files this Python can decompress, got .*d\.jsonl\.zst "
                                         r"\(reading \.zst needs the zstandard package: pip install zstandard\)$"):
        prepare_data(tmp_path / "d.jsonl.zst", cache_dir=tmp_path / "c")


# ---------------------------------------------------------------------------------------- every data reader


@pytest.fixture
def teacher(tmp_path):
    config = HybridConfig.preset("transformer", d_model=16, n_layers=2, n_heads=2, vocab_size=320)
    path = tmp_path / "teacher"
    save_checkpoint(path, model_state=HybridLM(config).state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0,
                    extra={"tokenizer": ByteTokenizer().to_dict()})
    return path


TINY = ["--preset", "transformer", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--seq-len", "16",
        "--batch-size", "2", "--steps", "1", "--eval-batches", "1", "--device", "cpu", "--quiet"]


def readers(teacher: Path, out: Path):
    """(program, main, argv(data)) of every command that reads --data, each stopping early or small."""
    return [
        ("hybrid-train", train_main, lambda d: ["--data", str(d), *TINY, "--out", str(out / "train")]),
        ("hybrid-distill", distill_main, lambda d: ["--teacher", str(teacher), "--pattern", "RA", "--data", str(d),
                                                    "--seq-len", "16", "--batch-size", "2", "--align-steps", "1",
                                                    "--steps", "1", "--eval-batches", "1", "--select-batches", "1",
                                                    "--device", "cpu", "--quiet", "--out", str(out / "distill")]),
        ("hybrid-bench", bench_main, lambda d: ["--suite", "baselines", "--data", str(d), "--out",
                                                str(out / "bench")]),
        ("hybrid-rope-analyze", analyze_main, lambda d: [str(teacher), "--data", str(d), "--tokens", "32",
                                                         "--seq-len", "16", "--p-max", "16", "--no-figures",
                                                         "--quiet", "--out", str(out / "rope")]),
    ]


def test_every_data_reader_gives_the_one_line_errors(teacher, tmp_path, capsys, one_line_error, one_torch_thread):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.jsonl").write_text("")
    fifo_only = tmp_path / "fifo"
    fifo_only.mkdir()
    os.mkfifo(fifo_only / "pipe.jsonl")
    mixed_root = mixed(tmp_path / "mixed")
    for prog, main, argv in readers(teacher, tmp_path / "out"):
        for data, needles in [(empty, ["no non-empty documents in files:", "skipped 1 empty file (a.jsonl)"]),
                              (fifo_only, ["no text files found under", "pipe.jsonl: FIFO"]),
                              (mixed_root, ["data: expected a 'text' field in every row, got 5 rows without it in",
                                            "mixed.jsonl (the first at line 2)"])]:
            with no_hang():
                assert main(argv(data)) == 2, (prog, data)
            one_line_error(capsys, prog, *needles)


def test_every_data_reader_says_what_it_skipped(teacher, shards, tmp_path, capsys, monkeypatch, one_torch_thread):
    """The data line of each command names the skipped shards and the FIFO, and the flag with its count."""
    rows(shards / "part-6.jsonl", [{"txt": "a row of another schema"}, *texts(4, 50)])
    monkeypatch.setattr(harness, "run_suite", lambda *a, **k: [])  # hybrid-bench: its data line, then no training
    import hybrid.train.bench.report as report

    monkeypatch.setattr(report, "write_bench_report", lambda *a, **k: "report.md")
    for prog, main, argv in readers(teacher, tmp_path / "out"):
        with no_hang(120):
            code = main([a for a in argv(shards) if a != "--quiet"] + ["--skip-rows-without-text"])
        out = capsys.readouterr()
        assert code == 0, (prog, out.err[-2000:])
        line = next(ln for ln in out.out.splitlines() if ln.startswith("data: "))
        assert "skipped 3 empty files (part-1.jsonl, part-3.jsonl, part-4.parquet)" in line, (prog, line)
        assert "part-5.jsonl: FIFO" in line and "1 table row without 'text' skipped (--skip-rows-without-text)" in line
