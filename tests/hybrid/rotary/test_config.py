"""RotaryConfig (hybrid/rotary/config.py): the rotary options every mixer shares, checked on construction, naming
the field, and `check_with` for the scaling's fit to a mixer's rotary dimension."""
import dataclasses

import pytest

from hybrid.rotary import RotaryConfig

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


def test_defaults_and_immutability():
    c = RotaryConfig()
    assert (c.base, c.scaling, c.layout, c.carope) == (10000.0, None, "interleaved", False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.base = 500.0
    assert dataclasses.replace(c, layout="half").layout == "half"
    assert RotaryConfig(base=500.0, scaling=YARN, layout="half") == RotaryConfig(500.0, dict(YARN), "half")


@pytest.mark.parametrize("kwargs,match", [
    (dict(base=1.0), r"^base: expected a number > 1, got 1.0$"),
    (dict(base=float("inf")), r"^base: expected a number > 1, got inf$"),
    (dict(base="10000"), r"^base: expected a number > 1, got '10000'$"),
    (dict(scaling="yarn"), r"^scaling: expected a dict or None, got str$"),
    (dict(layout="split"), r"^layout: expected one of \['interleaved', 'half'\], got 'split'$"),
    (dict(carope=1), r"^carope: expected True or False, got 1$"),
    (dict(carope=True, scaling={"rope_type": "linear", "factor": 2.0}),
     r"^carope: CARoPE has no context-extension scaling; expected scaling=None with carope=True, got "),
])
def test_errors_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryConfig(**kwargs)


def test_check_with_validates_the_scaling_for_a_rotary_dimension():
    RotaryConfig().check_with(7)  # no scaling: nothing to check
    RotaryConfig(scaling=YARN).check_with(8)
    long = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 32,
            "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    RotaryConfig(scaling=long).check_with(8)  # one factor per pair: 8 channels, 4 pairs
    with pytest.raises(ValueError, match=r"^scaling\['short_factor'\] must hold dim/2 = 6 "):  # named once
        RotaryConfig(scaling=long).check_with(12)
    with pytest.raises(ValueError, match=r"^scaling\['rope_type'\]: expected one of "):
        RotaryConfig(scaling={"rope_type": "wobbly"}).check_with(8)
