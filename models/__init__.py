"""Models: HybridConfig with presets, HybridLM (three modes, one state), generation, CompiledBlocks (regional
compilation for training)."""
from .compiled import CompiledBlocks
from .config import PRESETS, SIZES, HybridConfig
from .lm import HybridLM
from .modes import MODES
from .sampling import sample_next
from .state import HybridState

__all__ = ["CompiledBlocks", "HybridConfig", "HybridLM", "HybridState", "MODES", "PRESETS", "SIZES", "sample_next"]
