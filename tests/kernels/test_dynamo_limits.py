"""recompile_room: Dynamo's recompile limit raised inside, never lowered, restored after; failing at the limit
on request (the compiled decode step's recording) instead of running eagerly."""
import torch
import torch._dynamo

from hybrid.kernels.dynamo_limits import recompile_room
from hybrid.kernels.window_attention.flex import _room_to_recompile


def test_the_limit_is_raised_inside_and_restored_after():
    config = torch._dynamo.config
    before, failing = config.recompile_limit, config.fail_on_recompile_limit_hit
    with recompile_room(before + 56):
        assert config.recompile_limit == before + 56 and config.fail_on_recompile_limit_hit == failing
    with recompile_room(1, fail_at_limit=True):
        assert config.recompile_limit == before and config.fail_on_recompile_limit_hit  # never lowered
    assert (config.recompile_limit, config.fail_on_recompile_limit_hit) == (before, failing)


def test_flex_attention_room_is_left_to_an_enclosing_compile():
    @torch.compile(backend="eager", fullgraph=True)
    def inside(x):
        with _room_to_recompile():
            return x + 1

    assert inside(torch.ones(2)).tolist() == [2.0, 2.0]
    with _room_to_recompile():
        assert torch._dynamo.config.recompile_limit >= 64
