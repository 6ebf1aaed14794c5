"""Speculative decoding (models/decoding/speculative.py): greedy output identical to the target decoding alone (every
preset, a smaller draft and the same model with fewer layers, ragged prompts, eos); sampled output distributed as the
target's, counted on a tiny model against its exact distribution with a bound that cannot flake, and the same count
catching two wrong acceptance rules."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from hybrid.models import HybridConfig
from hybrid.models.decoding import speculative
from hybrid.models.decoding.speculative import draft_from_layers, speculative_decode
from hybrid.models.generation import generate
from hybrid.models.sampling import sampling_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB = 23
TINY = dict(d_model=16, n_heads=2, vocab_size=VOCAB)
PRESETS = {
    "hybrid": dict(window=3),
    "transformer": dict(),
    "retnet": dict(),
    "vo-rnn": dict(rnn_selective=True),
}


def target_and_draft(name: str, kind: str, float64_model_of):
    target = float64_model_of(HybridConfig.preset(name, "tiny", **TINY, n_layers=4, **PRESETS[name]))
    if kind == "fewer-layers":
        return target, draft_from_layers(target, 2)
    return target, float64_model_of(HybridConfig.preset(name, "tiny", **TINY, n_layers=1, **PRESETS[name]), seed=1)


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("kind", ["smaller", "fewer-layers"])
def test_greedy_output_is_the_targets_own(name, kind, float64_model_of):
    target, draft = target_and_draft(name, kind, float64_model_of)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in (1, 4, 2, 7)]
    alone = [generate(target, p[None], 9, temperature=0)[0] for p in prompts]
    for lookahead in (1, 3, 5):
        got = generate(target, prompts, 9, temperature=0, draft=draft, lookahead=lookahead)
        assert [t.tolist() for t in got] == [a.tolist() for a in alone], f"lookahead {lookahead}"
    eos = int(alone[1][6])  # a token that the second prompt produces
    got = generate(target, torch.stack([prompts[1], prompts[1]]), 9, temperature=0, draft=draft, eos_token_id=eos)
    want = generate(target, prompts[1][None], 9, temperature=0, eos_token_id=eos)
    assert got.tolist() == [want[0].tolist()] * 2  # a tensor in, a tensor out, padded with eos


def test_global_caches_attend_over_their_longest_row_only(monkeypatch, float64_model_of):
    """A rejected proposal rolls a row's cache back (its length), and each round bounds the caches' span, the slots
    every step attends over, by the longest row, read back with the round's done rows (one read still). Before,
    the span grew by the lookahead + 1 every round: 164 slots for rows of 110 tokens after 100 new tokens."""
    from hybrid.kv_cache import RowKVCache

    target, draft = target_and_draft("transformer", "fewer-layers", float64_model_of)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, VOCAB, (5,), generator=g)]  # one row: its rejections are the batch's
    seen = []  # (span, longest row) at every attention over a global rows cache
    attend = RowKVCache.attend

    def spying(self, k, v, offset):
        if self.window is None:
            seen.append((self.span, int(self.lengths.max())))
        return attend(self, k, v, offset)
    monkeypatch.setattr(RowKVCache, "attend", spying)
    new, stats = speculative_decode(target, draft, prompts, 40, 6, temperature=0.05,  # sharp: drafts rejected
                                    generator=torch.Generator().manual_seed(0))
    assert stats.accepted < stats.proposed and stats.rounds > 5  # rounds with rejections
    assert len(seen) > 50 and all(span == longest for span, longest in seen), seen


def test_a_draft_that_is_the_target_is_always_accepted(float64_model_of):
    target, _ = target_and_draft("hybrid", "smaller", float64_model_of)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4])]
    _, stats = speculative_decode(target, target, prompts, 10, 4, temperature=0)
    assert stats.acceptance_rate == 1.0 and stats.produced == 20 and stats.rounds == 2  # 5 tokens a round


# --- sampling: the output is distributed as the target's -----------------------------------------------------------

V, NEW, N = 4, 3, 20_000  # vocabulary, new tokens, samples: 4³ = 64 outcomes
FALSE_ALARM = 1e-9


def l1_bound(outcomes: int, samples: int, false_alarm: float) -> float:
    """ε with P(‖p̂ − p‖₁ ≥ ε) ≤ false_alarm for the empirical distribution of ``samples`` draws over ``outcomes``
    values: (2^m − 2)·exp(−n ε² / 2) ≤ false_alarm (Weissman et al., 2003)."""
    return math.sqrt(2 * (outcomes * math.log(2) + math.log(1 / false_alarm)) / samples)


@pytest.fixture(scope="module")
def sampling_pair():
    """A tiny target and a draft that disagree strongly (sharp logits: each far from uniform, and from each other)."""
    def model(n_layers: int, seed: int):
        torch.manual_seed(seed)
        from hybrid.models import HybridLM

        m = HybridLM(HybridConfig.preset("hybrid", "tiny", d_model=8, n_heads=2, n_layers=n_layers, vocab_size=V,
                                         window=2)).eval()
        with torch.no_grad():
            m.embed.weight.mul_(10.0)  # tied with the head: logits of a few units (entropy 3.0 of ln 64 = 4.2 nats)
        return m
    return model(3, 0), model(1, 5)


def exact_distribution(target, prompt: torch.Tensor, temperature: float) -> torch.Tensor:
    """P(x1 x2 x3 | prompt) under the target's sampling distribution, (V, V, V), by enumeration."""
    seqs = torch.tensor(list(itertools.product(range(V), repeat=NEW - 1)))  # (V², 2)
    ids = torch.cat([prompt.expand(len(seqs), -1), seqs], dim=1)
    with torch.no_grad():
        logits, _ = target(ids)
    p = sampling_probs(logits[:, len(prompt) - 1:], temperature)  # (V², 3, V): each step's distribution
    first = p[0, 0]  # (V,)
    second = p[:, 1].reshape(V, V, V)[:, 0]  # (V, V): rows x1 (any x2 column gives the same)
    third = p[:, 2].reshape(V, V, V)  # (x1, x2, x3)
    return first[:, None, None] * second[:, :, None] * third


