"""Rotary toolkit: the shared options (`RotaryConfig`), schedules, application, placement in attention, layouts,
CARoPE, LongRoPE search, data-dependent recurrence angles.

See docs/rotary.md for a guide.
"""
from .apply import LAYOUTS, apply_rotary, check_layout, cos_sin_from_angles, rotary_angles
from .carope import CARoPE, cos_sin_from_phases
from .config import RotaryConfig
from .data_phase import PHASE_INITS, PHASE_MAPS, DataPhase, check_phase_rounding, set_phase_rounding
from .layouts import convert_layout, convert_projection, rotary_permutation
from .longrope_search import SearchResult, longrope_search, seed_candidates
from .module import Rotary
from .placement import PLACEMENTS, RotaryPlacement, parse_placement
from .schedules import ROPE_TYPES, inv_freq

__all__ = [
    "CARoPE", "DataPhase", "LAYOUTS", "PHASE_INITS", "PHASE_MAPS", "PLACEMENTS", "ROPE_TYPES", "Rotary", "RotaryConfig",
    "RotaryPlacement", "SearchResult", "apply_rotary", "check_layout", "convert_layout", "convert_projection",
    "check_phase_rounding", "cos_sin_from_angles", "cos_sin_from_phases", "inv_freq", "longrope_search", "parse_placement",
    "rotary_angles", "rotary_permutation", "seed_candidates", "set_phase_rounding",
]
