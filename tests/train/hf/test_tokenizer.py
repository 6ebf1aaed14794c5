"""hybrid.train.hf.tokenizer: the byte tokenizer as a transformers tokenizer keeps every id."""
import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from hybrid.train.hf.tokenizer import to_hf_tokenizer  # noqa: E402
from hybrid.train.data.tokenizer import ByteTokenizer, FileTokenizer  # noqa: E402


def test_byte_tokenizer_as_a_transformers_tokenizer_keeps_every_id():
    ours, theirs = ByteTokenizer(), to_hf_tokenizer(ByteTokenizer())
    text = "def f(x):\n\treturn 'héllo' + \"€\"  \x00\x7f"
    assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert theirs(text)["input_ids"] == [ours.eos_id] + ours.encode(text)  # documents start from eos
    assert theirs.decode(ours.encode(text)) == text
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id, len(theirs)) == (257, 257, 258, 259)


def test_special_token_text_stays_bytes_and_batches_pad_on_the_left():
    ours, theirs = ByteTokenizer(), to_hf_tokenizer(ByteTokenizer())
    text = "x = '<pad>' + '<eos>' + '<bos>'"  # code often holds such text: the byte tokenizer encodes its bytes
    assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    batch = theirs(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0] == [258, 258, 257, 97, 98] and batch["attention_mask"][0] == [0, 0, 1, 1, 1]


@pytest.mark.parametrize("start", [["<s>"], []])
def test_a_file_tokenizer_puts_its_document_start_in_front(start, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.add_special_tokens(["</s>", "<s>"])
    raw.save(str(tmp_path / "tokenizer.json"))
    ours = FileTokenizer(tmp_path / "tokenizer.json", document_start=start)
    theirs = to_hf_tokenizer(ours)
    assert ours.document_start == [4] * len(start) and ours.to_dict()["document_start"] == start
    assert theirs("a b")["input_ids"] == ours.document_start + [0, 1]
    assert theirs.bos_token == (start[0] if start else None)
    with pytest.raises(ValueError, match=r"document_start: expected tokens of the vocabulary of .*, got \['<x>'\]"):
        FileTokenizer(tmp_path / "tokenizer.json", document_start=["<x>"])
