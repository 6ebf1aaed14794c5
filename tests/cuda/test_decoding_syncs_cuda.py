"""The decoding loops' host syncs on the GPU, as ``torch.cuda.set_sync_debug_mode`` counts them: ``generate`` none per
token (greedy or sampled; with an eos id one every 8 tokens), continuous batching one a step, speculative decoding
one a round; and ``draw`` gives ``torch.multinomial``'s ids from a CUDA generator bit for bit. (The CPU counts the
same reads at the Python level: tests/models/decoding/test_host_reads.py.) Host values reach the device without the
host waiting for the queued kernels (``to_device``: a wait that ``set_sync_debug_mode`` does not report)."""
import pytest
import torch

from hybrid.kernels.host_copies import on_device, to_device
from hybrid.models import HybridConfig, HybridLM
from hybrid.models.decoding.decoder import Request, generate_many
from hybrid.models.decoding.speculative import draft_from_layers, speculative_decode
from hybrid.models.generation import generate
from hybrid.models.sampling import draw
from hybrid.train.bench.gpu_check.part_correctness import count_syncs

VOCAB = 29


@pytest.fixture(autouse=True)
def blocked_windows(monkeypatch):
    """The windows by the blocked backend: on FlexAttention every new packing of the prompts (each admission of
    the continuous batch) could compile its kernel again, seconds of device time each, for syncs that are the
    prefill's, not the loop's."""
    monkeypatch.setenv("HYBRID_WINDOW_BACKEND", "blocked")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = HybridConfig.preset("hybrid", "tiny", d_model=32, n_heads=2, n_layers=3, vocab_size=VOCAB, window=4)
    return HybridLM(config).cuda().eval()


def prompts(cuda):
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, VOCAB, (n,), generator=g).to(cuda) for n in (3, 6, 1, 5)]


def syncs(run) -> list[str]:
    run()  # first calls fill caches (rotary tables, kernels' tuning)
    torch.cuda.synchronize()
    return count_syncs(run)


def test_draw_is_torch_multinomials_draw(cuda):
    for seed in range(6):
        probs = torch.softmax(3 * torch.randn(5, 1000, device=cuda), -1)
        probs[:, ::3] = 0.0
        mine = torch.Generator(device=cuda).manual_seed(seed)
        theirs = torch.Generator(device=cuda).manual_seed(seed)
        assert torch.equal(draw(probs, mine), torch.multinomial(probs, 1, generator=theirs)[:, 0])
        assert torch.equal(mine.get_state(), theirs.get_state())


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_generate_syncs_not_per_token(cuda, model, temperature):
    ids = torch.randint(0, VOCAB, (3, 5), device=cuda)
    for batch in (ids, prompts(cuda)):
        counts = {n: syncs(lambda: generate(model, batch, n, temperature=temperature)) for n in (8, 16)}
        assert len(counts[16]) == len(counts[8]), counts


def test_generate_looks_for_the_end_every_8_tokens(cuda, model):
    """With an eos id: a look every ``EOS_CHECK_EVERY`` tokens (after the 8th and the 16th of 24) and the cut's
    one read at the end, however many rows end."""
    ids = torch.randint(0, VOCAB, (3, 5), device=cuda)
    plain = syncs(lambda: generate(model, ids, 24, temperature=0.9))
    for eos in range(4):
        with_eos = syncs(lambda: generate(model, ids, 24, temperature=0.9, eos_token_id=eos))
        assert len(with_eos) - len(plain) <= 24 // 8 + 1, (plain, with_eos)


def test_continuous_batching_syncs_once_a_step(cuda, model):
    def run(n):
        requests = [Request(p.tolist(), n, temperature=t, seed=i) for i, (p, t) in
                    enumerate(zip(prompts(torch.device("cpu")), (0, 0.9, 1.3, 0.7)))]
        return syncs(lambda: generate_many(model, requests, max_batch=4))
    short, long = run(8), run(16)
    assert len(long) - len(short) == 8, (short, long)


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_speculative_decoding_syncs_once_a_round(cuda, model, temperature):
    draft = draft_from_layers(model, 1)

    def past_rounds(n):
        rounds = []
        sites = syncs(lambda: rounds.append(speculative_decode(model, draft, prompts(cuda), n, 3,
                                                               temperature=temperature)[1].rounds))
        return len(sites) - rounds[-1], sites
    (short, short_sites), (long, long_sites) = past_rounds(8), past_rounds(20)
    assert long == short, (short_sites, long_sites)


def test_host_values_reach_the_device_while_the_gpu_is_busy(cuda):
    """Queued behind about 0.1 s of GPU work, the copies return at once: the work is still running after them."""
    batch = torch.randint(0, VOCAB, (16, 4096))
    for queued in (0, 200_000_000):  # the first round fills the pinned allocator's cache (its cudaHostAlloc)
        torch.cuda.synchronize()
        torch.cuda._sleep(queued)  # that many GPU clock cycles
        busy = torch.cuda.Event()
        busy.record()
        rows, ids = on_device([3, 1, 4], cuda), to_device(batch, cuda)
        if queued:
            assert not busy.query(), "the host waited for the GPU's queued work"
        torch.cuda.synchronize()
        assert rows.tolist() == [3, 1, 4] and torch.equal(ids.cpu(), batch)
