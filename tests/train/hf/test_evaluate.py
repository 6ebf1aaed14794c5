"""hybrid.train.hf.evaluate: unknown task names and the nearest, lm-eval's `pretrained` warning silenced and only it."""
import pytest


def test_check_tasks_without_lm_eval():
    from hybrid.train.hf.evaluate import check_tasks

    class Manager:
        all_tasks = ["hellaswag", "arc_easy", "arc_challenge"]

    check_tasks(Manager(), ["arc_easy"])
    with pytest.raises(ValueError, match=r"unknown 'arc_esay'; did you mean arc_easy\?"):
        check_tasks(Manager(), ["arc_esay"])
    with pytest.raises(ValueError, match=r"--include-path DIR.*`lm-eval ls tasks` lists them"):
        check_tasks(Manager(), ["zzz"])


def test_lm_evals_pretrained_warning_is_silenced_and_only_it(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]' in the hybrid checkout); it is not in the "
                                          "test extra: it pulls scikit-learn and friends")
    pytest.importorskip("accelerate", reason="lm-eval's HFLM needs accelerate (pip install -e '.[eval]' in the hybrid checkout)")
    import logging

    import lm_eval
    import torch

    import hybrid.train.hf.evaluate as ev
    from hybrid.models import HybridConfig, HybridLM
    from hybrid.train.loop.checkpoint import capture_rng_state, save_checkpoint
    from hybrid.train.data.tokenizer import ByteTokenizer

    config = HybridConfig.preset("transformer", d_model=32, n_layers=2, n_heads=2, vocab_size=320)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "run", model_state=HybridLM(config).state_dict(), config=config.to_dict(),
                    optimizer_state=None, scheduler_state=None, rng_state=capture_rng_state(), data_state=None,
                    step=0, extra={"tokenizer": ByteTokenizer().to_dict()})
    monkeypatch.setattr(ev, "task_manager", lambda tasks, include_path=None: None)  # no task index: fast
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **kwargs: {"results": {}})
    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("lm_eval.models.huggingface")
    handler = Collect(level=logging.DEBUG)
    logger.addHandler(handler)
    try:
        assert ev.evaluate(tmp_path / "run", ["anything"]) == {"results": {}}
        logger.warning("another warning")  # the filter is gone after the call, and only ever took that message
    finally:
        logger.removeHandler(handler)
    assert not any("`pretrained` model kwarg is not of type `str`" in m for m in seen), seen
    assert "another warning" in seen
