"""The decoding loops read values back to the host only where they must: ``generate`` never per token (with an
``eos_token_id``, once every 8 tokens off the CPU, to stop early), continuous batching once a step (the tokens, to
see which requests end), speculative decoding once a round (which rows are done). On a GPU each read back is a host
sync that drains the queue of launched work; on the CPU none shows, so the reads are counted here at the Python
level, the checks that read back on the CPU only (``hybrid.checks.reads_back``) turned off as on a GPU
(tests/cuda/test_decoding_syncs_cuda.py counts the real syncs). Found so: continuous batching read each row's token
apart (B syncs a step), every sampled token's ``torch.multinomial`` checked its probabilities on the host, and a
speculative round made 2K + 5 reads."""
from __future__ import annotations

import traceback
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode

from hybrid.checks import recording_graph
from hybrid.models import HybridConfig, generation
from hybrid.models.decoding.decoder import Request, generate_many
from hybrid.models.decoding.speculative import draft_from_layers, speculative_decode
from hybrid.models.generation import generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 29
TINY = dict(d_model=16, n_heads=2, n_layers=3, vocab_size=VOCAB)
CASES = {"hybrid": HybridConfig.preset("hybrid", "tiny", **TINY, window=4),
         "transformer": HybridConfig.preset("transformer", "tiny", **TINY),
         "retnet": HybridConfig.preset("retnet", "tiny", **TINY)}

# What reads a device tensor back on a GPU: a value to Python, or an output whose size depends on values.
READS = {"item", "tolist", "numpy", "__int__", "__bool__", "__float__", "__index__",
         "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "multinomial"}


class HostReads(TorchFunctionMode):
    """Counts each call that would read back on a GPU, by the library frame that made it."""

    def __init__(self):
        super().__init__()
        self.sites = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _reads_back(getattr(func, "__name__", ""), args, kwargs):
            ours = [f for f in traceback.extract_stack()[:-1] if "/hybrid/" in f.filename or "/models/" in f.filename]
            where = f"{ours[-1].filename.rsplit('/', 2)[-1]}:{ours[-1].lineno}" if ours else "?"
            self.sites[f"{func.__name__} at {where}"] += 1
        return func(*args, **kwargs)

    @property
    def count(self) -> int:
        return sum(self.sites.values())


def _reads_back(name: str, args, kwargs) -> bool:
    if name in READS:
        return True
    if name == "repeat_interleave":  # its output's size is read back unless given
        return kwargs.get("output_size") is None
    if name in ("__getitem__", "__setitem__", "index_put", "index_put_"):  # a boolean mask selects by nonzero
        index = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                   for i in (index if isinstance(index, (tuple, list)) else (index,)))
    return False


def host_reads(run) -> HostReads:
    with recording_graph(), HostReads() as reads:  # recording_graph: no CPU-only check reads back
        run()
    return reads


def test_the_count_sees_each_kind_of_read_back():
    x = torch.arange(6)
    reads = host_reads(lambda: (int(x[1]), bool(x.any()), x.tolist(), x[x > 2], x.nonzero(),
                                torch.multinomial(x.float() + 1, 1), x.repeat_interleave(x),
                                x.repeat_interleave(x, output_size=15), x[:2], x + 1))
    assert reads.count == 7, reads.sites  # all but the given output_size, the slice and the sum


def prompts(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in (3, 6, 1, 5)]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("temperature", [0, 0.9])
def test_generate_reads_nothing_back_per_token(name, temperature, model_of):
    """Padded prompts of one length and ragged ones, greedy and sampled: the reads do not grow with the tokens.
    With an eos id, one read a step, after each token but the last (whether every row has ended)."""
    model = model_of(CASES[name])

    def run(ids, n, **options):
        out = []
        reads = host_reads(lambda: out.append(generate(model, ids, n, temperature=temperature,
                                                       generator=torch.Generator().manual_seed(3), **options)))
        return reads, out[0]
    padded = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(1))
    for ids in (padded, prompts(2)):
        (long, _), (short, _) = run(ids, 16), run(ids, 8)
        assert long.count == short.count, (long.sites, short.sites)
    plain = run(padded, 16)[0].count
    for eos in range(4):  # ids the rows may or may not all reach within 16 tokens
        reads, out = run(padded, 16, eos_token_id=eos)
        picks = out.shape[1] - padded.shape[1]
        assert reads.count - plain == picks - int(picks == 16), reads.sites


