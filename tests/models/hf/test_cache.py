"""HybridCache (models/hf/cache.py): our recurrent states as a transformers Cache — flat memory for a windowed
hybrid, row operations (beam search) that gather every state tensor, select_rows."""
import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from hybrid.models.hf import HybridCache  # noqa: E402
from hybrid.models.hf.cache import select_rows  # noqa: E402
from hybrid.models.hf.compat import GENERATE_CACHE_KWARG  # noqa: E402

# the models (make, ids_for: conftest.py): a windowed hybrid, global attention, and a GQA + CARoPE + untied variant


def test_cache_memory_is_flat_for_a_windowed_hybrid_and_grows_for_global_attention(make, ids_for):
    sizes = {}
    for name in ("hybrid", "transformer"):
        model = make(name)
        for n in (4, 16):
            cache = HybridCache()
            out = model.generate(ids_for(2, 6), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                 return_dict_in_generate=True, **{GENERATE_CACHE_KWARG: cache})
            assert getattr(out, GENERATE_CACHE_KWARG) is cache and cache.get_seq_length() == 6 + n - 1
            sizes[name, n] = cache.nbytes
    assert sizes["hybrid", 4] == sizes["hybrid", 16] > 0
    assert sizes["transformer", 16] > sizes["transformer", 4]


def test_cache_row_operations_gather_every_state_tensor(make, ids_for):
    model = make("hybrid-gqa-carope-untied")
    ids = ids_for(3, 5)
    cache = HybridCache()
    model(ids, past_key_values=cache)
    cache.batch_repeat_interleave(2)  # rows 0 0 1 1 2 2
    cache.batch_select_indices(torch.tensor([5, 0, 3]))  # rows 2 0 1
    cache.reorder_cache(torch.tensor([2, 2, 0]))  # rows 1 1 2
    nxt = ids_for(3, 1, seed=9)
    logits = model(nxt, past_key_values=cache).logits[:, -1]
    order = torch.tensor([1, 1, 2])
    expected = model.model(torch.cat([ids[order], nxt], 1))[0][:, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    _, state = model.model(ids)
    picked = select_rows(state, torch.tensor([2]))
    assert picked.layers[0].scan.shape[0] == 1 and state.layers[0].scan.shape[0] == 3

