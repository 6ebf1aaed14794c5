"""Differences between transformers releases, each behind one named flag (tests/models/hf/test_compat.py).

Tested range: transformers >= 5.0, < 6 (the ``hf`` extra).
"""
from __future__ import annotations

import dataclasses
import inspect

import transformers
from packaging.version import Version
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast

TRANSFORMERS_VERSION = Version(transformers.__version__)
MIN_VERSION, MAX_VERSION = Version("5.0"), Version("6.0")

# transformers 4.56 reworked Cache into a list of layer objects: Cache(layers=...) instead of Cache().
CACHE_INIT_TAKES_LAYERS = "layers" in inspect.signature(Cache.__init__).parameters
# transformers 5 renamed `rope_scaling` + `rope_theta` to one `rope_parameters` dict holding both.
ROPE_PARAMETERS = TRANSFORMERS_VERSION >= Version("5.0")
# transformers 5.2x renamed generate's cache keyword `past_key_values` to `cache`: generate then hands the cache to
# prepare_inputs_for_generation, and checks the caller's keywords against it, under this name.
GENERATE_CACHE_KWARG = ("cache" if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
                        else "past_key_values")

# transformers 5.2x also renamed the model output's cache field to `cache` (the old name still works, with a
# deprecation warning on every decoding step): outputs carry the cache under this name.
OUTPUT_CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


def check_version() -> None:
    """Refuse a transformers release outside the tested range, naming it."""
    if not MIN_VERSION <= TRANSFORMERS_VERSION < MAX_VERSION:
        raise ImportError(
            f"transformers: expected a release in [{MIN_VERSION}, {MAX_VERSION}) for hybrid.models.hf, "
            f"got {transformers.__version__}; pip install 'hybrid-lm[hf]' (or -e '.[hf]' in the checkout)"
        )
