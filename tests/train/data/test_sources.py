"""hybrid.train.data.sources: the standard library's files, local paths, hub names, and a hub that cannot be
reached (offline flag, refused connection) failing at once."""
import threading

import pytest

from hybrid.train.data import HubOfflineError, looks_like_hub_name, prepare_data, resolve_source, stdlib_files


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
