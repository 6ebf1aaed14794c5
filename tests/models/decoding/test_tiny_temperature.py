"""A temperature so small that logits / temperature overflows float32 (models/sampling.py, ``scaled_scores``): the
draw is the greedy token, in sample_next, generate, continuous batching and speculative decoding; a row that does not
overflow keeps exactly softmax(logits / temperature)."""
from __future__ import annotations

import pytest
import torch

from hybrid.models import HybridConfig
from hybrid.models.decoding.decoder import Request, generate_many
from hybrid.models.decoding.speculative import draft_from_layers, speculative_decode
from hybrid.models.generation import generate
from hybrid.models.sampling import sample_next, sampling_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 29
TINY_TEMPERATURES = [1e-40, 1e-46, 5e-324]  # 1e-46 and 5e-324 round to 0 in float32: logits / t is ±inf or NaN


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
def test_a_tiny_temperature_draws_the_greedy_token(temperature):
    logits = 5 * torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(0))
    for options in (dict(), dict(top_k=3), dict(top_p=0.5), dict(vocab_limit=20)):
        greedy = sample_next(logits, temperature=0, vocab_limit=options.get("vocab_limit"))
        for seed in range(3):
            got = sample_next(logits, temperature, generator=torch.Generator().manual_seed(seed), **options)
            assert torch.equal(got, greedy), options
        probs = sampling_probs(logits, temperature, **options)
        assert torch.equal(probs, torch.nn.functional.one_hot(greedy, VOCAB).float()), options


def test_only_the_rows_that_overflow_become_greedy():
    g = torch.Generator().manual_seed(1)
    logits = torch.stack([torch.randn(VOCAB, generator=g), 1e4 * torch.randn(VOCAB, generator=g)])  # (2, V)
    temperature = 1e-36  # row 0: |logit| / t below float32's max (3.4e38); row 1: far above
    probs = sampling_probs(logits, temperature)
    assert torch.equal(probs[0], torch.softmax(logits[0] / temperature, -1))
    assert torch.equal(probs[1], torch.nn.functional.one_hot(logits[1].argmax(), VOCAB).float())
    for t in (0.7, 1.0, 2.5):  # ordinary temperatures: exactly softmax(logits / t), as before
        assert torch.equal(sampling_probs(logits, t), torch.softmax(logits / t, -1)), t


def test_decoders_at_a_tiny_temperature_give_the_greedy_tokens(float64_model_of):
    config = HybridConfig.preset("hybrid", "tiny", d_model=16, n_heads=2, n_layers=2, vocab_size=VOCAB, window=3)
    model = float64_model_of(config)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in (4, 1, 7)]
    greedy = [generate(model, p[None], 6, temperature=0)[0, len(p):] for p in prompts]
    tiny = generate(model, prompts, 6, temperature=1e-40, generator=torch.Generator().manual_seed(0))
    assert [t[len(p):].tolist() for t, p in zip(tiny, prompts)] == [w.tolist() for w in greedy]
    many = generate_many(model, [Request(p, 6, temperature=1e-40) for p in prompts])
    assert [m.tolist() for m in many] == [w.tolist() for w in greedy]
    new, _ = speculative_decode(model, draft_from_layers(model, 1), prompts, 6, 2, temperature=1e-40,
                                generator=torch.Generator().manual_seed(0))
    assert [n.tolist() for n in new] == [w.tolist() for w in greedy]
