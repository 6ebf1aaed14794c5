"""hybrid.train.bench.speed: the non-embedding parameter count, on the meta device."""
from __future__ import annotations

import pytest

from hybrid.train.bench.speed import non_embedding_parameters
from hybrid.models import HybridConfig, HybridLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)


@pytest.mark.parametrize("overrides", [{"rnn_phase": "data"}, {"rnn_phase": "data", "rnn_phase_map": "2pi-tanh"},
                                       {"rnn_phase": "carope"}, {"rnn_selective": True}])
def test_parameter_count_on_the_meta_device_matches_a_real_model(overrides):
    """The harness counts parameters on the meta device (no memory); every mixer option must build there
    (the data phase once checked its initial angles with a host sync, which meta tensors cannot do)."""
    config = HybridConfig.preset("hybrid", "tiny", d_model=32, n_layers=3, n_heads=2, **overrides)
    assert non_embedding_parameters(config) == HybridLM(config).num_parameters(exclude_embeddings=True)
