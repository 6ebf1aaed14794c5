"""HybridConfig.recompute (activation checkpointing): the same logits and gradients, fewer saved activations."""
import dataclasses

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM

CASES = [("hybrid", "linear"), ("hybrid", "all"), ("transformer", "all"), ("retnet", "linear"), ("vo-rnn", "linear")]


def pair_of_models(preset: str, recompute: str, **overrides):
    """Two float64 models with the same weights, one recomputing."""
    extra = {"window": 7} if preset == "hybrid" else {}
    config = HybridConfig.preset(preset, "tiny", d_model=24, n_layers=3, n_heads=2, dtype="float64",
                                 **extra, **overrides)
    torch.manual_seed(0)
    plain = HybridLM(config).train()
    recomputing = HybridLM(dataclasses.replace(config, recompute=recompute)).train()
    recomputing.load_state_dict(plain.state_dict())
    return plain, recomputing


def loss_and_grads(model, ids, **kwargs):
    logits, state = model(ids, **kwargs)
    (logits.sin() * torch.linspace(0.5, 1.5, logits.shape[-1], dtype=logits.dtype)).sum().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()], state


@pytest.mark.parametrize("preset,recompute", CASES)
@pytest.mark.parametrize("mode", ["parallel", "chunked"])
def test_same_logits_and_gradients(preset, recompute, mode):
    plain, recomputing = pair_of_models(preset, recompute, rnn_selective=preset == "vo-rnn")
    ids = torch.randint(0, 200, (2, 29))
    kwargs = {"mode": mode, "chunk_size": 10} if mode == "chunked" else {}
    logits_a, grads_a, state_a = loss_and_grads(plain, ids, **kwargs)
    logits_b, grads_b, state_b = loss_and_grads(recomputing, ids, **kwargs)
    torch.testing.assert_close(logits_b, logits_a, rtol=1e-12, atol=0)
    for (name, _), ga, gb in zip(plain.named_parameters(), grads_a, grads_b):
        err = (gb - ga).abs().max() / ga.abs().max().clamp_min(1e-300)
        assert err < 1e-12, f"{name}: relative error {err:.2e}"
    # the returned state continues the sequence identically
    nxt = torch.randint(0, 200, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(recomputing(nxt, state=state_b)[0], plain(nxt, state=state_a)[0],
                                   rtol=1e-12, atol=0)


def saved_bytes(model, ids) -> int:
    """Bytes autograd keeps for backward (each storage counted once)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids)[0].sum()
    return sum(storages.values())


def recomputed_blocks(model, ids, monkeypatch) -> list[int]:
    """The blocks a training forward runs under activation checkpointing, by index."""
    import hybrid.models.lm as lm

    seen, original = [], lm.checkpoint
    monkeypatch.setattr(lm, "checkpoint", lambda block, *a, **k: seen.append(block) or original(block, *a, **k))
    model(ids)
    monkeypatch.setattr(lm, "checkpoint", original)
    return [list(model.blocks).index(block) for block in seen]


def test_recomputing_saves_less_and_only_where_asked(monkeypatch):
    ids = torch.randint(0, 200, (1, 256))
    plain, linear = pair_of_models("hybrid", "linear")
    assert saved_bytes(linear, ids) < 0.5 * saved_bytes(plain, ids)
    # global attention blocks are not linear-cost: "linear" leaves a transformer as it is
    plain_tf, linear_tf = pair_of_models("transformer", "linear")
    assert saved_bytes(linear_tf, ids) == saved_bytes(plain_tf, ids)
    assert recomputed_blocks(linear_tf, ids, monkeypatch) == []
    assert recomputed_blocks(linear, ids, monkeypatch) == [0, 1, 2]


def test_eval_and_no_grad_do_not_recompute(monkeypatch):
    import hybrid.models.lm as lm

    _, model = pair_of_models("hybrid", "all")
    ids = torch.randint(0, 200, (1, 16))
    calls = []
    original = lm.checkpoint
    monkeypatch.setattr(lm, "checkpoint", lambda *a, **k: calls.append(1) or original(*a, **k))
    with torch.no_grad():
        model(ids)
    model.eval()
    model(ids)
    assert calls == []
    model.train()
    model(ids)
    assert len(calls) == 3


def test_bad_recompute_is_one_clear_line():
    with pytest.raises(ValueError, match=r"recompute: expected one of \('none', 'linear', 'all'\), got 'blocks'"):
        HybridConfig(recompute="blocks")
