"""Triton 3.4 to 3.6's CPU interpreter (``TRITON_INTERPRET=1``) under NumPy 2.4 and newer.

Those interpreters turn a tensor used as a Python integer (the runtime bound of ``for i in range(n)``) into one
with ``int(handle.data)``, where ``data`` is a one-element 1-d array. NumPy 2.4 refuses that ("only
0-dimensional arrays can be converted to Python scalars"), so every kernel with such a loop failed to interpret:
every kernel of the complex scan. Triton 3.7 squeezes the array first. ``squeeze_index_in_old_interpreters``
gives the older interpreters that same line; it changes nothing under Triton 3.7 and newer. Triton 3.6 is the
release torch 2.11 installs, the lent GPU machines' (docs/gpu.md): with this, the CPU tests and the GPU check's
``--dry-run`` run the kernels under the device's Triton release too.
"""
from __future__ import annotations

import re

__all__ = ["squeeze_index_in_old_interpreters"]

FIXED_IN = (3, 7)  # the first Triton whose interpreter squeezes the array


def _release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``"3.6.0"`` or ``"3.6.0+git1234"``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def squeeze_index_in_old_interpreters() -> bool:
    """Make the interpreter of a Triton older than 3.7 read a one-element array as an integer as 3.7 does. Returns
    True when it patched (once a process), False when this Triton needs nothing or has no interpreter."""
    try:
        import triton
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "squeezes_index", False) or _release(triton.__version__) >= FIXED_IN:
        return False

    def as_index(self) -> int:
        return int(self.handle.data.squeeze())

    def patch_lang_tensor(tensor, *scope):
        original(tensor, *scope)
        if scope:  # Triton 3.6: patched for the kernel's run, restored after it (last in, first out)
            scope[0].set_attr(tensor, "__index__", as_index)
        else:  # Triton 3.4 and 3.5 set it for good
            tensor.__index__ = as_index

    patch_lang_tensor.squeezes_index = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True
