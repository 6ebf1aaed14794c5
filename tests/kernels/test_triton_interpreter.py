"""hybrid.kernels.triton_interpreter: Triton 3.4 to 3.6's interpreter reads a one-element array as an index as 3.7
does, under NumPy 2.4. Here a stand-in for 3.6's ``_patch_lang_tensor`` (its own line, ``int(self.handle.data)``)
is patched; the real 3.6 interpreter ran the whole kernel suite with it (docs/gpu.md, "torch 2.11 here")."""
import types

import numpy as np
import pytest

triton = pytest.importorskip("triton")
interpreter = pytest.importorskip("triton.runtime.interpreter")

from hybrid.kernels.triton_interpreter import _release, squeeze_index_in_old_interpreters  # noqa: E402


class Scope:
    """Triton 3.6's ``_LangPatchScope``: attributes set for a kernel's run, restored last in, first out."""

    def __init__(self):
        self.changes = []

    def set_attr(self, obj, name, value):
        self.changes.append((obj, name, obj.__dict__.get(name, None)))
        setattr(obj, name, value)

    def restore(self):
        while self.changes:
            obj, name, original = self.changes.pop()
            if original is None:
                delattr(obj, name)
            else:
                setattr(obj, name, original)


def triton_36_patch_lang_tensor(tensor, scope):
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))  # Triton 3.6's line


def triton_35_patch_lang_tensor(tensor):
    tensor.__index__ = lambda self: int(self.handle.data)  # Triton 3.5's line


def a_tensor_class():
    class Tensor:
        def __init__(self, n):
            self.handle = types.SimpleNamespace(data=np.array([n], dtype=np.int32))  # the interpreter's scalars
    return Tensor


def test_release():
    assert _release("3.6.0") == (3, 6) and _release("3.10.1+git8f2c") == (3, 10) and _release("nightly") == (0, 0)


def test_nothing_is_patched_under_a_fixed_triton(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.7.1")
    before = interpreter._patch_lang_tensor
    assert squeeze_index_in_old_interpreters() is False
    assert interpreter._patch_lang_tensor is before


def test_triton_36_reads_a_one_element_array_as_an_index_for_the_run_only(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", triton_36_patch_lang_tensor)
    Tensor = a_tensor_class()
    if tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 4):  # the failure being fixed
        scope = Scope()
        interpreter._patch_lang_tensor(Tensor, scope)
        with pytest.raises(TypeError, match="only 0-dimensional arrays"):
            list(range(Tensor(3)))
        scope.restore()
    assert squeeze_index_in_old_interpreters() is True
    assert squeeze_index_in_old_interpreters() is False  # once a process
    scope = Scope()
    interpreter._patch_lang_tensor(Tensor, scope)
    assert list(range(Tensor(3))) == [0, 1, 2]
    scope.restore()
    assert not hasattr(Tensor, "__index__")  # outside the kernel's run, as the interpreter left it


def test_triton_35_reads_a_one_element_array_as_an_index(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.5.1")
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", triton_35_patch_lang_tensor)
    assert squeeze_index_in_old_interpreters() is True
    Tensor = a_tensor_class()
    interpreter._patch_lang_tensor(Tensor)
    assert list(range(Tensor(4))) == [0, 1, 2, 3]
