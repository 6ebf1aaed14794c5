"""One reader of a checkpoint's model (hybrid.train.loop.saved_model): load_run, load_task_run and --init-from rebuild
a model, or refuse it, the same way."""
import json

import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.loop.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from hybrid.train.lm.inference import load_run
from hybrid.train.loop.init_from import load_init
from hybrid.train.loop.saved_model import checkpoint_config, checkpoint_model
from hybrid.train.tasks import make_task
from hybrid.train.tasks.train import TASK_FILE, load_task_run
from hybrid.train.data.tokenizer import ByteTokenizer


def save(run_dir, model: HybridLM, config: dict | None = None):
    task = make_task("parity")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / TASK_FILE).write_text(json.dumps(task.to_json()))
    save_checkpoint(run_dir, model_state=model.state_dict(), config=config or model.config.to_dict(),
                    optimizer_state=None, scheduler_state=None, rng_state=None, data_state=None, step=3,
                    extra={"tokenizer": ByteTokenizer().to_dict()})


def tiny(**overrides) -> HybridLM:
    torch.manual_seed(0)
    shape = {"d_model": 32, "n_layers": 1, "n_heads": 2, "vocab_size": 320, **overrides}
    return HybridLM(HybridConfig.preset("transformer", "tiny", **shape))


def test_every_reader_rebuilds_the_saved_model(tmp_path):
    model = tiny()
    save(tmp_path / "run", model)
    rebuilt = checkpoint_model(load_checkpoint(tmp_path / "run"))
    assert not rebuilt.training and rebuilt.config == model.config
    for name, tensor in model.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], tensor), name
    run, (task_model, _) = load_run(tmp_path / "run"), load_task_run(tmp_path / "run")
    assert run.model.config == task_model.config == load_init(tmp_path / "run").config == model.config
    assert checkpoint_config(load_checkpoint(tmp_path / "run")) == model.config


def test_every_reader_refuses_a_bad_config_or_weights_alike(tmp_path):
    bad_config = {**tiny().config.to_dict(), "d_model": -1}
    save(tmp_path / "config", tiny(), config=bad_config)
    save(tmp_path / "weights", tiny(), config=tiny(n_layers=2).config.to_dict())
    for reader in (load_run, lambda d: load_task_run(d), lambda d: load_init(d)):
        with pytest.raises(CheckpointError, match=r"config\.json: is not a valid model config \(d_model: expected"):
            reader(tmp_path / "config")
    for reader in (load_run, lambda d: load_task_run(d)):
        with pytest.raises(CheckpointError, match=r"checkpoint file .*: weights do not fit the model config"):
            reader(tmp_path / "weights")
