"""Next-token sampling (models/sampling.py): greedy, temperature, top-k, top-p, never a padding id."""
import torch

from hybrid.models.sampling import mask_padding, sample_next


def test_sample_next_masks_padding_ids_in_every_path():
    logits = torch.zeros(4, 10)
    logits[:, 7:] = 100.0  # the padding ids would win every draw
    for kwargs in (dict(temperature=0), dict(), dict(top_k=3), dict(top_p=0.9), dict(top_k=2, top_p=0.5)):
        for seed in range(10):
            ids = sample_next(logits, generator=torch.Generator().manual_seed(seed), vocab_limit=7, **kwargs)
            assert int(ids.max()) < 7, kwargs
    assert torch.equal(mask_padding(logits, None), logits) and torch.equal(mask_padding(logits, 10), logits)


def test_top_k_one_and_a_tiny_top_p_are_greedy():
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    greedy = sample_next(logits, temperature=0)
    assert torch.equal(greedy, logits.argmax(-1))
    for kwargs in (dict(top_k=1), dict(top_p=1e-6), dict(temperature=0.5, top_k=1)):
        assert torch.equal(sample_next(logits, generator=torch.Generator().manual_seed(1), **kwargs), greedy), kwargs
