"""hybrid.checks: each helper accepts the right values (returning them normalised), refuses bools where an int or a
number is expected, and says why in one line: ``"{name}: expected …, got {value!r}"``."""
import math

import numpy as np
import pytest
import torch

from hybrid.checks import (
    check_bool,
    check_choice,
    check_even_dim,
    check_finite,
    check_float_tensor,
    check_heads,
    check_input_dtype,
    check_int,
    check_number,
    check_positive_int,
    check_rotary_base,
    check_sequence_states,
)


def refusal(check, *args, **kwargs) -> str:
    """The message of the ValueError that ``check(*args, **kwargs)`` raises; it must be one line."""
    with pytest.raises(ValueError) as e:
        check(*args, **kwargs)
    message = str(e.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------------ integers


@pytest.mark.parametrize("value", [1, 7, np.int64(3), torch.tensor(2)])
def test_positive_int_accepts_ints_numpy_ints_and_0_dim_integer_tensors(value):
    check_positive_int("n_heads", value)


def test_positive_int_allows_none_only_when_asked():
    check_positive_int("window", None, allow_none=True)
    assert refusal(check_positive_int, "window", None) == "window: expected a positive int, got None"


@pytest.mark.parametrize("value", [True, False, 0, -3, 2.0, "4", torch.tensor(2.0)])
def test_positive_int_refuses_bools_and_everything_not_a_positive_int(value):
    assert refusal(check_positive_int, "n_heads", value) == f"n_heads: expected a positive int, got {value!r}"
    assert refusal(check_positive_int, "window", value, allow_none=True) == \
        f"window: expected a positive int or None, got {value!r}"


def test_int_returns_a_plain_int_within_its_bounds():
    for value in (0, 5, 10, np.int32(4), torch.tensor(3)):
        n = check_int("k", value, low=0, high=10)
        assert n == int(value) and type(n) is int
    assert check_int("k", -7) == -7  # no bounds: any int
    assert check_int("k", None, allow_none=True) is None


@pytest.mark.parametrize("value, kwargs, message", [
    (11, dict(low=0, high=10), "k: expected an int >= 0 and <= 10, got 11"),
    (-1, dict(low=0), "k: expected an int >= 0, got -1"),
    (3, dict(high=2), "k: expected an int <= 2, got 3"),
    (True, dict(low=0), "k: expected an int >= 0, got True"),  # a bool is not a count
    (False, {}, "k: expected an int, got False"),
    (1.5, {}, "k: expected an int, got 1.5"),
    (None, {}, "k: expected an int, got None"),
    (0, dict(low=1, allow_none=True), "k: expected an int >= 1 or None, got 0"),
    (0, dict(low=1, what="a positive int"), "k: expected a positive int, got 0"),
])
def test_int_refuses_in_one_line(value, kwargs, message):
    assert refusal(check_int, "k", value, **kwargs) == message


def test_even_dim_is_an_even_int_of_at_least_two_and_at_most_the_head():
    assert check_even_dim("rotary_dim", 8, at_most=8) == 8 and check_even_dim("rotary_dim", np.int64(2)) == 2
    for value in (0, 3, -2, True, 4.0, "4"):
        assert refusal(check_even_dim, "rotary_dim", value) == \
            f"rotary_dim: expected an even int >= 2 (rotary pairs), got {value!r}"
    assert refusal(check_even_dim, "rotary_dim", 10, at_most=8) == \
        "rotary_dim: expected an even int >= 2 (rotary pairs), at most head_dim=8, got 10"
    assert refusal(check_even_dim, "d", 6, at_most=4, at_most_name="d_head").endswith("at most d_head=4, got 6")


# ------------------------------------------------------------------------------------------ numbers


def test_number_returns_a_float_within_open_or_closed_bounds():
    assert check_number("lr", 3) == 3.0 and type(check_number("lr", 3)) is float
    assert check_number("p", 0.0, low=0, high=1) == 0.0 and check_number("p", 1, low=0, high=1) == 1.0
    assert check_number("x", np.float32(0.5), low=0, low_open=True) == 0.5
    assert check_number("x", None, allow_none=True) is None


@pytest.mark.parametrize("value, kwargs, message", [
    (0, dict(low=0, low_open=True), "lr: expected a number > 0, got 0"),
    (-0.5, dict(low=0), "lr: expected a number >= 0, got -0.5"),
    (1.0, dict(low=0, high=1, high_open=True), "lr: expected a number in [0, 1), got 1.0"),
    (0.0, dict(low=0, high=1, low_open=True), "lr: expected a number in (0, 1], got 0.0"),
    (3, dict(high=2), "lr: expected a number <= 2, got 3"),
    (2, dict(high=2, high_open=True), "lr: expected a number < 2, got 2"),
    (math.nan, {}, "lr: expected a finite number, got nan"),
    (math.inf, dict(low=0), "lr: expected a number >= 0, got inf"),  # never "(0, inf]": inf is no number here
    (True, {}, "lr: expected a finite number, got True"),  # a bool is not a rate (it was once taken as 1)
    ("0.1", {}, "lr: expected a finite number, got '0.1'"),
    (None, {}, "lr: expected a finite number, got None"),
    (-1, dict(low=0, allow_none=True), "lr: expected a number >= 0 or None, got -1"),
])
def test_number_refuses_in_one_line(value, kwargs, message):
    assert refusal(check_number, "lr", value, **kwargs) == message


def test_rotary_base_is_a_finite_number_above_one():
    assert check_rotary_base("rope_base", 10000) == 10000.0 and check_rotary_base("rope_base", 1.5) == 1.5
    for value in (1, 0.5, -2, math.inf, math.nan, True):
        assert refusal(check_rotary_base, "rope_base", value) == f"rope_base: expected a number > 1, got {value!r}"


# ------------------------------------------------------------------------------------------ choices and flags


def test_choice_is_one_of_the_choices():
    check_choice("layout", "half", ("interleaved", "half"))
    check_choice("phase", None, (None, "data"))
    check_choice("k", 2, (1, 2))
    assert refusal(check_choice, "layout", "neox", ("interleaved", "half")) == \
        "layout: expected one of ['interleaved', 'half'], got 'neox'"
    assert refusal(check_choice, "layout", ["half"], ("interleaved", "half")) == \
        "layout: expected one of ['interleaved', 'half'], got ['half']"  # unhashable: refused, not a TypeError


def test_bool_is_true_or_false_only():
    assert check_bool("bias", True) is True and check_bool("bias", False) is False
    for value in (0, 1, "true", None, np.int64(1)):
        assert refusal(check_bool, "bias", value) == f"bias: expected True or False, got {value!r}"


# ------------------------------------------------------------------------------------------ shapes


def test_heads_split_the_width_or_take_the_given_head_size():
    assert check_heads(64, 4) == 16 and check_heads(64, 4, 8) == 8  # an explicit head_dim needs no divisor
    assert check_heads(10, 3, head_dim=4) == 4
    assert refusal(check_heads, 10, 3) == "n_heads: expected a divisor of d_model=10 (or set head_dim), got 3"
    assert refusal(check_heads, 0, 2) == "d_model: expected a positive int, got 0"
    assert refusal(check_heads, 64, True) == "n_heads: expected a positive int, got True"
    assert refusal(check_heads, 64, 4, 0) == "head_dim: expected a positive int, got 0"


# ------------------------------------------------------------------------------------------ tensors


def test_float_tensor_of_the_given_dtypes():
    check_float_tensor("x", torch.zeros(2, dtype=torch.float16))
    check_float_tensor("x", torch.zeros(2), dtypes=(torch.float32, torch.float64))
    assert refusal(check_float_tensor, "x", [1.0]) == "x: expected a float tensor, got list"
    assert refusal(check_float_tensor, "x", torch.zeros(2, dtype=torch.long)) == \
        "x: expected a float tensor, got dtype int64"
    half = torch.zeros(2, dtype=torch.float16)
    assert refusal(check_float_tensor, "x", half, dtypes=(torch.float32, torch.float64)) == \
        "x: expected a tensor of dtype float32, float64, got float16"


def test_finite_counts_what_is_not():
    check_finite("x", torch.randn(3, 4))
    x = torch.tensor([1.0, math.nan, math.inf, -math.inf, 0.0, 2.0])
    assert refusal(check_finite, "x", x) == "x: expected finite values, got 1 NaN and 2 inf among 6 values"
    assert refusal(check_finite, "y", torch.tensor([math.nan])) == "y: expected finite values, got 1 NaN among 1 values"


def test_input_dtype_is_the_parameters_unless_autocast_casts_per_op():
    check_input_dtype("x", torch.zeros(2), torch.float32)
    message = refusal(check_input_dtype, "x", torch.zeros(2, dtype=torch.float64), torch.float32)
    assert message.startswith("x: expected dtype float32 (the module's parameters;") and message.endswith("got float64")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        check_input_dtype("x", torch.zeros(2, dtype=torch.bfloat16), torch.float32)


def test_sequence_states_are_none_or_one_entry_per_sequence():
    seen = []
    assert check_sequence_states(None, 3, seen.append) is None
    assert check_sequence_states([None, None], 2, seen.append) is None and seen == []  # all fresh: None
    assert check_sequence_states((None, "s1"), 2, seen.append) == [None, "s1"] and seen == ["s1"]
    assert refusal(check_sequence_states, [None] * 3, 2, seen.append) == \
        "state: expected None or a list of N=2 per-sequence states with cu_seqlens, got a list of 3"
    assert refusal(check_sequence_states, {"a": 1}, 2, seen.append, what="caches") == \
        "state: expected None or a list of N=2 per-sequence caches with cu_seqlens, got dict"

    def refuse(state):
        raise ValueError(f"state: expected a fresh state, got {state!r}")

    assert refusal(check_sequence_states, [None, "old"], 2, refuse) == "state: expected a fresh state, got 'old'"


def test_a_bool_is_never_a_listed_int():
    with pytest.raises(ValueError, match=r"^k: expected one of \[1, 2\], got True$"):
        check_choice("k", True, (1, 2))
    check_choice("k", True, (True, False))
    check_choice("k", 1, (1, 2))


def test_a_one_element_tensor_is_not_an_int():
    with pytest.raises(ValueError, match=r"^n: expected a positive int, got tensor\(\[2\]\)$"):
        check_positive_int("n", torch.tensor([2]))
    check_positive_int("n", torch.tensor(2))