@pytest.mark.parametrize("name", list(CASES))
def test_generate_looks_for_the_end_every_8_tokens_off_the_cpu_with_the_same_output(name, model_of, monkeypatch):
    """Off the CPU, whether every row has produced the eos id is read back every ``EOS_CHECK_EVERY`` tokens: the
    loop may run past the end, and what it adds is cut. Checked here as on a GPU: every token's output, padded
    (recurrent, and recomputed in parallel) and ragged, greedy and sampled; eos ids that one row reaches at its
    3rd or 11th token (the batch ends there), and others."""
    model = model_of(CASES[name])
    padded = torch.randint(0, VOCAB, (3, 4), generator=torch.Generator().manual_seed(8))

    def run(ids, eos, temperature, **options):
        return generate(model, ids, 21, temperature=temperature, eos_token_id=eos,
                        generator=torch.Generator().manual_seed(5), **options)
    cut = 0
    for ids, options in ((padded[:1], {}), (padded, {}), (padded[:1], dict(mode="parallel")), (prompts(9)[:1], {}),
                         (prompts(9), {})):
        for temperature in (0, 1.0):
            alone = run(ids[:1], None, temperature, **options)[0][-21:]  # the first row, without an eos id
            for eos in {int(alone[2]), int(alone[10]), 0, 1}:
                want = run(ids, eos, temperature, **options)
                got = []
                with monkeypatch.context() as patch:
                    patch.setattr(generation, "eos_check_every", lambda device: generation.EOS_CHECK_EVERY)
                    reads = host_reads(lambda: got.append(run(ids, eos, temperature, **options)))
                got = got[0]
                same = torch.equal(got, want) if isinstance(want, torch.Tensor) else all(
                    torch.equal(a, b) for a, b in zip(got, want, strict=True))
                assert same, (name, options, temperature, eos, got, want)
                # at most 2 looks at the end (after the 8th and 16th tokens), the cut, and a ragged prefill's offsets
                assert reads.count <= 21 // 8 + 2, reads.sites
                ended = want.shape[1] - ids.shape[1] if isinstance(want, torch.Tensor) else max(map(len, want))
                cut += ended < 21
    assert cut >= 8  # batches that ended early: the loop ran past their end, and the cut mattered


@pytest.mark.parametrize("name", list(CASES))
def test_continuous_batching_reads_back_once_a_step(name, model_of):
    """Four requests in four slots, one greedy, three sampled, of 8 or 16 new tokens: 8 more steps, 8 more reads."""
    model = model_of(CASES[name])

    def run(n):
        requests = [Request(p.tolist(), n, temperature=t, top_k=k, seed=i)
                    for i, (p, t, k) in enumerate(zip(prompts(4), (0, 0.9, 1.3, 0.7), (None, None, 5, None)))]
        return host_reads(lambda: generate_many(model, requests, max_batch=4))
    assert run(16).count - run(8).count == 8, (run(16).sites, run(8).sites)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("temperature", [0, 0.9])
def test_speculative_decoding_reads_back_once_a_round(name, temperature, model_of):
    """Ragged prompts, a two-layer draft of the target: the reads less the rounds do not grow with the tokens."""
    model = model_of(CASES[name])
    draft = draft_from_layers(model, 1)

    def reads_past_rounds(n):
        out = {}
        reads = host_reads(lambda: out.update(stats=speculative_decode(
            model, draft, prompts(5), n, 3, temperature=temperature, generator=torch.Generator().manual_seed(6))[1]))
        assert out["stats"].rounds >= n // 4  # at most 4 tokens a round
        return reads.count - out["stats"].rounds, reads.sites
    (long, long_sites), (short, short_sites) = reads_past_rounds(20), reads_past_rounds(8)
    assert long == short, (long_sites, short_sites)
