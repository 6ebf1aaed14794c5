"""Fixtures for the HybridLM tests: seeded tiny models whose every parameter matters, and seeded token ids."""
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM


def _perturbed_model(config: HybridConfig, seed: int, *, float64: bool) -> HybridLM:
    """``HybridLM(config)`` after ``torch.manual_seed(seed)``, in eval mode, its gains and biases moved by
    0.2·N(0, 1) (so that every parameter matters in the comparisons); in float64 its attention is also sharpened
    (``in_proj`` × 20: the init's attention is near uniform)."""
    torch.manual_seed(seed)
    model = HybridLM(config)
    if float64:
        model = model.double()
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
            if float64 and name.endswith("in_proj.weight"):
                p.mul_(20.0)
    return model


@pytest.fixture
def model_of():
    """``model_of(config, seed=0)``: a float32 HybridLM in eval mode with non-trivial gains and biases."""
    return lambda config, seed=0: _perturbed_model(config, seed, float64=False)


@pytest.fixture
def float64_model_of():
    """``float64_model_of(config, seed=0)``: a float64 HybridLM in eval mode with non-trivial gains and biases
    and sharp attention."""
    return lambda config, seed=0: _perturbed_model(config, seed, float64=True)


@pytest.fixture
def ids_of(request):
    """``ids_of(B, T, seed)``: seeded token ids ``(B, T)`` in ``[0, VOCAB)``, VOCAB the requesting module's."""
    vocab = request.module.VOCAB
    return lambda B, T, seed: torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))
