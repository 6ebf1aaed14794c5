"""Which files of a local corpus are read, and the rows of its table files that lack the text column.

Sharded corpora often hold empty shards, and a folder may hold things that are not files at all; both are
skipped and said (``Shards.skipped_text``, shown in the data line):

- only regular files are read (a symlink to one counts): a FIFO, a socket or a device inside a ``--data`` folder
  would block or stream forever when opened, so it is listed and never opened;
- an empty file is skipped: zero bytes, or (a JSON-lines table) nothing but white space. It holds no document,
  and ``datasets`` cannot load an empty table shard. A corpus that is all empty keeps the one-line
  "no non-empty documents" error;
- in a folder, a binary file (a NUL byte in its first 8 KiB, ``sources._set_aside_binaries``) is skipped and
  counted, so that a folder of binaries only is refused saying so.

A compressed file (``.gz``, ``.bz2``, ``.xz``; ``.zst`` / ``.lz4`` with the ``zstandard`` / ``lz4`` package) is read
as the format its name gives behind the compression suffix (``format_suffix``: ``d.jsonl.gz`` is JSON lines,
``notes.txt.gz`` text); ``datasets`` decompresses it when loading, ``open_data`` when these checks read it.

Table files (``.jsonl`` / ``.ndjson`` / ``.json``, ``.parquet``, ``.csv``) are checked for rows without the text
column (``missing_column_rows``), e.g. a ``.jsonl`` whose rows alternate ``{"text": …}`` and ``{"txt": …}``:
``datasets`` fills the missing column with null, so those rows would be dropped without a word. A file with any
is refused, naming the file, the first such row and the count, unless the user allows it
(``skip_rows_without_text``, ``--skip-rows-without-text``); the data line then says so. Every cell of a ``.csv``
is read as text (``table_options``): pandas would drop "NA", "null", "None", "nan" … as missing values.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Shards", "split_shards", "missing_column_rows", "check_missing_column", "skipped_rows_text",
           "load_each_table", "SKIP_FLAG", "format_suffix", "open_data", "check_compression", "table_options"]

SKIP_FLAG = "--skip-rows-without-text"
_JSON_LINES = {".jsonl", ".ndjson"}
# compression suffix: (fsspec's name for it, the package that reads it); `datasets` decompresses all of them
_COMPRESSED = {".gz": ("gzip", None), ".bz2": ("bz2", None), ".xz": ("xz", None), ".zst": ("zstd", "zstandard"),
               ".lz4": ("lz4", "lz4")}


def format_suffix(path: Path) -> str:
    """The suffix naming ``path``'s format, in lower case, behind a compression suffix (``D.JSONL.gz``: ``.jsonl``)."""
    path = Path(path)
    return (path.with_suffix("") if path.suffix.lower() in _COMPRESSED else path).suffix.lower()


def open_data(path: Path, mode: str = "r", **kwargs):
    """``open(path, mode, **kwargs)``, decompressing a file whose suffix names a compression."""
    compression = _COMPRESSED.get(Path(path).suffix.lower())
    if compression is None:
        return open(path, mode, **kwargs)
    import fsspec

    return fsspec.open(str(path), mode, compression=compression[0], **kwargs)


def check_compression(paths: list[Path]) -> None:
    """A one-line ValueError for the first file that cannot be read as its name says: a compression whose package
    is not installed, or a compressed parquet file (parquet compresses its own columns)."""
    from fsspec.compression import compr

    for path in paths:
        suffix = Path(path).suffix.lower()
        if suffix not in _COMPRESSED:
            continue
        name, package = _COMPRESSED[suffix]
        if name not in compr:
            raise ValueError(f"data: expected files this Python can decompress, got {path} (reading {suffix} needs "
                             f"the {package} package: pip install {package})")
        if format_suffix(path) == ".parquet":
            raise ValueError(f"data: expected an uncompressed .parquet file (parquet compresses its own columns), "
                             f"got {path}")


@dataclass
class Shards:
    files: list[Path]  # the files to read
    empty: list[Path] = field(default_factory=list)
    not_regular: list[tuple[Path, str]] = field(default_factory=list)  # (path, what it is: "FIFO", …)
    binary: list[Path] = field(default_factory=list)  # a folder's files with a NUL byte near their start

    def skipped_text(self) -> str:
        """"skipped 2 empty files (a.txt, b.txt); 1 binary file (logo.png); 1 entry that is not a regular file
        (fifo.jsonl: FIFO)", or "" when nothing was skipped."""
        parts = [_files_text(paths, what) for paths, what in ((self.empty, "empty"), (self.binary, "binary"))
                 if paths]
        if self.not_regular:
            kinds = ", ".join(f"{p.name}: {what}" for p, what in self.not_regular[:3])
            more = ", …" if len(self.not_regular) > 3 else ""
            n = len(self.not_regular)
            parts.append(f"{n} entr{'ies' if n != 1 else 'y'} that {'are' if n != 1 else 'is'} not a regular file "
                         f"({kinds}{more})")
        return ("skipped " + "; ".join(parts)) if parts else ""


def _files_text(paths: list[Path], what: str) -> str:
    """"2 empty files (a.txt, b.txt)": the count, and the first three names."""
    names = ", ".join(p.name for p in paths[:3]) + (", …" if len(paths) > 3 else "")
    return f"{len(paths)} {what} file{'s' if len(paths) != 1 else ''} ({names})"


def skipped_rows_text(count: int | None, column: str) -> str:
    """What the data line says with SKIP_FLAG: "3 table rows without 'text' skipped (--skip-rows-without-text)"."""
    n = "the" if count is None else str(count)
    return f"{n} table row{'' if count == 1 else 's'} without {column!r} skipped ({SKIP_FLAG})"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "not a regular file"


