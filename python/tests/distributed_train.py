"""One process of ``test_distributed.py``: trains the model of ``test_torch_compile.py``
(two PyTorch Linears around a ``handoff.torch_function`` layer) with gloo on the CPU,
wrapped in DDP or FSDP2 (``fully_shard``), eager or under ``torch.compile``, on this
rank's half of each batch, and saves the trained parameters (full, gathered) and the
graph breaks counted.

    python distributed_train.py RANK WORLD PORT ddp|fsdp2 eager|compiled OUT
"""

import sys

import jax
import jax.numpy as jnp  # noqa: F401
import torch
import torch.distributed as dist

import handoff

STEPS = 10
BATCH = 8


def ln_gelu_matmul(h, gamma, beta, w):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    z = (h - mu) * jax.lax.rsqrt(var + 1e-5) * gamma + beta
    return jax.nn.gelu(z, approximate=True) @ w


class Model(torch.nn.Module):
    """Linear -> a JAX layer (layer norm, gelu, matmul; its own unless given) -> Linear.
    ``test_torch_compile.py`` trains it too."""

    def __init__(self, layer=None, d_in=16, d=32, d_out=8):
        super().__init__()
        self.layer = layer or handoff.torch_function(ln_gelu_matmul)
        self.inp = torch.nn.Linear(d_in, d)
        self.gamma = torch.nn.Parameter(torch.ones(d))
        self.beta = torch.nn.Parameter(torch.zeros(d))
        self.w = torch.nn.Parameter(torch.randn(d, d) * d**-0.5)
        self.out = torch.nn.Linear(d, d_out)

    def forward(self, x):
        return self.out(self.layer(self.inp(x), self.gamma, self.beta, self.w))


def data():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(BATCH, 16, generator=g) for _ in range(STEPS)]


def train(model, step, batches, rank=0, world=1):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    part = BATCH // world
    for x in batches:
        opt.zero_grad(set_to_none=True)
        step(x[rank * part:(rank + 1) * part]).square().mean().backward()
        opt.step()


def reference():
    """Single-process training on the whole batches: the parameters to match."""
    torch.manual_seed(0)
    model = Model()
    train(model, model, data())
    return {k: v.detach() for k, v in model.state_dict().items()}


def main():
    rank, world, port, wrap, how, out = sys.argv[1:7]
    rank, world = int(rank), int(world)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Model()
    # The model compiled inside the wrapper: the wrappers' own code (DDP's forward, its
    # hooks; FSDP2's) stays eager, so every graph break counted is the model's.
    inner = torch.compile(model, backend="aot_eager") if how == "compiled" else model
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        step = DistributedDataParallel(inner)
    else:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
        step = inner
    train(model, step, data(), rank, world)
    params = model
    state = {}
    for k, v in params.state_dict().items():
        state[k] = v.full_tensor() if hasattr(v, "full_tensor") else v.detach()
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    if rank == 0:
        torch.save({"state": state, "graph_breaks": breaks, "executions": model.layer.executions}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
