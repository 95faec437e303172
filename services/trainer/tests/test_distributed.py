"""Two gloo processes on 127.0.0.1 with DDP: gradients are averaged, parameters stay equal."""

import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agmarl_common.core.features import F_EDGE, F_NODE, F_POD, HeteroGraph
from agmarl_trainer import distributed
from agmarl_trainer.imitation import imitation_loss
from agmarl_trainer.model import NetConfig, PolicyNet
from agmarl_trainer.rollout import Sample

CFG = NetConfig(hidden=8, heads=2, encoder_layers=1, mlp=16)


def samples(seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(4):
        n, e = 6, 4
        g = HeteroGraph(rng.random((n, F_NODE), dtype=np.float32), rng.random((1, F_POD), dtype=np.float32),
                        np.stack([np.arange(n)] * 2), np.zeros((2, 1), np.int64), np.zeros(e, np.int64),
                        rng.choice(n, e, replace=False).astype(np.int64), rng.random((e, F_EDGE), dtype=np.float32),
                        np.full(e, -1))
        out.append(Sample(g, np.array([int(rng.integers(e))])))
    return out


def worker(rank: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    distributed.init(rank, 2, port=port, timeout_s=90.0)
    try:
        torch.manual_seed(0)
        net = PolicyNet(CFG)
        model = distributed.ddp_wrap(net)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        loss, _ = imitation_loss(model, samples(rank))  # different data on each rank
        opt.zero_grad()
        loss.backward()
        grads = {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None}
        opt.step()
        n = distributed.common_count(10 + rank)
        queue.put((rank, {k: v.numpy() for k, v in grads.items()},
                   {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}, n))
    finally:
        distributed.shutdown()


def local_grads(seed: int) -> dict:
    torch.manual_seed(0)
    net = PolicyNet(CFG)
    loss, _ = imitation_loss(net, samples(seed))
    loss.backward()
    return {k: p.grad.clone().numpy() for k, p in net.named_parameters() if p.grad is not None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_average_gradients_and_agree():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    # daemon + terminate in finally: a rank stuck in a collective must fail the test, never hang the run
    procs = [ctx.Process(target=worker, args=(r, port, queue), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict((r, (g, s, n)) for r, g, s, n in (queue.get(timeout=150) for _ in procs))
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
            if p.is_alive():
                p.kill()
    (g0, s0, n0), (g1, s1, n1) = results[0], results[1]
    assert n0 == n1 == 10
    expected = {k: (a + local_grads(1)[k]) / 2 for k, a in local_grads(0).items()}
    for k in expected:
        assert np.allclose(g0[k], g1[k], atol=1e-6)
        assert np.allclose(g0[k], expected[k], atol=1e-5)
    assert any(np.abs(local_grads(0)[k] - local_grads(1)[k]).max() > 1e-4 for k in expected)  # data differed
    for k in s0:
        assert np.array_equal(s0[k], s1[k])
    assert not dist.is_initialized()
