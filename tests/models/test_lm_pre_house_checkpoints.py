"""Checkpoints saved before the house refactor (issue 27; flat config fields, written by
``tests/fixtures/make_pre_house_checkpoints.py`` at commit 9d663c1) load, and give the logits and gradients
that code computed, in every mode.

Bit for bit on the CPU that wrote them (an AMD EPYC, AVX2). Another CPU's float32 kernels round differently: on
an Intel Xeon (AVX-512) the same code differs by up to 2.9e-6 of the largest value (the `ram` fixture's
recurrent logits; 2.6e-6 its gradients). So the comparison allows 2e-5 relative, float32's rounding at these
sizes. A checkpoint read into a different model is far past it: `yarn` with its scaling dropped is off by 5.8e-3,
with its rotary base doubled by 7.6e-4 (`ram`: 0.26)."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from hybrid.train.lm.inference import load_run

FIXTURES = Path(__file__).parent.parent / "fixtures" / "pre_house"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def test_fixtures_exist():
    assert NAMES == ["carope", "ram", "yarn"]


@pytest.mark.parametrize("name", NAMES)
def test_logits_and_gradients_identical(name, one_torch_thread):
    expected = load_file(str(FIXTURES / name / "expected.safetensors"))
    model = load_run(FIXTURES / name).model
    ids = expected["ids"]
    model.train()
    logits, _ = model(ids, output_final_state=False)
    V = logits.shape[-1]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    close(logits.detach(), expected["logits"], "logits")
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert sorted("grad." + n for n in grads) == sorted(k for k in expected if k.startswith("grad."))
    for n, g in grads.items():
        close(g, expected["grad." + n], n)
    model.eval()
    with torch.no_grad():
        close(model(ids, mode="chunked", chunk_size=7)[0], expected["logits_chunked"], "chunked logits")
        close(model(ids, mode="recurrent")[0], expected["logits_recurrent"], "recurrent logits")


def close(got: torch.Tensor, want: torch.Tensor, what: str, rel: float = 2e-5) -> None:
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err <= rel, f"{what}: {err:.3g} of the largest value from the saved code's (allowed: {rel:g})"
