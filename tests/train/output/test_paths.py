"""The output-path rule (hybrid.train.output.paths.check_apart), issue 47: an output may not be, hold or lie inside
an input, symlinks resolved; the message names the input as the command line does. Every command's use of it:
tests/train/cli/test_output_rule.py."""
import pytest

from hybrid.train.output.paths import check_apart, check_not_a_file


def test_check_apart_resolves_symlinks_and_names_the_input(tmp_path):
    data = tmp_path / "texts"
    data.mkdir()
    link = tmp_path / "alias"
    link.symlink_to(data, target_is_directory=True)
    with pytest.raises(ValueError, match=r"^--out: expected a path apart from the input --data .*texts .*got "
                                         r".*alias/run, which lies inside it$"):
        check_apart("--out", link / "run", [("--data", data)])
    check_apart("--out", tmp_path / "texts-run", [("--data", data), ("--tokenizer", None)])  # a sibling is fine
    check_apart("--out", tmp_path / "run", [])


def test_check_not_a_file_names_the_file_on_the_way(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    for path in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "run" / "deeper"):
        with pytest.raises(ValueError, match=r"^--out: expected a directory, got the file .*notes\.txt"):
            check_not_a_file("--out", path)
    check_not_a_file("--out", tmp_path / "new" / "run")  # not there yet: fine
