"""Fixtures for the transformers-wrapper tests: seeded tiny HybridForCausalLM models and seeded prompts.

transformers is imported only when a fixture runs: each test module skips first when it is missing."""
import pytest
import torch

from hybrid.models import HybridConfig

VOCAB = 53
TINY = dict(d_model=32, n_layers=3, n_heads=2, vocab_size=VOCAB)


@pytest.fixture
def hf_model():
    """``hf_model(config, seed=0)``: ``HybridForCausalLM`` of ``config`` after ``torch.manual_seed(seed)``,
    in eval mode."""
    from hybrid.models.hf import HybridForCausalLM, HybridHFConfig

    def build(config: HybridConfig, seed: int = 0):
        torch.manual_seed(seed)
        return HybridForCausalLM(HybridHFConfig(config)).eval()
    return build


@pytest.fixture
def tiny_cases() -> dict[str, HybridConfig]:
    """Every preset at vocabulary 53 (the hybrid's window, 3, is shorter than the prompts) and a GQA + CARoPE +
    untied variant, by name."""
    return {
        "hybrid": HybridConfig.preset("hybrid", **TINY, window=3),
        "transformer": HybridConfig.preset("transformer", **TINY),
        "retnet": HybridConfig.preset("retnet", **TINY),
        "vo-rnn": HybridConfig.preset("vo-rnn", **TINY),
        "vo-gla": HybridConfig.preset("vo-gla", **TINY),
        "hybrid-gqa-carope-untied": HybridConfig.preset("hybrid", **{**TINY, "n_heads": 4}, window=4, n_kv_heads=2,
                                                        carope=True, tie_embeddings=False),
    }


@pytest.fixture
def make(hf_model, tiny_cases):
    """``make(name, seed=0)``: the seeded model of ``tiny_cases[name]``."""
    return lambda name, seed=0: hf_model(tiny_cases[name], seed)


@pytest.fixture
def ids_for():
    """``ids_for(B, T, seed=1)``: seeded prompt ids ``(B, T)`` in ``[1, 53)`` (0 is the padding id)."""
    return lambda B, T, seed=1: torch.randint(1, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))
