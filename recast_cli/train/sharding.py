"""The FSDP engine of ``recast train``: torch's FSDP2 (``fully_shard``) over a 1-D device mesh.

Launched with an accelerate config that says ``distributed_type: FSDP`` and
``fsdp_version: 2`` (``pipelines/accelerate/fsdp.yaml``), the trainer shards the transformer
itself — every transformer block, then the root — over all processes (gloo on CPUs, NCCL on
GPUs); accelerate only starts the processes and the process group. Each parameter becomes a
DTensor holding this process's rows, so the optimizer, the gradient clip and the EMA act on
shards, and a checkpoint gathers every tensor whole: the files are those a single process
writes, and a resume shards them back the way ``fully_shard`` does.
"""

from __future__ import annotations

import os
import sys

import torch



def requested_fsdp() -> int | None:
    """The FSDP version of an ``accelerate launch`` with an FSDP config, None for any other launch."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() != "true":
        return None
    return int(os.environ.get("FSDP_VERSION", "1"))


def shard(network: torch.nn.Module, device: torch.device, blocks: tuple[str, ...] = ()) -> None:
    """``fully_shard`` every block of ``network`` (each module list named in ``blocks``: the family table's,
    recast_cli/policy/families.py), then ``network`` itself, over all processes (in place)."""
    from torch.distributed import get_world_size
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (get_world_size(),))
    for block in (b for name in blocks for b in getattr(network, name, ())):
        fully_shard(block, mesh=mesh)
    fully_shard(network, mesh=mesh)


def _sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor. One exists only once torch.distributed.tensor is loaded, so
    unsharded runs and checkpoint readers are spared its import (about 1.5 s)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (an all-gather: every process calls it, in the same order)."""
    return t.full_tensor() if _sharded(t) else t


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of ``t`` (no communication); ``t`` itself when it is not sharded."""
    return t.to_local() if _sharded(t) else t


def shard_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``whole`` split as ``like`` is (this process's rows of a DTensor; ``whole`` itself otherwise).

    Every process holds ``whole``, so each takes its rows without communication.
    """
    if not _sharded(like):
        return whole.to(like.device, like.dtype)
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole.to(like.device, like.dtype), like.device_mesh, like.placements, src_data_rank=None)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Clip the gradients of sharded parameters to ``max_norm`` by the norm over all shards; returns it."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = full_tensor(torch.nn.utils.get_total_norm(grads))
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return float(norm)
