"""Training across processes and machines: torch.distributed (gloo) + DistributedDataParallel.

Every rank runs the whole pipeline on its own rollouts (seed + rank: different episodes), gradients are
averaged by DDP at every step, so every rank holds the same weights; rank 0 writes the files.
Steps per phase are made equal across ranks (``common_count``), or a rank would wait for ever.

Launch (one command per machine; the rendezvous host is any of them, port open between them):

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank <0|1> \\
             --rdzv-backend c10d --rdzv-endpoint <host0>:29500 --rdzv-id agmarl-train \\
             -m agmarl_trainer.cli --distributed --config configs/train/default.yaml --out models/<name>

On one machine: ``torchrun --standalone --nproc-per-node 2 -m agmarl_trainer.cli --distributed ...``.
torchrun sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; ``init_from_env`` reads them (the only
place environment variables are read, at the edge). Rollout worker processes (``workers``) still run
inside each rank.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def init_from_env(backend: str = "gloo", timeout_s: float = 600.0) -> tuple[int, int]:
    """Join the process group described by torchrun's environment; returns (rank, world size)."""
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def init(rank: int, world: int, addr: str = "127.0.0.1", port: int = 29500, backend: str = "gloo",
         timeout_s: float = 120.0) -> None:
    """Join a process group explicitly (tests, notebooks).

    On a loopback rendezvous gloo is told to use the loopback interface: left alone, it picks the
    interface the machine's hostname resolves to, which may not exist or be reachable (CI sandboxes).
    """
    if addr in ("127.0.0.1", "localhost", "::1"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback_ifname())
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def _loopback_ifname() -> str:
    """Name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    return next((n for n in names if n.startswith("lo")), "lo")


def ddp_wrap(net: torch.nn.Module) -> torch.nn.Module:
    """The module wrapped for gradient averaging; identity when no process group is running."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return net
    # the critic is unused during imitation, the actor's attention path in some batches
    return DistributedDataParallel(net, find_unused_parameters=True)


def common_count(n: int) -> int:
    """The smallest ``n`` over all ranks (n itself without a process group)."""
    if not dist.is_initialized():
        return n
    t = torch.tensor([n], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def broadcast_params(net: torch.nn.Module, src: int = 0) -> None:
    """Make every rank's parameters equal to rank ``src``'s."""
    if not dist.is_initialized():
        return
    for p in net.state_dict().values():
        dist.broadcast(p, src)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))
