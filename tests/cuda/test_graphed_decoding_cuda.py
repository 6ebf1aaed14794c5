"""The decode step as a real CUDA graph (models/decoding/graphed_step.py): every replayed step's logits equal the
eager step's in float32 on the GPU, for each preset, past a window's wrap and a global cache's regrowth, the
eager step recorded, and for the decoding target's two models the compiled one (``compiled=True``, Inductor's
kernels in the graph); generate gives the eager greedy tokens. (The CPU stand-ins' tests:
tests/models/decoding/test_graphed_step.py.)"""
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.models.decoding.graphed_step import GraphedStep
from hybrid.models.decoding.prompts import prefill
from hybrid.models.generation import generate

PRESETS = {"hybrid": dict(window=8), "transformer": {}, "retnet": {}, "vo-rnn": dict(rnn_selective=True),
           "vo-gla": {}, "vo-gla-fla": {},
           # frequencies from each row's own length, computed on the device: rows cross L0 = 16 during the steps
           "transformer-dynamic-ntk": dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0,
                                                         "original_max_position_embeddings": 16}),
           # weights cast to bfloat16, as the GPU check's decoding part builds them (its rotary frequencies were
           # copied from the host every step until 2026-11-28, which no float32 case here could show)
           "hybrid-bfloat16": dict(window=8, dtype="bfloat16")}
BASE_PRESET = {"vo-gla-fla": "vo-gla", "transformer-dynamic-ntk": "transformer", "hybrid-bfloat16": "hybrid"}
# G in its torch form first; with fla-core's Triton kernels (G's default on CUDA) last: they autotune on first use,
# past a minute of device time (on 2026-11-28 the tests part's limit stopped there, before the compiled cases)
BACKENDS = {"vo-gla": "torch", "vo-gla-fla": "auto"}


# each compiled case compiles a model (device time): the decoding target's two models
CASES = [(preset, False) for preset in PRESETS if preset != "vo-gla-fla"] + [("hybrid", True), ("transformer", True),
                                                                             ("vo-gla-fla", False)]


@pytest.mark.parametrize("preset, compiled", CASES, ids=[f"{p}-{'compiled' if c else 'eager'}" for p, c in CASES])
def test_replayed_cuda_graph_steps_equal_eager_steps(cuda, monkeypatch, preset, compiled):
    if preset in BACKENDS:
        monkeypatch.setenv("HYBRID_GLA_BACKEND", BACKENDS[preset])
    torch.manual_seed(0)
    config = HybridConfig.preset(BASE_PRESET.get(preset, preset), "tiny", **PRESETS[preset])
    model = HybridLM(config).to(cuda).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).to(cuda) for n in (5, 19, 1, 12)]
    forced = torch.randint(0, model.config.vocab_size, (4, 40), generator=g).to(cuda)
    # the replay runs the eager step's kernels (0 apart); bfloat16 allows a few units in its last place should the
    # capture pick other GEMM kernels
    float32 = model.embed.weight.dtype == torch.float32
    tolerance = 1e-5 if float32 else 2e-2
    with torch.no_grad():
        _, state = prefill(model, prompts)
        eager_state = state.clone()
        step = GraphedStep(model, "cuda", compiled=compiled)
        for t in range(forced.shape[1]):
            want, eager_state = model(forced[:, t:t + 1], state=eager_state)
            got, state = step(forced[:, t:t + 1], state=state)
            err = ((got - want).abs().max() / want.abs().max()).item()
            assert err <= tolerance, f"step {t}: relative error {err:.3g}"
    assert step.counts["replayed"] == forced.shape[1] and step.counts["eager"] == 0
    ids = torch.randint(0, model.config.vocab_size, (3, 9), generator=g).to(cuda)
    want = generate(model, ids, 12, temperature=0)
    if not compiled and float32:  # the same kernels: the same tokens
        assert torch.equal(generate(model, ids, 12, temperature=0, compile="cuda-graph"), want)
    else:  # Inductor's kernels, or bfloat16's rounding of the graph's rows form against the eager uniform one (the
        # steps above agree to their tolerance): a near tie may pick another token
        out = generate(model, ids, 12, temperature=0, compile="compiled-cuda-graph" if compiled else "cuda-graph")
        assert out.shape == want.shape and torch.equal(out[:, :9], ids)
        torch.compiler.reset()
