"""`hybrid.computed_buffers`: a buffer computed from a module's options survives the meta device and ``to_empty``."""
import pytest
import torch
from torch import nn

from hybrid import VORecurrence
from hybrid.rotary import Rotary
from hybrid.computed_buffers import WithComputedBuffers, register_computed_buffer, restore_computed_buffers


class Schedule(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        register_computed_buffer(self, "angles", torch.linspace(0.0, 1.0, n, dtype=torch.float64, device="cpu"))


def test_a_buffer_built_on_the_meta_device_is_written_back_after_to_empty_in_its_dtype():
    with torch.device("meta"):
        outer = nn.Sequential(Schedule(7), nn.Sequential(Schedule(5)))
    assert outer[0].angles.is_meta
    outer = outer.to(torch.float32).to_empty(device="cpu")
    restore_computed_buffers(outer)
    for module, n in ((outer[0], 7), (outer[1][0], 5)):
        assert module.angles.dtype == torch.float32
        assert torch.equal(module.angles, torch.linspace(0.0, 1.0, n, dtype=torch.float64).float())
    assert "angles" not in outer.state_dict()  # non-persistent: no checkpoint holds it


def test_the_buffer_goes_to_the_default_device_and_its_host_value_is_its_own_copy():
    value = torch.arange(3.0)
    module = nn.Module()
    register_computed_buffer(module, "b", value)
    value.add_(1.0)  # the caller's tensor changing later changes neither
    with torch.no_grad():
        module.b.zero_()
    restore_computed_buffers(module)
    assert torch.equal(module.b, torch.arange(3.0))


def test_a_value_off_the_host_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^value: expected a tensor computed on the host .* got one on meta$"):
        register_computed_buffer(nn.Module(), "b", torch.zeros(2, device="meta"))


class Moved(WithComputedBuffers):
    def __init__(self):
        super().__init__()
        register_computed_buffer(self, "angles", torch.linspace(0.0, 1.0, 9, dtype=torch.float64, device="cpu"))


def test_a_module_with_computed_buffers_writes_them_back_after_each_move_inside_any_model():
    with torch.device("meta"):
        outer = nn.Sequential(nn.Linear(3, 3), nn.Sequential(Moved()))
    outer.to_empty(device="cpu")  # no restore_computed_buffers call: the module's own move does it
    assert torch.equal(outer[1][0].angles, torch.linspace(0.0, 1.0, 9, dtype=torch.float64))
    outer.to(torch.bfloat16).to(torch.float64)
    assert torch.equal(outer[1][0].angles, torch.linspace(0.0, 1.0, 9, dtype=torch.float64))


def test_the_library_s_layers_built_on_the_meta_device_compute_as_built_directly():
    """A building block in a model of one's own: R (its angles) and a Rotary (its frequencies)."""
    torch.manual_seed(0)
    direct = nn.ModuleDict({"r": VORecurrence(32, 2), "rope": Rotary(16)})
    with torch.device("meta"):
        built = nn.ModuleDict({"r": VORecurrence(32, 2), "rope": Rotary(16)})
    built.to_empty(device="cpu")
    built.load_state_dict(direct.state_dict())
    x = torch.randn(2, 21, 32)
    torch.testing.assert_close(built["r"](x)[0], direct["r"](x)[0], rtol=0, atol=0)
    q = torch.randn(2, 21, 4, 16)
    torch.testing.assert_close(built["rope"](q, offset=5), direct["rope"](q, offset=5), rtol=0, atol=0)
