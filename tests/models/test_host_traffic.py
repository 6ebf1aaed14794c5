"""Every preset's training step (padded and packed) and decode step, on the meta device standing in for a GPU: no
copy from the host but the packed offsets' one (non-blocking, ``kernels/varlen.py``), no value read back, no
output whose shape depends on values. On a GPU each of these is a host sync, and a CUDA graph cannot hold it; on
the CPU none of them shows, since host and device are one (RetNet's decays were copied in every step, found on
an H200 on 2026-11-28; the blocked backend's packed global attention selected its rows by a mask; a rotary
scaling whose frequencies follow the length, dynamic NTK or longrope, computed its rows on the host past L0)."""
import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hybrid.models import HybridConfig, HybridLM
from hybrid.models.decoding.graph_recorders import host_traffic
from hybrid.models.state import HybridState
from hybrid.train.data.packing import packed_on_device

META = torch.device("meta")
L0 = 32  # the length-dependent scalings' original length: the steps below run past it
DYNAMIC_NTK = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": L0}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16, "factor": 4.0,
            "original_max_position_embeddings": L0}
PRESETS = {"hybrid": ("hybrid", dict(window=16)), "hybrid-selective": ("hybrid", dict(window=16, rnn_selective=True)),
           "transformer": ("transformer", {}), "transformer-window": ("transformer", dict(window=16)),
           "retnet": ("retnet", {}), "vo-rnn": ("vo-rnn", {}), "vo-gla": ("vo-gla", {}),
           "transformer-dynamic-ntk": ("transformer", dict(rope_scaling=DYNAMIC_NTK)),
           "hybrid-longrope": ("hybrid", dict(window=16, rope_scaling=LONGROPE)),
           # weights (and the rotary buffer) cast to bfloat16, as a model is for inference (the GPU check's decoding)
           "transformer-bfloat16": ("transformer", dict(dtype="bfloat16")),
           "hybrid-bfloat16": ("hybrid", dict(window=16, dtype="bfloat16"))}


class HostTraffic(TorchDispatchMode):
    """Records each op a CUDA graph could not hold (``graph_recorders.host_traffic``: a read back, a build from host
    data, a copy from the host, a value-dependent shape), with the library's frame that asked for it."""

    def __init__(self):
        super().__init__()
        self.sites = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = host_traffic(func, args, out)
        if op is not None:
            ours = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename]
            self.sites.append(f"{op} at {ours[-1].filename.rsplit('/', 2)[-1]}:{ours[-1].lineno}")
        return out


class MetaAutocast(torch.autocast):
    """``torch.autocast`` that lets the meta device through (it has no autocast of its own); the steps run in
    float32, so there is nothing for it to cast."""

    def __init__(self, device_type, *args, **kwargs):
        self.meta = device_type == "meta"
        if not self.meta:
            super().__init__(device_type, *args, **kwargs)

    def __enter__(self):
        return None if self.meta else super().__enter__()

    def __exit__(self, *exc):
        return None if self.meta else super().__exit__(*exc)


def traffic(run) -> list[str]:
    run()  # first calls fill caches (rotary tables), once per model, not per step
    with HostTraffic() as spy:
        run()
    return spy.sites


@pytest.fixture
def meta_model(monkeypatch):
    monkeypatch.setattr(torch, "autocast", MetaAutocast)

    def build(name):
        torch.manual_seed(0)
        preset, overrides = PRESETS[name]
        return HybridLM(HybridConfig.preset(preset, "tiny", **overrides)).to(META)

    return build


@pytest.mark.parametrize("name", PRESETS)
def test_training_steps_bring_nothing_from_the_host_but_the_packed_offsets(meta_model, name):
    model = meta_model(name)
    ids = torch.zeros(2, 40, dtype=torch.long, device=META)

    def padded():
        logits, _ = model(ids, output_final_state=False)
        logits.float().sum().backward()

    def packed():  # the trainer's way: host offsets, moved once (non-blocking) and carried with their values
        cu = packed_on_device(torch.tensor([0, 5, 40, 41, 80]), META, compiled=False)
        logits, _ = model(ids.reshape(1, 80), cu_seqlens=cu, output_final_state=False)
        logits.float().sum().backward()

    assert traffic(padded) == []
    assert [s.split(" at ")[0] for s in traffic(packed)] == ["lift_fresh_copy"], traffic(packed)  # the offsets' copy


@pytest.mark.parametrize("form", ["uniform", "rows"])
@pytest.mark.parametrize("name", PRESETS)
def test_decode_steps_bring_nothing_from_the_host(meta_model, name, form):
    """Each step at a new position past the prompt of 40 (past L0), as decoding runs: a step that repeated one
    position would find its rows kept from the step before. Both forms of the batch: every row at one position,
    and the rows form (each row's position a tensor: a ragged batch, and every step a CUDA graph replays)."""
    model = meta_model(name)
    with torch.no_grad():
        if form == "uniform":
            _, state = model(torch.zeros(2, 40, dtype=torch.long, device=META))
        else:  # two prompts of 40 and 37 tokens as one batch (their caches copied into rows)
            _, state = model(torch.zeros(1, 40, dtype=torch.long, device=META))
            _, other = model(torch.zeros(1, 37, dtype=torch.long, device=META))
            state = HybridState.cat([state, other])
        token = torch.zeros(2, 1, dtype=torch.long, device=META)
        states = [state]

        def step():
            states.append(model(token, state=states[-1])[1])

        assert traffic(step) == []