def sampled_distribution(target, draft, prompt, temperature: float, seed: int, samples: int = N) -> torch.Tensor:
    new, _ = speculative_decode(target, draft, [prompt] * samples, NEW, 2, temperature=temperature,
                                generator=torch.Generator().manual_seed(seed))
    codes = torch.stack(new) @ torch.tensor([V * V, V, 1])  # (N,): the outcome of each row
    return torch.bincount(codes, minlength=V ** NEW).double().reshape(V, V, V) / samples


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_output_is_distributed_as_the_targets(temperature, sampling_pair):
    target, draft = sampling_pair
    prompt = torch.tensor([1, 3])
    exact = exact_distribution(target, prompt, temperature).double()
    drafted = exact_distribution(draft, prompt, temperature).double()
    assert (drafted - exact).abs().sum() > 0.5  # the draft alone would be far off
    empirical = sampled_distribution(target, draft, prompt, temperature, seed=11)
    eps = l1_bound(V ** NEW, N, FALSE_ALARM)
    assert (empirical - exact).abs().sum() < eps, f"L1 {float((empirical - exact).abs().sum()):.4f} >= {eps:.4f}"


@pytest.mark.parametrize("wrong", ["residual-is-p", "accept-by-p-alone"])
def test_a_wrong_acceptance_rule_fails_the_count(wrong, sampling_pair, monkeypatch):
    """The count above cannot pass a wrong rule: drawing the rejected position's token from p instead of
    norm(max(0, p − q)), or accepting with probability p(x) instead of min(1, p(x)/q(x)), moves the output
    distribution past the bound (with fewer samples, so a bound twice as loose)."""
    target, draft = sampling_pair
    if wrong == "residual-is-p":
        monkeypatch.setattr(speculative, "residual_distribution", lambda p, q: p)
    else:
        monkeypatch.setattr(speculative, "accepts", lambda p_token, q_token, uniform: uniform < p_token)
    prompt = torch.tensor([1, 3])
    exact = exact_distribution(target, prompt, 1.0).double()
    empirical = sampled_distribution(target, draft, prompt, 1.0, seed=11, samples=N // 4)
    assert (empirical - exact).abs().sum() > l1_bound(V ** NEW, N // 4, FALSE_ALARM)


# --- arguments: checked as generate's, one line naming the argument ------------------------------------------------

def good_arguments(target, draft) -> dict:
    return dict(target=target, draft=draft, prompts=[torch.tensor([1, 2, 3]), torch.tensor([4])], max_new_tokens=5,
                lookahead=2)


@pytest.mark.parametrize("change, match", [
    (dict(lookahead=0), r"^lookahead: expected an int >= 1, got 0$"),
    (dict(lookahead=2.0), r"^lookahead: expected an int >= 1, got 2\.0$"),
    (dict(top_k=0), r"^top_k: expected a positive int or None, got 0$"),
    (dict(temperature=-1.0), r"^temperature: expected a number >= 0, got -1\.0$"),
    (dict(top_p=1.5), r"^top_p: expected a number in \(0, 1\] or None, got 1\.5$"),
    (dict(max_new_tokens=-1), r"^max_new_tokens: expected an int >= 0, got -1$"),
    (dict(prompts=[torch.tensor([1]), torch.tensor([], dtype=torch.long)]),
     r"^prompts\[1\]: expected a prompt of at least one token, got an empty sequence$"),
    (dict(prompts=[]),
     r"^prompts: expected a \(B, T\) tensor or a non-empty list of token sequences, got an empty list$"),
    (dict(prompts=[[1, VOCAB]]),
     rf"^prompts\[0\]: expected token ids in \[0, {VOCAB}\), got values in \[1, {VOCAB}\]$"),
    (dict(prompts=[[1.5, 2.0]]), r"^prompts\[0\]: expected a sequence of int token ids, got torch.float32 values$"),
    (dict(prompts="abc"), r"^prompts: expected a \(B, T\) tensor or a non-empty list of token sequences \(token ids\), "
                          r"got a str"),
    (dict(vocab_limit=VOCAB + 1), rf"^vocab_limit: expected an int >= 1 and <= {VOCAB} or None, got {VOCAB + 1}$"),
    (dict(vocab_limit=10, eos_token_id=12), r"^eos_token_id: expected an int >= 0 and <= 9 or None, got 12$"),
    (dict(prefill_mode="recurrent"), r"^prefill_mode: expected 'parallel' or 'chunked', got 'recurrent'$"),
    (dict(chunk_size=0), r"^chunk_size: expected an int >= 1 or None, got 0$"),
    (dict(draft="small"), r"^draft: expected a HybridLM, got str$"),
])
def test_bad_arguments_are_one_line_errors_naming_them(change, match, model_of):
    target = model_of(HybridConfig.preset("hybrid", "tiny", **TINY, n_layers=2, window=3))
    arguments = {**good_arguments(target, draft_from_layers(target, 1)), **change}
    with pytest.raises(ValueError, match=match):
        speculative_decode(**arguments)


def test_prompts_in_every_form_give_the_targets_tokens(float64_model_of):
    target, draft = target_and_draft("hybrid", "fewer-layers", float64_model_of)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in (3, 1, 6)]
    alone = [generate(target, p[None], 6, temperature=0)[0, len(p):].tolist() for p in prompts]
    for form in ([p.tolist() for p in prompts], [p.int() for p in prompts], tuple(prompts)):
        new, _ = speculative_decode(target, draft, form, 6, 3, temperature=0)
        assert [n.tolist() for n in new] == alone
    new, stats = speculative_decode(target, draft, prompts, 0, 3)
    assert [n.tolist() for n in new] == [[], [], []] and stats.rounds == 0


LENGTH_DEPENDENT = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "factor": 4.0,
                 "original_max_position_embeddings": 8},
}


