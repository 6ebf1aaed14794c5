"""The ranks of a torchrun job as a 2-D mesh, data parallel × context parallel (torchtitan's ``dp`` × ``cp``).

    mesh = build_mesh(env, cp=2, device=device)    # WORLD_SIZE 4: 2 data-parallel groups of 2 context ranks
    mesh.dp_rank, mesh.dp_size                     # which sequences this rank reads (its data-parallel place)
    mesh.cp_group                                  # the ranks that share each of those sequences

Rank ``r`` sits at ``(r // cp, r % cp)``: the ``cp`` ranks of one sequence are neighbours (on one node when the
job's ranks fill nodes in order, so the carries and halos stay on its links). The data is laid out over the
``dp`` axis only (``hybrid.train.parallel.sharding``); each rank of a ``cp`` group reads the same sequences and
keeps its shard of them (``hybrid.kernels.context_parallel.shard_sequence``). Gradients are averaged over every
rank of the job (DDP or FSDP2 over the whole world, torchtitan's flattened ``dp_shard_cp``): the LM stage scales
each rank's share of the global token mean by ``cp`` so that this average is the mean over the ``dp`` groups of
each group's gradient (``hybrid.train.lm.stage``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .distributed import DistEnv

__all__ = ["ParallelMesh", "build_mesh"]


@dataclass(frozen=True)
class ParallelMesh:
    """This rank's place on the data × context mesh. ``cp_group`` is None when ``cp_size == 1``; ``device_mesh``
    the ``DeviceMesh`` (None on one process)."""

    dp_rank: int = 0
    dp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    cp_group: object = None
    device_mesh: object = None

    def describe(self) -> str:
        """``"2 data × 2 context"``, for the start message."""
        return f"{self.dp_size} data × {self.cp_size} context"


def build_mesh(env: DistEnv, cp: int, device: torch.device) -> ParallelMesh:
    """The mesh of ``env``'s job with ``cp`` ranks per sequence; a one-line ValueError when ``WORLD_SIZE`` does not
    divide into groups of ``cp``."""
    if env.world_size % cp:
        raise ValueError(f"cp: expected a divisor of WORLD_SIZE={env.world_size} (the ranks form WORLD_SIZE / cp "
                         f"data-parallel groups of cp ranks), got {cp}")
    if not env.distributed:
        return ParallelMesh()
    from torch.distributed.device_mesh import init_device_mesh

    dp = env.world_size // cp
    mesh = init_device_mesh(device.type, (dp, cp), mesh_dim_names=("dp", "cp"))
    return ParallelMesh(dp_rank=mesh.get_local_rank("dp"), dp_size=dp, cp_rank=mesh.get_local_rank("cp"),
                        cp_size=cp, cp_group=mesh.get_group("cp") if cp > 1 else None, device_mesh=mesh)
