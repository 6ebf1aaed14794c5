"""The complex scan's policy on non-finite inputs (docs/design.md, "Non-finite inputs to the scan"):

- ``x`` (and ``initial_state``) are not checked: a NaN or inf propagates like in every torch op, into the
  state of its own pair from its own step on, and nowhere else. Checking would cost a device sync per call.
- ``log_decay`` and ``theta`` are checked (``check_values=True``, the default): a NaN or positive log-decay, or
  a NaN / inf angle, is a ValueError naming the argument, because it would silently corrupt every later state
  of every sequence that shares it. ``log_decay = -inf`` (γ = 0, forget everything) is allowed.
- ``check_values=False`` (models whose decay and angles are valid by construction) skips that check: then the
  caller answers for them.

Only the public ``hybrid.kernels`` entry points are used, on the backends every machine has.
"""
import pytest
import torch

from hybrid.kernels import complex_scan, complex_scan_step

BACKENDS = ["torch", "reference"]
B, T, H, D = 2, 7, 3, 6  # sizes that are not powers of two


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H, D, generator=g)
    log_decay = -torch.rand(H, D // 2, generator=g) * 0.3
    theta = torch.rand(H, D // 2, generator=g)
    return x, log_decay, theta


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nonfinite_x_propagates_into_its_own_pair_from_its_step_on(backend, bad):
    x, log_decay, theta = inputs()
    b, t, h, pair = 1, 3, 2, 1
    x[b, t, h, 2 * pair] = bad  # the real part of one rotary pair of one head at one step
    y, state = complex_scan(x, log_decay, theta, output_final_state=True, backend=backend)  # no error
    nonfinite = ~torch.isfinite(y)
    assert nonfinite[b, t:, h, 2 * pair:2 * pair + 2].any(dim=-1).all()  # that pair, from that step on
    expected = torch.zeros_like(nonfinite)
    expected[b, t:, h, 2 * pair:2 * pair + 2] = True
    assert not (nonfinite & ~expected).any()  # nothing else: no other step, pair, head or sequence
    assert not torch.isfinite(state[b, h, 2 * pair:2 * pair + 2]).all() and torch.isfinite(state[0]).all()


def test_a_nonfinite_initial_state_is_not_checked_either():
    x, log_decay, theta = inputs()
    initial = torch.zeros(B, H, D)
    initial[0, 0, 0] = float("nan")
    y, _ = complex_scan(x, log_decay, theta, initial_state=initial, backend="torch")
    assert torch.isnan(y[0, :, 0, :2]).any(dim=-1).all() and torch.isfinite(y[1]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, value, message", [
    ("log_decay", float("nan"), r"log_decay: expected values <= 0 .*got 1 NaN"),
    ("log_decay", 0.25, r"log_decay: expected values <= 0 .*got a maximum of 0.25"),
    ("theta", float("nan"), r"theta: expected finite angles, got 1 NaN"),
    ("theta", float("inf"), r"theta: expected finite angles, got 0 NaN and 1 inf"),
])
def test_a_bad_decay_or_angle_is_refused_naming_it(backend, name, value, message):
    x, log_decay, theta = inputs()
    args = {"log_decay": log_decay, "theta": theta}
    args[name][1, 2] = value
    with pytest.raises(ValueError, match=message):
        complex_scan(x, args["log_decay"], args["theta"], backend=backend)
    with pytest.raises(ValueError, match=message.replace(name, name + "_t", 1)):
        complex_scan_step(x[:, 0], args["log_decay"], args["theta"], None)


def test_minus_infinity_log_decay_is_a_decay_of_zero():
    x, log_decay, theta = inputs()
    log_decay[:] = -float("inf")  # γ = 0: each state is its own input
    y, _ = complex_scan(x, log_decay, theta, backend="torch")
    torch.testing.assert_close(y, x)


def test_check_values_false_leaves_the_decay_and_angles_to_the_caller():
    x, log_decay, theta = inputs()
    theta[0, 0] = float("nan")
    y, _ = complex_scan(x, log_decay, theta, backend="torch", check_values=False)  # no sync, no check
    assert torch.isnan(y[:, :, 0, :2]).all() and torch.isfinite(y[:, :, 1:]).all()