@pytest.mark.parametrize("rope_type", list(LENGTH_DEPENDENT))
def test_a_length_dependent_rotary_scaling_is_refused(rope_type, model_of):
    """A round reads k + 1 tokens in one forward: under dynamic / longrope scaling its frequencies would be another
    length's than decoding alone, one token a step (the output differed past the schedule's length)."""
    scaled = model_of(HybridConfig.preset("transformer", "tiny", **TINY, n_layers=2,
                                          rope_scaling=LENGTH_DEPENDENT[rope_type]))
    plain = model_of(HybridConfig.preset("transformer", "tiny", **TINY, n_layers=1))
    why = (rf"expected rotary frequencies that do not depend on the call's length \(speculative decoding verifies "
           rf"k \+ 1 tokens a forward, so its output would differ from decoding alone\), got "
           rf"blocks\.0\.mixer\.rotary's {rope_type} scaling$")
    prompts = [torch.tensor([1, 2, 3])]
    with pytest.raises(ValueError, match="^target: " + why):
        speculative_decode(scaled, draft_from_layers(scaled, 1), prompts, 4, 2)
    with pytest.raises(ValueError, match="^draft: " + why):
        speculative_decode(plain, scaled, prompts, 4, 2)
    with pytest.raises(ValueError, match="^model: " + why):
        generate(scaled, prompts, 4, draft=plain)


def test_a_fixed_rotary_scaling_is_decoded_exactly(float64_model_of):
    """YaRN's frequencies are fixed: its speculative output is the target's own."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    target = float64_model_of(HybridConfig.preset("transformer", "tiny", **TINY, n_layers=3, rope_scaling=yarn))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in (2, 11)]
    alone = [generate(target, p[None], 10, temperature=0)[0].tolist() for p in prompts]
    got = generate(target, prompts, 10, temperature=0, draft=draft_from_layers(target, 1), lookahead=4)
    assert [row.tolist() for row in got] == alone
