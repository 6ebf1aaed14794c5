"""Where documents come from: the standard library (default), local files, or a hub dataset.

`resolve_source(data)` decides what `data` names and returns a `Source`: a cache key computed without
reading the data, and a `load()` that returns a `datasets.Dataset` with one `text` column, one row per
document. Plain text files are one document each (read as UTF-8 without a leading byte-order mark, invalid bytes
replaced by U+FFFD, newlines normalised to `\\n`). Table files give one document per row of `text_column`:
`.jsonl`/`.ndjson`/`.parquet` anywhere, and `.json`/`.csv` when named directly (inside a directory they are ordinary
text documents, as source trees are full of `.json` configs and `.csv` fixtures). Every cell of a `.csv` text column
is text, "NA", "null" or "123" included (pandas would read those as missing values and numbers); an empty cell is an
empty document. A compressed file (`d.jsonl.gz`, `notes.txt.xz`) is read as the format its name gives behind the
compression suffix (`shards.format_suffix`), in a directory too.

`load(cache_dir)` gives `datasets` a builder cache of its own per source key (`<cache_dir>/<key[:16]>`):
`datasets` keys a local file on its path and mtime only, so a file edited with its mtime kept (`cp -p`,
`rsync -a`, tar) would be served from its cache as the old text although the key (path, size, mtime) changed.

Hub datasets are streamed (`load_dataset(name, split=..., streaming=True)`) and the first `max_documents`
rows are kept. Offline, `HubOfflineError` is raised at once: `HF_HUB_OFFLINE`/`HF_DATASETS_OFFLINE` are
checked first, then one TCP connection to the hub endpoint with a short timeout, so nothing sits in the
hub client's retry loop.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
import sysconfig
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from .shards import (
    Shards, check_compression, check_missing_column, format_suffix, load_each_table, open_data, split_shards,
    table_options,
)

__all__ = [
    "Source",
    "HubOfflineError",
    "resolve_source",
    "stdlib_files",
    "looks_like_hub_name",
    "hub_offline_reason",
    "OFFLINE_FLAGS",
    "DEFAULT_HUB_DOCUMENTS",
]

DEFAULT_HUB_DOCUMENTS = 50_000
_TABLE_BUILDERS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_DIR_TABLES = {".jsonl", ".ndjson", ".parquet"}  # table suffixes inside a directory
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "dist-packages"}
_TEST_DIRS = {"test", "tests", "idle_test"}
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")
# How files become documents, in every files key: a change re-reads every corpus instead of serving its old tokens
# (2: a leading UTF-8 byte-order mark dropped, every .csv cell text)
_READER = "reader-2"
_FILE_SUFFIX = re.compile(r"\.(txt|md|rst|py|jsonl?|ndjson|parquet|csv|tsv|html?|xml|c|h|cpp|js|ts|rs|go)"
                          r"(\.(gz|bz2|xz|zst|lz4))?$", re.I)


class HubOfflineError(RuntimeError):
    """A hub dataset was asked for but the hub cannot be reached from this machine."""


@dataclass(frozen=True)
class Source:
    kind: str  # "stdlib" | "files" | "hub"
    description: str
    key: str  # changes whenever the documents may have changed
    load: Callable[[str], "object"]  # load(cache_dir) -> datasets.Dataset with a "text" column
    notes: dict = field(default_factory=dict, compare=False)  # what load() found: {"rows_without_text": n}


# ----------------------------------------------------------------------------------------------- stdlib


def stdlib_files(include_tests: bool = False) -> list[Path]:
    """The running interpreter's standard-library `.py` files, sorted by relative path.

    `site-packages`/`dist-packages` and `__pycache__` are skipped; test packages (`test`, `tests`,
    `idle_test`) too unless `include_tests`.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = _SKIP_DIRS | (set() if include_tests else _TEST_DIRS)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.startswith(".")]
        out += [Path(dirpath, f) for f in filenames if f.endswith(".py")]
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


# ------------------------------------------------------------------------------------------ local files


def _is_text_file(path: Path) -> bool:
    """No NUL byte in the first 8 KiB (decompressed: a `notes.txt.gz` is text)."""
    try:
        with open_data(path, "rb") as f:
            return b"\0" not in f.read(8192)
    except Exception:  # noqa: BLE001 - a corrupt compressed file is not text
        return False


