"""Our tokenizers as transformers fast tokenizers (for save_pretrained directories and lm-eval).

A ``FileTokenizer`` is its own ``tokenizer.json``. The ``ByteTokenizer`` becomes an equivalent ``tokenizers``
model: a byte-level pre-tokenizer (each UTF-8 byte shown as one printable character, GPT-2's byte alphabet),
a BPE without merges whose vocabulary gives byte ``b`` id ``b``, then ``<bos>``, ``<eos>``, ``<pad>`` as 256-258,
so token ids are identical.

Documents start from ``eos`` in this library (training streams are ``[eos] doc [eos] doc …``, prompts are
``[eos] + prompt``): the tokenizer's ``document_start``, which an imported model's tokenizer records from its source
(``<s>`` for Llama, nothing for Qwen2). The transformers tokenizer puts it in front when asked for special tokens
(its default, and what lm-eval does), and names its first token as its ``bos_token``:
``tok(text).input_ids == document_start + ids``. ``add_special_tokens=False`` gives the plain ids. It pads on the
left (a decoder-only model generates after the prompt), and the byte tokenizer's ``<eos>``-like text stays bytes,
as the byte tokenizer encodes it (``split_special_tokens``).
"""
from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from ..data.tokenizer import ByteTokenizer, FileTokenizer, Tokenizer, byte_alphabet

__all__ = ["byte_alphabet", "to_hf_tokenizer"]


def _byte_level_tokenizer():
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in enumerate(byte_alphabet())}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([ByteTokenizer.specials[i] for i in sorted(ByteTokenizer.specials)])  # ids 256, 257, 258
    return raw


def to_hf_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """A ``PreTrainedTokenizerFast`` with the same ids as ``tok`` (eos, bos, pad included)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.processors import TemplateProcessing

    if isinstance(tok, ByteTokenizer):
        raw = _byte_level_tokenizer()
    elif isinstance(tok, FileTokenizer):
        raw = RawTokenizer.from_str(tok._tok.to_str())  # a copy: the run's tokenizer stays as it is
    else:
        raise ValueError(f"tokenizer: expected a ByteTokenizer or FileTokenizer, got {type(tok).__name__}")
    start = [raw.id_to_token(i) for i in tok.document_start]
    if start or isinstance(tok, ByteTokenizer):  # an import whose source adds nothing keeps its own processor
        front = " ".join(start)
        raw.post_processor = TemplateProcessing(single=f"{front} $A".strip(), pair=f"{front} $A {front} $B:1".strip(),
                                                special_tokens=sorted(set(zip(start, tok.document_start))))
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=raw.id_to_token(tok.eos_id),
                                   bos_token=start[0] if start else None, pad_token=raw.id_to_token(tok.pad_id),
                                   padding_side="left", split_special_tokens=isinstance(tok, ByteTokenizer))
