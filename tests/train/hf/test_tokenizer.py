"""hybrid.train.hf.tokenizer: the byte tokenizer as a transformers tokenizer keeps every id."""
import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from hybrid.train.hf.tokenizer import to_hf_tokenizer  # noqa: E402
from hybrid.train.data.tokenizer import ByteTokenizer  # noqa: E402


def test_byte_tokenizer_as_a_transformers_tokenizer_keeps_every_id():
    ours, theirs = ByteTokenizer(), to_hf_tokenizer(ByteTokenizer())
    text = "def f(x):\n\treturn 'héllo' + \"€\"  \x00\x7f"
    assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert theirs(text)["input_ids"] == [ours.eos_id] + ours.encode(text)  # documents start from eos
    assert theirs.decode(ours.encode(text)) == text
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id, len(theirs)) == (257, 257, 258, 259)
