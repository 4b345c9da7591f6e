"""Where the host time of a training step through ``handoff.torch_function`` goes.

The host-bound MLP step of ``bench/train_three_way.py`` (``x @ w1 + b1`` in PyTorch, a
JAX layer norm + gelu + matmul through ``handoff.torch_function``, a mean-square loss,
SGD), run under ``cProfile``: the functions with the most time of their own, per step.
A jitted JAX call is a C++ object, so its dispatch counts as time of the Python function
that calls it (``forward_vjp``, ``backward``). Also, without the profiler, ms per step of
the same step in pure PyTorch and through handoff, and handoff's per-step Python phases
timed by hand. JSON lines.

    python bench/profile_step.py [--device cuda|cpu] [--dtype f32|bf16] [--steps 3000]
"""

import cProfile
import pstats
import sys

import harness  # beside this script, in bench/ and in the GPU bundle
from harness import emit


def layer_jax(h, gamma, beta, w2):
    """The MLP's JAX layer (train_three_way.py's): layer norm + gelu + matmul."""
    import jax
    import jax.numpy as jnp

    hf = h.astype(jnp.float32)
    mu = hf.mean(-1, keepdims=True)
    var = ((hf - mu) ** 2).mean(-1, keepdims=True)
    z = (hf - mu) * jax.lax.rsqrt(var + 1e-5) * gamma.astype(jnp.float32) + beta.astype(jnp.float32)
    return jax.nn.gelu(z, approximate=True).astype(h.dtype) @ w2


def layer_torch(h, gamma, beta, w2):
    """The same layer in PyTorch."""
    import torch

    hf = h.float()
    mu = hf.mean(-1, keepdim=True)
    var = ((hf - mu) ** 2).mean(-1, keepdim=True)
    z = (hf - mu) * torch.rsqrt(var + 1e-5) * gamma.float() + beta.float()
    return torch.nn.functional.gelu(z, approximate="tanh").to(h.dtype) @ w2


def main():
    ap = harness.parser()
    harness.layer_args(ap, steps=3000)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import torch

    import handoff

    tdt, batch, dim = harness.layer_setup(torch, args)
    dev = args.device

    g = torch.Generator(device=dev).manual_seed(0)
    init = [
        torch.randn(dim, dim, device=dev, generator=g) / dim**0.5,
        torch.randn(dim, device=dev, generator=g) * 0.1,
        1 + 0.1 * torch.randn(dim, device=dev, generator=g),
        0.1 * torch.randn(dim, device=dev, generator=g),
        torch.randn(dim, dim, device=dev, generator=g) / dim**0.5,
    ]
    x = torch.randn(batch, dim, device=dev, generator=g).to(tdt)
    tgt = torch.randn(batch, dim, device=dev, generator=g)
    sync = harness.device_sync(torch, dev == "cuda")

    def make_step(layer):
        params = [p.detach().to(tdt, copy=True).requires_grad_() for p in init]
        opt = torch.optim.SGD(params, lr=1e-3, foreach=True)

        def step():
            w1, b1, gamma, beta, w2 = params
            loss = (layer(x @ w1 + b1, gamma, beta, w2).float() - tgt).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    fn = handoff.torch_function(layer_jax)
    torch_step, handoff_step = make_step(layer_torch), make_step(fn)
    rows = {}
    for _ in range(2):  # in turns, so drift hits both
        rows.setdefault("torch", []).append(harness.median_ms(torch_step, args.steps, warmup=200, sync=sync))
        rows.setdefault("handoff", []).append(harness.median_ms(handoff_step, args.steps, warmup=200, sync=sync))
    emit(figure="step", device=dev, dtype=args.dtype, size=args.size, routes=handoff.routes(),
         torch_ms=round(min(rows["torch"]), 4), handoff_ms=round(min(rows["handoff"]), 4),
         ratio=round(min(rows["handoff"]) / min(rows["torch"]), 3))

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        handoff_step()
    sync()
    prof.disable()
    stats = pstats.Stats(prof)
    entries = []
    for (file, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        where = f"{file.rsplit('/', 2)[-1]}:{line}({name})" if file != "~" else name
        entries.append((tottime, cumtime, ncalls, where))
    entries.sort(reverse=True)
    total = sum(e[0] for e in entries)
    emit(figure="profile_total", us_per_step=round(total * 1e6 / args.steps, 1),
         note="under cProfile (slower than without)")
    for tottime, cumtime, ncalls, where in entries[: args.top]:
        emit(figure="profile", function=where, calls_per_step=round(ncalls / args.steps, 2),
             own_us_per_step=round(tottime * 1e6 / args.steps, 2),
             cum_us_per_step=round(cumtime * 1e6 / args.steps, 2))


if __name__ == "__main__":
    main()
    sys.exit(0)