def _set_aside_binaries(shards: Shards, tables: set[str]) -> None:
    """Move the binary files of a folder (not a table by name, a NUL byte in the first 8 KiB) from `shards.files` to
    `shards.binary`, so that the data line, or the "no text files" error, counts them."""
    text = [p for p in shards.files if format_suffix(p) in tables or _is_text_file(p)]
    kept = set(text)
    shards.binary = [p for p in shards.files if p not in kept]
    shards.files = text


def _list_files(root: Path) -> list[Path]:
    if not root.is_dir():  # a file, or something that is not one (split_shards says what)
        return [root]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
        out += [Path(dirpath, f) for f in filenames if not f.startswith(".")]
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def _files_key(files: list[Path], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for p in files:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _load_files(files: list[Path], text_column: str, cache_dir: str, tables: set[str], skip_missing: bool = False,
                notes: dict | None = None):
    """One `text` column: plain files one document each, files with a suffix in `tables` one per row. A table row
    without `text_column` is refused (``shards.check_missing_column``) unless `skip_missing`; `notes` gets how
    many there were."""
    import datasets

    if skip_missing and notes is not None:
        notes["rows_without_text"] = 0
    groups: dict[str, list[str]] = {}
    for p in files:
        suffix = format_suffix(p)
        builder = _TABLE_BUILDERS[suffix] if suffix in tables else "text"
        if builder == "text" and suffix != p.suffix.lower():
            builder = "text, compressed"
        groups.setdefault(builder, []).append(str(p))
    parts = []
    for builder, paths in sorted(groups.items()):
        if builder == "text":
            ds = datasets.load_dataset(
                "text", data_files=paths, split="train", sample_by="document",
                encoding="utf-8-sig", encoding_errors="replace", cache_dir=cache_dir,
            )
        elif builder == "text, compressed":
            ds = _load_compressed_texts(paths, cache_dir)
        else:
            missing = check_missing_column(paths, builder, text_column, skip=skip_missing)
            if notes is not None:
                notes["rows_without_text"] = notes.get("rows_without_text", 0) + missing
            verbosity = datasets.logging.get_verbosity()
            datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a malformed row is reported below, once
            try:
                if missing:  # the files' columns differ: each file alone, its text column only
                    ds = load_each_table(builder, paths, text_column, cache_dir)
                else:
                    ds = datasets.load_dataset(builder, data_files=paths, split="train", cache_dir=cache_dir,
                                               **table_options(builder, text_column))
            except datasets.exceptions.DatasetGenerationError as e:  # a malformed row: say which file and why
                cause = e.__cause__ if e.__cause__ is not None else e
                bad = _first_bad_row(paths, builder, text_column)
                what = f"{bad[0]}: {bad[1]}" if bad else f"{', '.join(paths[:3])} ({type(cause).__name__}: {cause})"
                raise ValueError(f"data: expected {builder} files with a {text_column!r} column, got unreadable "
                                 f"{what}") from None
            finally:
                datasets.logging.set_verbosity(verbosity)
            if text_column not in ds.column_names:
                raise ValueError(
                    f"data: expected a column {text_column!r} in {', '.join(paths[:3])}, got the columns "
                    f"{ds.column_names}; pass --text-column (text_column=) naming the column that holds the text"
                )
            ds = ds.select_columns([text_column])
            feature = ds.features[text_column]
            if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
                bad = _first_bad_row(paths, builder, text_column)
                if bad is not None:
                    raise ValueError(f"data: expected a string (or null) in column {text_column!r} of every row, "
                                     f"got {bad[1]} at {bad[0]}")
                ds = ds.cast_column(text_column, datasets.Value("string"))  # every value null: no documents
            if text_column != "text":
                ds = ds.rename_column(text_column, "text")
        parts.append(ds)
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _load_compressed_texts(paths: list[str], cache_dir: str):
    """Compressed text files, one document each, decoded as plain ones are (`datasets`' text builder opens a
    compressed file with the default encoding, strictly: it kept a byte-order mark and failed on invalid UTF-8)."""
    import datasets

    return datasets.Dataset.from_generator(_read_texts, gen_kwargs={"paths": paths}, cache_dir=cache_dir,
                                           features=datasets.Features({"text": datasets.Value("string")}))


def _read_texts(paths: list[str]):
    """{"text": …} per file: UTF-8 without a leading byte-order mark, invalid bytes U+FFFD, newlines as `\\n`."""
    for path in paths:
        with open_data(path, encoding="utf-8-sig", errors="replace") as f:
            yield {"text": f.read()}


def _shown(value) -> str:
    text = repr(value)
    return f"{text[:60]}… ({type(value).__name__})" if len(text) > 60 else f"{text} ({type(value).__name__})"


def _first_bad_row(paths: list[str], builder: str, column: str) -> tuple[str, str] | None:
    """(where, what) of the first row of ``paths`` that is not valid, or whose ``column`` is neither a string
    nor null: ``("f.jsonl line 3, column 'text'", "123 (int)")``; None when every row is fine."""
    import json

    for path in paths:
        if builder == "json":
            with open_data(path, encoding="utf-8-sig", errors="replace") as f:
                head = f.read(4096).lstrip()[:1]
            if head == "[":  # one JSON array, not JSON lines
                try:
                    with open_data(path, encoding="utf-8-sig") as f:
                        rows = json.loads(f.read())
                except ValueError as e:
                    return f"{path} ({e})", "not JSON"
                lines = ((f"row {i + 1}", row) for i, row in enumerate(rows))
            else:
                def json_lines(path=path):
                    with open_data(path, encoding="utf-8-sig", errors="replace") as f:
                        for n, line in enumerate(f, 1):
                            if line.strip():
                                try:
                                    yield f"line {n}", json.loads(line)
                                except ValueError as e:
                                    yield f"line {n}", _NotJSON(str(e))
                lines = json_lines()
        elif builder == "csv":
            import csv

            def csv_rows(path=path):
                with open_data(path, encoding="utf-8-sig", errors="replace", newline="") as f:
                    reader = csv.DictReader(f)
                    for row in reader:  # every cell text, as the loader reads it (shards.table_options)
                        yield f"line {reader.line_num}", {column: row.get(column)}
            lines = csv_rows()
        elif builder == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            if column not in table.column_names:
                continue
            lines = ((f"row {i + 1}", {column: v}) for i, v in enumerate(table.column(column).to_pylist()))
        else:
            return None
        for where, row in lines:
            if isinstance(row, _NotJSON):
                return f"{path} {where}", f"a line that is not JSON: {row}"
            if not isinstance(row, dict):
                return f"{path} {where}", f"{_shown(row)} instead of an object with a {column!r} field"
            value = row.get(column)
            if value is not None and not isinstance(value, str):
                return f"{path} {where}, column {column!r}", _shown(value)
    return None


class _NotJSON(str):
    """A line that json.loads refused (its message)."""


def _files_source(kind: str, description: str, files: list[Path], text_column: str, tables: set[str],
                  skip_missing: bool = False) -> Source:
    notes: dict = {}
    extra = f"{kind}|{text_column}|{sorted(tables)}" + ("|skip-missing" if skip_missing else "") + f"|{_READER}"
    if any(format_suffix(p) != p.suffix.lower() for p in files):  # read as text before compressed tables were read
        extra += "|decompressed"
    key = _files_key(files, extra)
    return Source(
        kind=kind,
        description=description,
        key=key,
        load=lambda cache_dir: _load_files(files, text_column, _keyed_cache(cache_dir, key), tables, skip_missing,
                                           notes),
        notes=notes,
    )


def _keyed_cache(cache_dir: str, key: str) -> str:
    """`datasets`' builder cache for the files `key` describes: a new key (a file's size or mtime changed) never
    reads an older version's cache, which `datasets` would serve when only the size changed. An old key's folder is
    not reused and stays until the cache is cleared (as before: `datasets` made a new one for each mtime change
    too); deleting `<cache>/datasets` is always safe, the token cache does not read it."""
    return str(Path(cache_dir) / key[:16])


# ------------------------------------------------------------------------------------------------- hub


def looks_like_hub_name(name: str) -> bool:
    """`owner/name` or `name`: no leading `.`, `/` or `~`, at most one `/`, no data-file suffix."""
    return bool(_HUB_NAME.match(name)) and not _FILE_SUFFIX.search(name)


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


# The environment variables that switch the hub clients off, per kind of download (huggingface_hub also
# honours TRANSFORMERS_OFFLINE; the datasets library, HF_DATASETS_OFFLINE).
OFFLINE_FLAGS = {"dataset": ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"),
                 "model": ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}


def hub_offline_reason(timeout: float = 3.0, *, what: str = "dataset") -> str | None:
    """Why the hub cannot serve a `what` ("dataset" or "model"): an offline flag of `OFFLINE_FLAGS[what]`
    set, or no TCP connection to the endpoint within `timeout` s. None when it can be reached."""
    if what not in OFFLINE_FLAGS:
        raise ValueError(f"what: expected one of {tuple(OFFLINE_FLAGS)}, got {what!r}")
    for var in OFFLINE_FLAGS[what]:
        if _truthy(os.environ.get(var)):
            return f"{var}={os.environ[var]} is set"
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    result: list[str | None] = ["no answer within %.0f s" % timeout]

    def probe():  # in a thread: name resolution has no timeout of its own
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result[0] = None
        except OSError as e:
            result[0] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return None if result[0] is None else f"cannot connect to {host}:{port} ({result[0]})"


def _offline_error(name: str, reason: str) -> HubOfflineError:
    return HubOfflineError(
        f"could not reach the Hugging Face Hub for dataset {name!r}: this machine is offline ({reason}). "
        f"Train on local data instead, e.g. --data /path/to/texts (a text file, a .jsonl/.parquet file with a "
        f"'text' column, or a directory of text files), or leave --data out to use the default corpus "
        f"(this Python's standard-library sources)."
    )


def _load_hub(name: str, *, split: str, config: str | None, text_column: str, max_documents: int):
    reason = hub_offline_reason()
    if reason is not None:
        raise _offline_error(name, reason)
    import datasets

    try:
        stream = datasets.load_dataset(name, config, split=split, streaming=True)
        texts = []
        for row in stream:
            if text_column not in row:
                raise ValueError(
                    f"hub dataset {name!r} has no column {text_column!r} (columns: {sorted(row)}); "
                    f"pass text_column= (--text-column)"
                )
            texts.append(row[text_column])
            if len(texts) >= max_documents:
                break
    except ConnectionError as e:  # the hub went away between the probe and the download
        raise _offline_error(name, f"{type(e).__name__}: {e}") from e
    return datasets.Dataset.from_dict({"text": texts})


def _hub_source(name, *, split, config, text_column, max_documents) -> Source:
    n = DEFAULT_HUB_DOCUMENTS if max_documents is None else max_documents
    desc = f"hub:{name}" + (f"/{config}" if config else "") + f"[{split}][:{n}]"
    return Source(
        kind="hub",
        description=desc,
        key=hashlib.sha256(f"hub|{desc}|{text_column}".encode()).hexdigest(),
        load=lambda cache_dir: _load_hub(
            name, split=split, config=config, text_column=text_column, max_documents=n
        ),
    )


# ---------------------------------------------------------------------------------------------- resolve


def resolve_source(
    data: str | os.PathLike | None = None,
    *,
    text_column: str = "text",
    split: str = "train",
    hub_config: str | None = None,
    max_documents: int | None = None,
    include_tests: bool = False,
    skip_rows_without_text: bool = False,
) -> Source:
    """What `data` names: `None`/`"stdlib"` → the standard library; an existing path → local files;
    otherwise a hub dataset name. A missing path that cannot be a hub name raises `FileNotFoundError`.
    Local files: only regular, non-empty ones are read (``shards.split_shards``; the description says what was
    skipped); `skip_rows_without_text` trains on the table rows that have `text_column` instead of refusing a file
    with rows that lack it."""
    if data is None or str(data) == "stdlib":
        files = stdlib_files(include_tests)
        root = sysconfig.get_paths()["stdlib"]
        return _files_source("stdlib", f"stdlib:{root} ({len(files)} .py files)", files, "text", set())
    path = Path(data).expanduser()
    if path.exists():
        path = path.resolve()
        shards = split_shards(_list_files(path))  # regular, non-empty files only: a FIFO is never opened
        tables = _DIR_TABLES if path.is_dir() else set(_TABLE_BUILDERS)
        check_compression(shards.files)
        if path.is_dir():
            _set_aside_binaries(shards, tables)
        files, skipped = shards.files, shards.skipped_text()
        if not files and shards.empty:
            raise ValueError(f"no non-empty documents in files:{path} ({skipped})")
        if not files and shards.not_regular and not path.is_dir():
            raise ValueError(f"data: expected a regular file or a directory, got {path} "
                             f"({shards.not_regular[0][1]})")
        if not files:
            raise ValueError(f"no text files found under {path}" + (f" ({skipped})" if skipped else ""))
        described = f"{len(files)} file{'s' if len(files) != 1 else ''}" + (f"; {skipped}" if skipped else "")
        return _files_source("files", f"files:{path} ({described})", files, text_column, tables,
                             skip_rows_without_text)
    name = str(data)
    if not looks_like_hub_name(name):
        raise FileNotFoundError(
            f"data path not found: {name} (it does not exist, and it is not a hub dataset name like "
            f"'owner/name'); pass an existing file or directory, e.g. --data /path/to/texts"
        )
    return _hub_source(name, split=split, config=hub_config, text_column=text_column, max_documents=max_documents)
