"""Checkpoints saved before the house refactor (issue 27; flat config fields, written by
``tests/fixtures/make_pre_house_checkpoints.py`` at commit 9d663c1) load, and give the very logits and
gradients that code computed, in every mode."""
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
    assert torch.equal(logits, expected["logits"])
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert sorted("grad." + n for n in grads) == sorted(k for k in expected if k.startswith("grad."))
    for n, g in grads.items():
        assert torch.equal(g, expected["grad." + n]), n
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids, mode="chunked", chunk_size=7)[0], expected["logits_chunked"])
        assert torch.equal(model(ids, mode="recurrent")[0], expected["logits_recurrent"])
