"""HybridHFConfig (models/hf/configuration.py): wraps a HybridConfig losslessly, saves and loads through
AutoConfig, reads configs saved with the old flat fields, refuses bad values."""
import json

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]' in the hybrid checkout)")

from transformers import AutoConfig  # noqa: E402

from hybrid.models import HybridConfig  # noqa: E402
from hybrid.models.hf import HybridHFConfig  # noqa: E402

V = 53
TINY = dict(d_model=32, n_layers=3, n_heads=2, vocab_size=V)
GQA_CAROPE_UNTIED = HybridConfig.preset("hybrid", **{**TINY, "n_heads": 4}, window=4, n_kv_heads=2, carope=True,
                                        tie_embeddings=False)


def test_config_wraps_hybrid_config_losslessly(tmp_path):
    cfg = GQA_CAROPE_UNTIED.replace(rope_base=5000.0, meta={"preset": "hybrid", "note": [1, 2]})
    hf = HybridHFConfig(cfg)
    assert hf.to_hybrid_config() == cfg
    assert HybridHFConfig(cfg.to_dict()).to_hybrid_config() == cfg
    assert (hf.vocab_size, hf.hidden_size, hf.num_hidden_layers, hf.tie_word_embeddings) == (V, 32, 3, False)
    hf.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).to_hybrid_config() == cfg
    scaled = HybridConfig.preset("transformer", **TINY, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                      "original_max_position_embeddings": 16})
    scaled_hf = HybridHFConfig(scaled)
    scaled_hf.save_pretrained(tmp_path / "s")
    assert HybridHFConfig.from_pretrained(tmp_path / "s").to_hybrid_config() == scaled


def test_config_saved_with_flat_fields_still_loads(tmp_path):
    """A config.json written before the config sections holds the old flat names under "hybrid"."""
    cfg = GQA_CAROPE_UNTIED
    HybridHFConfig(cfg).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    saved["hybrid"] = {name: getattr(cfg, name) for name in HybridConfig.field_names() if "." not in name}
    assert "window" in saved["hybrid"] and "attention" not in saved["hybrid"]
    path.write_text(json.dumps(saved))
    assert AutoConfig.from_pretrained(tmp_path).to_hybrid_config() == cfg


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="hybrid: expected a HybridConfig"):
        HybridHFConfig(hybrid=3)
    with pytest.raises(ValueError, match="n_heads"):
        HybridHFConfig({"d_model": 30, "n_heads": 4})

