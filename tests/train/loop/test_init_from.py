"""--init-from with --init-partial (hybrid.train.loop.init_from): a hybrid started from a transformer's weights."""
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train import TrainConfig, Trainer, load_checkpoint
from hybrid.train.loop.checkpoint import capture_rng_state, save_checkpoint
from hybrid.train.loop.init_from import copy_matching, modules_of


def transformer_run(path):
    config = HybridConfig.preset("transformer", d_model=32, n_layers=3, n_heads=2, vocab_size=259)
    torch.manual_seed(0)
    model = HybridLM(config)
    save_checkpoint(path, model_state=model.state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0,
                    extra={"tokenizer": {"kind": "bytes"}})
    return model.state_dict()


def partial(tmp_path, corpus, **kw):
    return TrainConfig(init_from=str(tmp_path / "src"), data=str(corpus), steps=1, lr=1e-9, warmup=0, seq_len=16,
                       batch_size=2, eval_every=0, eval_batches=1, save_every=0, device="cpu",
                       out=str(tmp_path / "hyb"), **kw)


def test_a_hybrid_starts_from_a_transformers_matching_weights(tmp_path, corpus):
    source = transformer_run(tmp_path / "src")
    trainer = Trainer(partial(tmp_path, corpus, init_partial=True, model={"pattern": "RRA"}), verbose=0,
                      progress=False)
    trainer.fit()
    state = load_checkpoint(tmp_path / "hyb").model_state
    assert trainer.model_config.layer_types == "RRA"
    shared = [k for k in state if k in source and state[k].shape == source[k].shape]
    assert any(k.startswith("blocks.2.mixer.") for k in shared)  # the attention layer at the A position
    assert not any(k.startswith(("blocks.0.mixer.", "blocks.1.mixer.")) and ".mixer.q_proj" in k for k in shared)
    for key in shared:  # one AdamW step of lr 1e-9 moves each copied weight by ~1e-9
        assert (state[key] - source[key]).abs().max() < 1e-7, key
    fresh = [k for k in state if k.startswith("blocks.0.mixer.") and k not in source]
    assert fresh, "the R mixers are new weights"
    assert any("copied" in note and "initialised" in note for note in trainer.notes)


def test_without_init_partial_a_changed_model_is_refused_with_the_way_out(tmp_path, corpus):
    transformer_run(tmp_path / "src")
    with pytest.raises(ValueError, match="init_from: the weights of .* do not fit .*--init-partial"):
        Trainer(partial(tmp_path, corpus, model={"pattern": "RRA"}), verbose=0, progress=False).fit()


def test_init_partial_needs_init_from_and_some_weight_that_fits(tmp_path, corpus):
    with pytest.raises(ValueError, match="init_partial: expected together with init_from"):
        TrainConfig(init_partial=True)
    transformer_run(tmp_path / "src")
    with pytest.raises(ValueError, match="init_partial: no weight of .* fits"):
        Trainer(partial(tmp_path, corpus, init_partial=True, model={"d_model": 64, "vocab_size": 300}), verbose=0,
                progress=False).fit()


def test_copy_matching_reports_what_it_copied_left_and_ignored():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    state = {"0.weight": torch.ones(4, 3), "1.weight": torch.ones(5, 4), "extra.bias": torch.ones(1)}
    copied, fresh, unused = copy_matching(model, state)
    assert copied == ["0.weight"] and torch.equal(model[0].weight, torch.ones(4, 3))
    assert fresh == ["0.bias", "1.bias", "1.weight"] and unused == ["1.weight", "extra.bias"]
    assert modules_of(fresh) == "0, 1" and modules_of([]) == "none"