def _blank(path: Path, size: int) -> bool:
    """Zero bytes, or a JSON-lines file of white space only (read until its first other byte), decompressed."""
    if size == 0:
        return True
    lines, compressed = format_suffix(path) in _JSON_LINES, path.suffix.lower() in _COMPRESSED
    if not (lines or compressed):
        return False
    try:
        with open_data(path, "rb") as f:
            while chunk := f.read(1 << 16):
                if chunk.strip() or not lines:
                    return False
    except Exception:  # noqa: BLE001 - not what its name says (bad gzip, …): the loader names the fault
        return False
    return True


def split_shards(paths: list[Path]) -> Shards:
    """``paths`` sorted into the regular, non-empty files to read, the empty ones and the rest (never opened)."""
    shards = Shards(files=[])
    for p in paths:
        try:
            st = os.stat(p)  # follows a symlink: a link to a regular file is read
        except OSError as e:
            shards.not_regular.append((p, f"unreadable ({e.strerror})"))
            continue
        if not stat.S_ISREG(st.st_mode):
            shards.not_regular.append((p, _kind(st.st_mode)))
        elif _blank(p, st.st_size):
            shards.empty.append(p)
        else:
            shards.files.append(p)
    return shards


def missing_column_rows(path: Path, builder: str, column: str) -> tuple[int, str | None, int]:
    """(rows of the table file ``path`` without ``column``, where the first one is ("line 4" / "row 2" / None),
    rows in all). A row that is not a JSON object counts as one without it; a line that does not parse is left to
    the loader, which names it."""
    if builder == "json":
        with open_data(path, encoding="utf-8-sig", errors="replace") as f:
            head = f.read(4096).lstrip()[:1]
        if head == "[":  # one JSON array
            try:
                with open_data(path, encoding="utf-8-sig", errors="replace") as f:
                    rows = json.loads(f.read())
            except ValueError:
                return 0, None, 0
            rows = rows if isinstance(rows, list) else []
            missing = [i for i, row in enumerate(rows) if not (isinstance(row, dict) and column in row)]
            return len(missing), (f"row {missing[0] + 1}" if missing else None), len(rows)
        count, first, total = 0, None, 0
        with open_data(path, encoding="utf-8-sig", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                total += 1
                if not (isinstance(row, dict) and column in row):
                    count += 1
                    first = first or f"line {n}"
        return count, first, total
    if builder == "parquet":
        import pyarrow.parquet as pq

        try:
            meta = pq.read_metadata(path)
        except Exception as e:  # noqa: BLE001 - arrow's errors name no file: say which one
            raise ValueError(f"data: expected a parquet file, got {path} ({' '.join(str(e).split())})") from None
        rows = meta.num_rows
        if column in meta.schema.to_arrow_schema().names:
            return 0, None, rows
        return rows, ("row 1" if rows else None), rows
    if builder == "csv":
        import csv

        with open_data(path, encoding="utf-8-sig", errors="replace", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            has, rows = column in header, 0
            for row in reader:
                rows += 1
                if len(row) > len(header):  # pandas would read the first such row's extra field as an index
                    raise ValueError(f"data: expected at most {len(header)} fields a row in {path}, as its header "
                                     f"has, got {len(row)} at line {reader.line_num}; quote a field that holds a "
                                     f"comma")
        return (0, None, rows) if has else (rows, "line 2" if rows else None, rows)
    return 0, None, 0


def check_missing_column(paths: list[str], builder: str, column: str, *, skip: bool) -> int:
    """The rows of ``paths`` without ``column``, in all; a ValueError naming the first file that has any, its first
    such row and the count, unless ``skip``. When no row of any file has the column, 0 is returned: the loader's
    own message lists the columns there are."""
    found = [(path, *missing_column_rows(Path(path), builder, column)) for path in paths]
    missing, total = sum(f[1] for f in found), sum(f[3] for f in found)
    if missing == total:
        return 0
    for path, count, first, _ in found:
        if count and not skip:
            rows = f"{count} row{'s' if count != 1 else ''}"
            raise ValueError(f"data: expected a {column!r} field in every row, got {rows} without it in {path} (the "
                             f"first at {first}); name the column with --text-column, or pass {SKIP_FLAG} to train on "
                             f"the rows that have it")
    return missing


def table_options(builder: str, column: str) -> dict:
    """What ``datasets.load_dataset(builder, …)`` is given beside the files: for ``csv``, every cell of ``column`` as
    the text it is (pandas' defaults read "NA", "null", "None", "nan", "N/A" … as missing values, which would drop
    those documents, and "123" as a number); an empty cell is an empty string, skipped as an empty document."""
    if builder != "csv":
        return {}
    return {"keep_default_na": False, "na_filter": False, "converters": {column: str}}


def load_each_table(builder: str, paths: list[str], column: str, cache_dir: str):
    """The table files one by one, each cut to ``column`` (null where a row lacks it), concatenated: files whose
    columns differ cannot be loaded as one table (``datasets`` casts every file to the first one's columns)."""
    import datasets

    parts = []
    for path in paths:
        ds = datasets.load_dataset(builder, data_files=[path], split="train", cache_dir=cache_dir,
                                   **table_options(builder, column))
        if column in ds.column_names:
            parts.append(ds.select_columns([column]))
    if not parts:
        return datasets.Dataset.from_dict({column: []}, features=datasets.Features({column: datasets.Value("string")}))
    return datasets.concatenate_datasets(parts)
