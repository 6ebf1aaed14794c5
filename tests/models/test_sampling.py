"""Next-token sampling (models/sampling.py): greedy, temperature, top-k, top-p, never a padding id."""
import pytest
import torch

from hybrid.models.sampling import draw, draw_rows, mask_padding, sample_next


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_draw_is_torch_multinomials_draw_without_its_sync(dtype):
    """``draw`` gives ``torch.multinomial(probs, 1)``'s ids bit for bit, from the same generator, and leaves it
    in the same state: fresh probabilities of odd sizes, unnormalised rows, zeros (never drawn), a row of one id."""
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        shape = [(1, 3), (5, 31), (3, 257), (2, 4, 7)][seed % 4]
        probs = torch.softmax(3 * torch.randn(shape, generator=g), -1) * (1 + seed % 3)
        if seed % 2:
            probs = probs.masked_fill(torch.rand(shape, generator=g) < 0.6, 0.0)
            probs[..., seed % shape[-1]] = 0.25
        probs = probs.to(dtype)
        mine, theirs = torch.Generator().manual_seed(100 + seed), torch.Generator().manual_seed(100 + seed)
        want = torch.multinomial(probs.reshape(-1, shape[-1]), 1, generator=theirs).reshape(shape[:-1])
        got = draw(probs, mine)
        assert torch.equal(got, want), (seed, got, want)
        assert torch.equal(mine.get_state(), theirs.get_state())
        assert bool((probs.gather(-1, got[..., None]) > 0).all())


def test_draw_refuses_what_multinomial_refuses_in_one_line():
    for bad, what in ((float("nan"), "1 NaN"), (float("inf"), "1 inf"), (-0.5, "1 negative")):
        probs = torch.full((2, 5), 0.2)
        probs[1, 3] = bad
        with pytest.raises(ValueError, match=rf"^probs: expected non-negative finite probabilities, got {what} "
                                             rf"among 10$"):
            draw(probs)
    with pytest.raises(ValueError, match=r"^probs: expected rows with a positive sum, got 1 row\(s\) of zeros$"):
        draw(torch.tensor([[0.5, 0.5], [0.0, 0.0]]))
    with pytest.raises(RuntimeError, match="sum of probabilities"):  # what multinomial says of it
        torch.multinomial(torch.tensor([[0.5, 0.5], [0.0, 0.0]]), 1)


def test_draw_rows_draws_each_row_from_its_own_generator():
    """Each row as ``draw`` draws it alone from its generator, every generator left as after that draw."""
    probs = torch.softmax(2 * torch.randn(5, 67, generator=torch.Generator().manual_seed(0)), -1)
    probs[:, ::4] = 0.0
    mine = [torch.Generator().manual_seed(10 + i) for i in range(5)]
    alone = [torch.Generator().manual_seed(10 + i) for i in range(5)]
    want = torch.stack([draw(probs[i:i + 1], g)[0] for i, g in enumerate(alone)])
    assert torch.equal(draw_rows(probs, mine), want)
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(mine, alone))
    with pytest.raises(ValueError, match=r"^generators: expected one per row of probs \(5\), got 4$"):
        draw_rows(probs, mine[:4])
    with pytest.raises(ValueError, match=r"^probs: expected non-negative finite probabilities, got 1 NaN among 335$"):
        draw_rows(probs.index_fill(1, torch.tensor([3]), 0.0).index_put((torch.tensor([1]), torch.tensor([2])),
                                                                        torch.tensor(float("nan"))), mine)
