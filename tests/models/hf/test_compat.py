"""Each transformers-release difference guarded in hybrid.models.hf.compat, checked against the installed release."""
import inspect

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install 'hybrid-lm[hf]')")

import transformers  # noqa: E402
from packaging.version import Version  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from transformers.cache_utils import Cache  # noqa: E402

from hybrid.models.hf import HybridCache, compat  # noqa: E402


def test_cache_init_flag_matches_the_installed_cache_and_our_cache_builds():
    assert compat.CACHE_INIT_TAKES_LAYERS == ("layers" in inspect.signature(Cache.__init__).parameters)
    cache = HybridCache()
    assert isinstance(cache, Cache) and cache.get_seq_length() == 0 and cache.batch_size == -1


def test_rope_parameters_flag_matches_where_the_installed_config_keeps_rope_theta():
    config = LlamaConfig(rope_theta=1234.0) if not compat.ROPE_PARAMETERS else LlamaConfig(
        rope_parameters={"rope_type": "default", "rope_theta": 1234.0})
    has_parameters = isinstance(getattr(config, "rope_parameters", None), dict)
    assert compat.ROPE_PARAMETERS == has_parameters
    from hybrid.models.hf.convert import config_from_llama
    rotary = config_from_llama(config).rotary  # reads the rotary base from where this release keeps it
    assert (rotary.base, rotary.scaling) == (1234.0, None)


def test_version_outside_the_tested_range_is_refused(monkeypatch):
    assert compat.MIN_VERSION <= Version(transformers.__version__) < compat.MAX_VERSION
    monkeypatch.setattr(compat, "TRANSFORMERS_VERSION", Version("4.40.0"))
    with pytest.raises(ImportError, match=r"transformers: expected a release in \[5.0, 6.0\).*got"):
        compat.check_version()


def test_generate_cache_keyword_is_the_one_generate_hands_to_prepare_inputs(monkeypatch):
    """The flag names the keyword under which generate passes the cache on (and checks a caller's cache)."""
    import torch

    from hybrid.models.hf import HybridForCausalLM, HybridHFConfig

    model = HybridForCausalLM(HybridHFConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, pattern="R")).eval()
    seen = []
    prepare = type(model).prepare_inputs_for_generation
    monkeypatch.setattr(type(model), "prepare_inputs_for_generation",
                        lambda self, input_ids, **kw: seen.append(set(kw)) or prepare(self, input_ids, **kw))
    model.generate(torch.ones(1, 3, dtype=torch.long), max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert all(compat.GENERATE_CACHE_KWARG in names for names in seen[1:]) and len(seen) == 2
