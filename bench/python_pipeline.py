"""The pipeline of examples/pipeline.rs in Python, for the side-by-side benchmark.

One model step: h = x @ w (PyTorch), y = gelu(layernorm(h)) (an XLA kernel compiled by
JAX), x = x + y (PyTorch residual). Variants:

  torch      pure PyTorch, same math
  interop    torch -> jax.dlpack.from_dlpack -> jitted kernel -> torch.from_dlpack
             (the DLPack stream protocol: what Python interop costs today)
  jax        the whole step in one jax.jit (what fusion alone gives)

Prints one JSON object per (variant, size) with the median ms per iteration, and for
`interop` the median host time of each hand-off direction over 10,000 calls. Then one
`parts` object per size: the GPU time of each kernel of the step, each framework's own
(PyTorch's matmul and add timed with CUDA events, back to back; JAX's matmul back to
back; its layer norm + gelu kernel and the whole step each unrolled `--loop` times in
one jax.jit, each on the last one's output behind an optimization barrier, so no host
dispatch sits between them, nothing is loop-invariant and nothing fuses across): the
floor of the split (matmul and add in PyTorch, layer norm + gelu in XLA) against one
jax.jit of the whole step.

    python3 bench/python_pipeline.py --sizes 4096 256 --dtype bf16
"""

import argparse
import os
import statistics
import time

import harness  # beside this script, in bench/

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

EPS = 1e-5


def ln_gelu_jax(h):
    hf = h.astype(jnp.float32)
    mean = hf.mean(axis=-1, keepdims=True)
    var = ((hf - mean) ** 2).mean(axis=-1, keepdims=True)
    return jax.nn.gelu((hf - mean) * jax.lax.rsqrt(var + EPS), approximate=True).astype(h.dtype)


def ln_gelu_torch(h):
    hf = h.float()
    mean = hf.mean(dim=-1, keepdim=True)
    var = ((hf - mean) ** 2).mean(dim=-1, keepdim=True)
    return torch.nn.functional.gelu((hf - mean) * torch.rsqrt(var + EPS), approximate="tanh").to(h.dtype)


def timed(step, x, iters, reps, sync=None):
    """Median ms per iteration of ``x = step(x)`` (``harness.median_ms``, 3 warm-up
    iterations), each block timed up to ``sync()``, or where ``sync`` is None up to the
    last ``x`` (a JAX array) being ready."""

    def once():
        nonlocal x
        x = step(x)

    return harness.median_ms(once, iters, reps=reps, warmup=3, sync=sync or (lambda: jax.block_until_ready(x)))


def torch_gpu_ms(f, iters, reps):
    """Median GPU ms per call of `f` launched `iters` times back to back (CUDA events)."""
    for _ in range(3):
        f()
    per = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            f()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) / iters)
    return statistics.median(per)


def jax_ms(f, args, calls, reps):
    """Median wall ms per call of the jitted `f`, `calls` calls then one wait."""
    out = None

    def once():
        nonlocal out
        out = f(*args)

    return harness.median_ms(once, calls, reps=reps, warmup=1, sync=lambda: jax.block_until_ready(out))


def parts(n, dtype, x0, w, xj, wj, loop, iters, reps):
    """The GPU time of each kernel of the step, in each framework (see the module docs)."""
    h = x0 @ w
    y = ln_gelu_torch(h)
    out = {"variant": "parts", "n": n, "dtype": dtype, "loop": loop}
    out["ms_torch_matmul"] = torch_gpu_ms(lambda: x0 @ w, iters, reps)
    out["ms_torch_add"] = torch_gpu_ms(lambda: x0 + y, iters, reps)
    hj = xj @ wj

    def looped(body):
        # Unrolled when traced (a Python loop, not an XLA while loop, whose every
        # iteration would copy its condition to the host), with an optimization
        # barrier between iterations so that XLA cannot fuse one into the next (it
        # would recompute the elementwise part inside the next reduction): `loop` times
        # the kernels of one iteration, in a row.
        def run(*c):
            for _ in range(loop):
                c = jax.lax.optimization_barrier(body(*c))
            return c

        return jax.jit(run)

    out["ms_jax_matmul"] = jax_ms(jax.jit(lambda x: x @ wj), (xj,), iters, reps)
    out["ms_xla_ln_gelu"] = jax_ms(looped(lambda h: (ln_gelu_jax(h),)), (hj,), 1, reps) / loop
    out["ms_jax_step_unrolled"] = jax_ms(looped(lambda x: (x + ln_gelu_jax(x @ wj),)), (xj,), 1, reps) / loop
    split = out["ms_torch_matmul"] + out["ms_xla_ln_gelu"] + out["ms_torch_add"]
    out["ms_split_floor"] = split
    out["split_floor_to_jax_step_unrolled"] = split / out["ms_jax_step_unrolled"]
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 256])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--handoff-samples", type=int, default=10_000)
    ap.add_argument("--loop", type=int, default=50)
    args = ap.parse_args()
    tdt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    dev = torch.device("cuda")
    kernel = jax.jit(ln_gelu_jax)

    for n in args.sizes:
        g = torch.Generator(device=dev).manual_seed(0)
        x0 = torch.randn(n, n, device=dev, dtype=tdt, generator=g) * 0.1
        w = torch.randn(n, n, device=dev, dtype=tdt, generator=g) / n**0.5
        iters = args.iters if n >= 1024 else args.iters * 10
        sync = torch.cuda.synchronize

        def torch_step(x):
            return x + ln_gelu_torch(x @ w)

        def interop_step(x):
            h = x @ w
            y = kernel(jax.dlpack.from_dlpack(h))
            return x + torch.from_dlpack(y)

        wj = jnp.asarray(w.float().cpu().numpy()).astype(jnp.bfloat16 if args.dtype == "bf16" else jnp.float32)

        @jax.jit
        def jax_step(x):
            return x + ln_gelu_jax(x @ wj)

        results = {}
        results["torch"] = timed(torch_step, x0.clone(), iters, args.reps, sync)
        results["interop"] = timed(interop_step, x0.clone(), iters, args.reps, sync)
        xj = jnp.asarray(x0.float().cpu().numpy()).astype(wj.dtype)
        results["jax"] = timed(jax_step, xj, iters, args.reps)

        # Host cost of each hand-off direction.
        h = x0 @ w
        sync()
        to_jax, to_torch = [], []
        yj = kernel(jax.dlpack.from_dlpack(h))
        yj.block_until_ready()
        for _ in range(args.handoff_samples):
            t0 = time.perf_counter()
            a = jax.dlpack.from_dlpack(h)
            t1 = time.perf_counter()
            b = torch.from_dlpack(yj)
            t2 = time.perf_counter()
            to_jax.append((t1 - t0) * 1e6)
            to_torch.append((t2 - t1) * 1e6)
            del a, b
        part = parts(n, args.dtype, x0, w, xj, wj, args.loop, iters, args.reps)
        for variant, ms in results.items():
            out = {"variant": variant, "n": n, "dtype": args.dtype, "ms_per_iter": round(ms, 4),
                   "ratio_to_torch": round(ms / results["torch"], 3)}
            if variant == "interop":
                out["host_us_torch_to_jax"] = round(statistics.median(to_jax), 2)
                out["host_us_jax_to_torch"] = round(statistics.median(to_torch), 2)
            harness.emit(**out)
        harness.emit(**part)


if __name__ == "__main__":
    main()
