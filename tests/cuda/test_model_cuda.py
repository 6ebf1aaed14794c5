"""The hybrid on the GPU: ``torch.compile(fullgraph=True)`` equals eager, a bf16 training step makes no host
sync, and the three modes agree."""
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.bench.gpu_check.context import CheckContext, rel_error
from hybrid.train.bench.gpu_check.part_correctness import (COMPILE_TOL, SYNC_ENV, SYNC_MODELS, _batches,
                                                           _loss_and_grads, _tiny_hybrid, compiled_for, count_syncs,
                                                           training_step_phases)


def context(tmp_path):
    return CheckContext(part="test", device=torch.device("cuda"), dry_run=False, deadline=float("inf"),
                        log=tmp_path / "log.jsonl", work=tmp_path, repo=None)


def model(selective: bool):
    torch.manual_seed(0)
    return HybridLM(HybridConfig.preset("hybrid", "tiny", window=32, rnn_selective=selective)).cuda().train()


@pytest.mark.parametrize("selective", [False, True], ids=["static", "selective"])
def test_compiled_fullgraph_equals_eager(cuda, tmp_path, selective):
    """Padded with ``fullgraph=True``; packed on FlexAttention without it (its mask is built outside the graph by
    design: ``packed_mask_breaks_graph``)."""
    m = model(selective)
    for kind, (ids, cu) in _batches(context(tmp_path), m, 200).items():
        compiled = compiled_for(m, cu, dynamic=False)
        want_logits, want_grads = _loss_and_grads(m, ids, cu)
        got_logits, got_grads = _loss_and_grads(compiled, ids, cu)
        assert rel_error(got_logits, want_logits) <= COMPILE_TOL, kind
        worst = max(rel_error(a, b) for a, b in zip(got_grads, want_grads))
        assert worst <= COMPILE_TOL, kind


@pytest.mark.parametrize("preset, overrides", SYNC_MODELS,
                         ids=[p + {True: "-selective", False: "-static"}.get(o.get("rnn_selective"), "")
                              for p, o in SYNC_MODELS])
@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_training_step_makes_no_host_sync(cuda, tmp_path, monkeypatch, preset, overrides, kind):
    """Every mixer's (R static and selective, A, M, G) training step, bf16 autocast, fused AdamW (G in its torch
    form: ``SYNC_ENV``)."""
    for name, value in SYNC_ENV.get(preset, {}).items():
        monkeypatch.setenv(name, value)
    m = _tiny_hybrid(context(tmp_path), preset, **overrides).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
    ids, cu = _batches(context(tmp_path), m, 256)[kind]
    phases = training_step_phases(m, opt, ids, None if cu is None else cu.cpu(), ids.device)
    for run in phases.values():
        run()
    torch.cuda.synchronize()
    syncs = count_syncs(phases)
    assert not syncs, f"{len(syncs)} host syncs: {syncs[:8]}"


@pytest.mark.parametrize("preset", ["hybrid", "transformer", "retnet", "vo-rnn"])
def test_modes_agree(cuda, preset):
    """Parallel logits equal chunked and token-by-token recurrent ones, float32 on the GPU."""
    torch.manual_seed(0)
    m = HybridLM(HybridConfig.preset(preset, "tiny", **({"window": 16} if preset == "hybrid" else {}))).cuda().eval()
    ids = torch.randint(0, m.config.vocab_size, (2, 53), device="cuda")
    with torch.no_grad():
        parallel, _ = m(ids)
        chunked, _ = m(ids, mode="chunked", chunk_size=20)
        recurrent, _ = m(ids, mode="recurrent")
    assert rel_error(chunked, parallel) <= 1e-4
    assert rel_error(recurrent, parallel) <= 1e-4
