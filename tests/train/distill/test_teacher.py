"""The teacher (hybrid.train.distill.teacher): any run directory loads frozen with its tokenizer record and the
hash of its weights; what is not a teacher is refused in one line naming --teacher."""
import pytest
import torch

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.loop.checkpoint import capture_rng_state, load_checkpoint, save_checkpoint
from hybrid.train.distill.teacher import load_teacher
from hybrid.train.data.tokenizer import ByteTokenizer


def write_run(path, *, tokenizer=True, dtype="float32"):
    config = HybridConfig.preset("transformer", d_model=16, n_layers=2, n_heads=2, vocab_size=300, dtype=dtype)
    torch.manual_seed(0)
    model = HybridLM(config)
    save_checkpoint(path, model_state=model.state_dict(), config=config.to_dict(), optimizer_state=None,
                    scheduler_state=None, rng_state=capture_rng_state(), data_state=None, step=0,
                    extra={"tokenizer": ByteTokenizer().to_dict()} if tokenizer else {})
    return model


def test_a_run_directory_loads_frozen_with_its_tokenizer_and_weights_hash(tmp_path):
    model = write_run(tmp_path / "tf")
    for where in (tmp_path / "tf", tmp_path / "tf" / "checkpoint"):  # the run or its checkpoint directory
        teacher = load_teacher(where, "cpu")
        assert teacher.path == (tmp_path / "tf").resolve()
        assert not teacher.model.training and not any(p.requires_grad for p in teacher.model.parameters())
        assert teacher.config.layer_types == "AA" and teacher.tokenizer == ByteTokenizer().to_dict()
        sha = load_checkpoint(tmp_path / "tf").manifest["files"]["model.safetensors"]["sha256"]
        assert len(teacher.sha256) == 64 and teacher.sha256 == sha
        ids = torch.randint(0, 300, (2, 11))
        torch.testing.assert_close(teacher.model(ids)[0], model.eval()(ids)[0], rtol=0, atol=0)


@pytest.mark.parametrize("case, message", [
    ("missing", "--teacher: expected a run directory (with checkpoint/), got "),
    ("no tokenizer", "--teacher: expected a checkpoint with a tokenizer record"),
    ("float16", "--teacher: expected a float32 or bfloat16 model, got float16"),
])
def test_what_is_not_a_teacher_is_refused_in_one_line(tmp_path, case, message):
    if case == "no tokenizer":
        write_run(tmp_path / "run", tokenizer=False)
    elif case == "float16":
        write_run(tmp_path / "run", dtype="float16")
    with pytest.raises(ValueError) as e:
        load_teacher(tmp_path / "run", "cpu")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
