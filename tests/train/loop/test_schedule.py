"""Learning-rate schedule: warmup, cosine decay, floor, and exact resume through LambdaLR."""
import math

import pytest
import torch

from hybrid.train.loop.schedule import WarmupCosine, lr_at, warmup_cosine


def test_lr_at_shape():
    kw = dict(lr=1e-3, warmup=10, total=110, min_lr=1e-4)
    assert lr_at(0, **kw) == pytest.approx(1e-4)
    assert lr_at(9, **kw) == pytest.approx(1e-3)  # warmup ends at full lr
    assert lr_at(10, **kw) == pytest.approx(1e-3)
    assert lr_at(60, **kw) == pytest.approx(0.5 * (1e-3 + 1e-4))  # half way through the cosine
    assert lr_at(110, **kw) == pytest.approx(1e-4) and lr_at(10_000, **kw) == pytest.approx(1e-4)
    warm = [lr_at(s, **kw) for s in range(10)]
    decay = [lr_at(s, **kw) for s in range(10, 111)]
    assert warm == sorted(warm) and decay == sorted(decay, reverse=True)
    assert lr_at(60, lr=1.0, warmup=10, total=110) == pytest.approx(0.55)  # min_lr defaults to 0.1 lr
    assert lr_at(5, lr=1.0, warmup=0, total=10, min_lr=0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))


@pytest.mark.parametrize("warmup,total", [(-1, 10), (11, 10), (0, 0)])
def test_bad_arguments(warmup, total):
    with pytest.raises(ValueError, match="warmup"):
        lr_at(0, lr=1.0, warmup=warmup, total=total, min_lr=0.0)
    with pytest.raises(ValueError):
        WarmupCosine(warmup, total)


def _opt():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.SGD([{"params": [a], "lr": 1e-2}, {"params": [b], "lr": 1e-3}])


def test_lambda_lr_follows_lr_at_for_every_group():
    opt = _opt()
    sched = warmup_cosine(opt, warmup=5, total=40, min_lr_ratio=0.2)
    for step in range(50):
        for group, base in zip(opt.param_groups, (1e-2, 1e-3)):
            assert group["lr"] == pytest.approx(lr_at(step, lr=base, warmup=5, total=40, min_lr=0.2 * base))
        opt.step()
        sched.step()


def test_resume_from_state_dict_continues_the_same_schedule():
    opt = _opt()
    sched = warmup_cosine(opt, warmup=5, total=40)
    for _ in range(17):
        opt.step()
        sched.step()
    state, opt_state = sched.state_dict(), opt.state_dict()
    expected = []
    for _ in range(10):
        expected.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()

    opt2 = _opt()
    sched2 = warmup_cosine(opt2, warmup=1, total=2)  # whatever it is built with, the saved schedule wins
    opt2.load_state_dict(opt_state)  # the trainer's order: optimizer, then scheduler
    sched2.load_state_dict(state)
    got = []
    for _ in range(10):
        got.append([g["lr"] for g in opt2.param_groups])
        opt2.step()
        sched2.step()
    assert sum(got, []) == pytest.approx(sum(expected, []), rel=1e-12)
    assert sched2.lr_lambdas[0] == WarmupCosine(5, 40)


def test_set_total_restretches_the_cosine_from_the_current_step():
    """A total changed mid-run (a resume with a new --steps, Trainer.set_total_steps): the steps taken keep their
    rates, the step about to run and every later one get the new schedule's."""
    opt = _opt()
    sched = warmup_cosine(opt, warmup=5, total=40)
    for _ in range(12):
        opt.step()
        sched.step()
    sched.set_total(100)
    for step in range(12, 110):
        for group, base in zip(opt.param_groups, (1e-2, 1e-3)):
            assert group["lr"] == pytest.approx(lr_at(step, lr=base, warmup=5, total=100, min_lr=0.1 * base))
        opt.step()
        sched.step()
    sched.set_total(120, warmup=10, lr=5e-4)  # a resume may also change the warmup and the peak rate
    assert sched.base_lrs == [5e-4, 5e-4] and [g["initial_lr"] for g in opt.param_groups] == [5e-4, 5e-4]
    assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(110, lr=5e-4, warmup=10, total=120, min_lr=5e-5))
    assert sched.state_dict()["lr_lambdas"][0] == {"warmup": 10, "total": 120, "min_lr_ratio": 0.1}
    with pytest.raises(ValueError, match="warmup"):
        sched.set_total(5)  # shorter than the warmup
