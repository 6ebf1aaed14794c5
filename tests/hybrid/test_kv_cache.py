"""KVCache and RingKVCache against plain records of the entries written (fresh random inputs, odd sizes): ring
wrap-around, in-place writes without autograd and out-of-place ones under it, copy on write of a shared global
cache, and the error for continuing a window state that is no longer the newest; a fixed-capacity RowKVCache
against a growing one."""
from __future__ import annotations

import pytest
import torch

from hybrid.attention import Attention
from hybrid.kv_cache import KVCache, RingKVCache, RowKVCache

B, G, D = 2, 3, 5
SIZES = [1, 4, 2, 9, 1, 3]  # entries per update: single tokens, chunks, one longer than any window below

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors (tests/conftest.py)


def entries(T: int, seed: int, requires_grad: bool = False) -> torch.Tensor:
    """Fresh keys or values `(B, T, G, D)`, float64."""
    t = torch.randn(B, T, G, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return t.requires_grad_(requires_grad)


def exact(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------ KVCache


@pytest.mark.parametrize("shared", [False, True])
def test_from_prefix_copies_with_room(shared):
    k, v = entries(3, 1), None if shared else entries(3, 2)
    cache = KVCache.from_prefix(k, v, capacity=7)
    assert cache.filled == 3 and cache.k.shape == (B, 7, G, D)
    exact(cache.keys, k)
    assert (cache.values is None) == shared and (shared or torch.equal(cache.values, v))
    k.zero_()  # a copy: the caller's tensor is not the storage
    assert cache.keys.abs().sum() > 0
    assert KVCache.from_prefix(entries(3, 3), None).k.shape[1] == 3  # no capacity: exactly the prefix
    assert KVCache.from_prefix(entries(3, 3), None, capacity=1).k.shape[1] == 3  # never less than the prefix


@pytest.mark.parametrize("shared", [False, True])
def test_appends_equal_the_concatenation_in_place_without_autograd(shared):
    cache = KVCache.from_prefix(entries(0, 0), None if shared else entries(0, 0), capacity=2)
    written_k, written_v = [], []
    for i, T in enumerate(SIZES):
        k, v = entries(T, 10 + i), None if shared else entries(T, 50 + i)
        capacity = cache.k.shape[1]
        assert cache.update(k, v) is cache  # in place
        written_k.append(k)
        written_v.append(v)
        filled = sum(SIZES[: i + 1])
        assert cache.filled == filled and filled <= cache.k.shape[1] <= max(2 * capacity, filled)  # geometric growth
        exact(cache.keys, torch.cat(written_k, dim=1))
        if shared:
            assert cache.values is None and cache.v is None
        else:
            exact(cache.values, torch.cat(written_v, dim=1))


def test_an_in_place_append_leaves_earlier_views_valid():
    """Appending writes past `filled` (or into a new buffer when it grows): entries read before stay as they were."""
    first = entries(4, 1)
    cache = KVCache.from_prefix(first, None, capacity=5)
    before = cache.keys  # a view of the buffer
    cache.update(entries(1, 2), None)  # fits: same buffer
    exact(before, first)
    buffer = cache.k
    cache.update(entries(3, 3), None)  # grows: a new buffer, the old one untouched
    assert cache.k.data_ptr() != buffer.data_ptr()
    exact(before, first)
    exact(buffer[:, :4], first)


@pytest.mark.parametrize("grad_on", ["new", "stored"])
def test_under_autograd_an_update_is_out_of_place_and_differentiable(grad_on):
    old = entries(3, 1, requires_grad=grad_on == "stored")
    cache = KVCache(old, old, 3) if grad_on == "stored" else KVCache.from_prefix(old, old, capacity=8)
    new = entries(2, 2, requires_grad=grad_on == "new")
    grown = cache.update(new, new)
    assert grown is not cache and cache.filled == 3 and grown.filled == 5  # the old cache is left as it was
    exact(cache.keys, old)
    exact(grown.keys, torch.cat([old, new], dim=1))
    leaf = new if grad_on == "new" else old
    (grad,) = torch.autograd.grad((grown.keys + 2 * grown.values).sum(), leaf)
    exact(grad, torch.full_like(leaf, 3.0))
    with torch.no_grad():  # autograd records nothing: in place again
        assert cache.update(new, new) is cache


def test_a_global_cache_is_copied_on_write_by_an_older_state():
    """States of one stream share a KVCache; the newest appends in place, an older one branches into a copy, and
    both still hold exactly their own tokens' keys (without autograd), while under autograd nothing is shared."""
    torch.manual_seed(0)
    attn = Attention(12, 3, placement="qkvo").double()
    x = torch.randn(1, 6, 12, dtype=torch.float64)
    alt = torch.randn(1, 12, dtype=torch.float64)
    with torch.no_grad():
        _, s3 = attn(x[:, :3])
        _, s4 = attn.step(x[:, 3], s3, 3)
        assert s4.cache is s3.cache and s4.cache.filled == 4  # the newest state appended in place
        _, b4 = attn.step(alt, s3, 3)  # s3 is older now: copy on write
        assert b4.cache is not s3.cache and s4.cache.filled == 4
        _, s5 = attn.step(x[:, 4], s4, 4)
        _, ref = attn(x[:, :5])
        _, ref_b = attn(torch.cat([x[:, :3], alt[:, None]], dim=1))
    for got, want in ((s5.k, ref.k), (s5.v, ref.v), (b4.k, ref_b.k), (b4.v, ref_b.v), (s3.k, ref.k[:, :3])):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)  # step and forward round differently
    _, g3 = attn(x[:, :3])  # under autograd
    _, g4 = attn.step(x[:, 3], g3, 3)
    assert g4.cache is not g3.cache and g3.cache.filled == 3


# -------------------------------------------------------------------------------------- RingKVCache


def slot_positions(end: int, window: int) -> list[int]:
    """The largest position p < end with p ≡ s (mod window), for each slot s, by search."""
    return [max(p for p in range(end - window, end) if p % window == s) for s in range(window)]


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("start", [0, 4])
@pytest.mark.parametrize("window", [1, 3, 5])
def test_ring_holds_the_last_window_and_wraps_around(window, start, shared):
    ring = RingKVCache.empty(entries(1, 0), window, shared, end=start)
    assert ring.window == window and ring.end == start and not ring.k.any() and (ring.v is None) == shared
    written_k, written_v = {}, {}  # position -> (B, G, D)
    for i, T in enumerate(SIZES):
        k, v = entries(T, 10 + i), None if shared else entries(T, 50 + i)
        assert ring.update(k, v) is ring  # in place
        for t in range(T):
            written_k[ring.end - T + t] = k[:, t]
            if not shared:
                written_v[ring.end - T + t] = v[:, t]
        assert ring.end == start + sum(SIZES[: i + 1])
        assert ring.positions().tolist() == slot_positions(ring.end, window)
        for s, p in enumerate(ring.positions().tolist()):
            if p >= start:  # written (before `start` a slot holds zeros)
                exact(ring.k[:, s], written_k[p])
                if not shared:
                    exact(ring.v[:, s], written_v[p])
        for n in range(1, min(window, ring.end - start) + 1):
            last_k, last_v = ring.last(n)
            exact(last_k, torch.stack([written_k[p] for p in range(ring.end - n, ring.end)], dim=1))
            if shared:
                assert last_v is None
            else:
                exact(last_v, torch.stack([written_v[p] for p in range(ring.end - n, ring.end)], dim=1))


def test_ring_stores_in_its_own_dtype():
    ring = RingKVCache.empty(entries(1, 0).float(), 3, False, end=0)
    k = entries(2, 1)  # float64 entries into a float32 ring
    ring.update(k, k)
    assert ring.k.dtype == torch.float32
    exact(ring.last(2)[0], k.float())


def test_ring_under_autograd_is_out_of_place_and_differentiable():
    ring = RingKVCache.empty(entries(1, 0), 4, True, end=0)
    ring.update(entries(3, 1), None)
    stored = ring.k.clone()
    new = entries(2, 2, requires_grad=True)  # positions 3 and 4: slot 0 (position 0) is overwritten
    moved = ring.update(new, None)
    assert moved is not ring and ring.end == 3 and moved.end == 5
    exact(ring.k, stored)
    exact(moved.last(2)[0], new)
    (grad,) = torch.autograd.grad(moved.k.sum(), new)
    exact(grad, torch.ones_like(new))


def test_a_stale_window_state_is_refused():
    """Writing position p overwrites p − w, so only the newest state on a ring continues; an older one (or its
    clone) is refused in one line pointing at clone(), and a clone taken before continuing branches freely."""
    torch.manual_seed(0)
    attn = Attention(12, 3, placement="qkvo", window=3).double()
    x = torch.randn(1, 7, 12, dtype=torch.float64)
    with torch.no_grad():
        _, s5 = attn(x[:, :5])
        spare = s5.clone()
        _, s6 = attn.step(x[:, 5], s5, 5)
        assert s6.cache is s5.cache and s6.cache.end == 6
        for stale in (s5, s5.clone()):
            with pytest.raises(ValueError, match=r"^state: expected the newest state of its window cache \(at "
                                                 r"position 6\), got one at position 5; clone\(\) a state"):
                attn.step(x[:, 6], stale, 5)
        y, _ = attn.step(x[:, 6], spare, 5)  # the clone continues position 5 with another token
        ref, _ = attn(torch.cat([x[:, :5], x[:, 6:7]], dim=1))
    torch.testing.assert_close(y, ref[:, -1], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------ RowKVCache, fixed


def test_a_fixed_global_rows_cache_attends_over_its_capacity_and_grows_past_it():
    """`fix(capacity)` (what a CUDA-graph decode step records): every call attends over all the slots, the
    unwritten ones masked, so the keys' shape stays; each row's entries and mask are the growing cache's, padded;
    past the capacity the buffer grows as before."""
    lengths = torch.tensor([3, 1])
    growing = RowKVCache(entries(4, 0), entries(4, 1), lengths.clone(), None, 4)
    fixed = RowKVCache(entries(4, 0), entries(4, 1), lengths.clone(), None, 4)
    fixed.fix(7)
    assert fixed.k.shape[1] == 7 and fixed.keys.shape[1] == 7 and fixed.fixed
    for t, T in enumerate([1, 1, 1, 2, 1]):  # single tokens, a chunk, then past the capacity of 7
        k, v = entries(T, 10 + t), entries(T, 20 + t)
        offset = growing.lengths.clone()
        want_k, want_v, want_mask = growing.attend(k, v, offset)
        got_k, got_v, got_mask = fixed.attend(k, v, offset)
        S = want_k.shape[1]
        assert got_k.shape[1] == fixed.k.shape[1] >= max(7, S)
        assert not got_mask[:, :, S:].any()  # the unwritten slots are masked
        exact(got_mask[:, :, :S], want_mask)
        for b in range(B):  # every slot a row may attend to holds the growing cache's entry
            n = int(growing.lengths[b])
            exact(got_k[b, :n], want_k[b, :n])
            exact(got_v[b, :n], want_v[b, :n])
        assert fixed.span == growing.span
    assert fixed.k.shape[1] > 7  # grown past the capacity (geometrically, as `reserve` grows)


def test_fixing_a_geometrically_grown_global_cache_shrinks_it_to_the_capacity():
    """A buffer grown to twice its entries would make every fixed step read them all: `fix` resizes exactly."""
    cache = RowKVCache(entries(4, 0), entries(4, 1), torch.tensor([4, 2]), None, 4)
    cache.reserve(5)  # grows geometrically, to 8
    assert cache.k.shape[1] == 8
    cache.fix(6)
    assert cache.k.shape[1] == cache.v.shape[1] == 6 and cache.keys.shape[1] == 6
    exact(cache.k[:, :4], entries(4, 0))
    exact(cache.v[:, 4:], torch.zeros(B, 2, G, D, dtype=torch.float64))
    cache.fix(3)  # never below the entries held
    assert cache.k.shape[1] == 4
