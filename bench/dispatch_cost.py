"""What a jitted JAX call costs the host when its inputs are new arrays each time.

Inside a training step through ``handoff.torch_function`` the two JAX executables (the
forward with VJP residuals and the VJP) take longer to dispatch than on the same arrays
again and again (``bench/train_three_way.py``'s floor row). This separates the causes:
the host time of the forward-with-residuals + VJP pair of the MLP layer, on

- ``same``: the same JAX arrays every step (the floor row);
- ``device_put``: arrays JAX made itself, new every step (made before the clock);
- ``to_jax``: arrays ``handoff.to_jax`` made of torch tensors, new every step;
- ``from_dlpack``: arrays ``jax.dlpack.from_dlpack`` made of torch tensors, new every step.

Only the two calls are timed (the arrays are made beforehand, in batches). Median of
``--reps`` batches of ``--steps`` steps, µs per step. JSON lines.

    python bench/dispatch_cost.py [--device cuda|cpu] [--dtype f32|bf16] [--steps 200] [--inputs ...]
"""

import statistics
import time

import harness  # beside this script, in bench/ and in the GPU bundle


def main():
    ap = harness.parser()
    harness.layer_args(ap, steps=200)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--inputs", nargs="+", default=["same", "device_put", "to_jax", "from_dlpack"],
                    choices=("same", "device_put", "to_jax", "from_dlpack"), help="which rows, in this order")
    args = ap.parse_args()

    import jax
    import jax.dlpack
    import jax.numpy as jnp
    import torch

    import handoff

    tdt, batch, dim = harness.layer_setup(torch, args)
    dev = args.device
    sync = harness.device_sync(torch, dev == "cuda")

    from profile_step import layer_jax  # beside this script, in bench/ and in the GPU bundle

    fwd = jax.jit(lambda *a: jax.vjp(layer_jax, *a))
    bwd = jax.jit(lambda vjp, ct: vjp(ct))
    shapes = [(batch, dim), (dim,), (dim,), (dim, dim)]

    def tensors():
        return [torch.randn(s, device=dev).to(tdt) for s in shapes]

    def ct_tensor():
        return torch.randn(batch, dim, device=dev).to(tdt)

    jdev = jax.devices("gpu" if dev == "cuda" else "cpu")[0]

    def by_device_put(ts):
        return [jax.device_put(jnp.asarray(t.float().cpu().numpy()).astype(jnp.dtype(str(t.dtype)[6:])), jdev)
                for t in ts]

    makers = {
        "device_put": by_device_put,
        "to_jax": lambda ts: [handoff.to_jax(t) for t in ts],
        "from_dlpack": lambda ts: [jax.dlpack.from_dlpack(t) for t in ts],
    }
    fixed = makers["to_jax"](tensors() + [ct_tensor()])

    def time_steps(inputs):
        """µs per step of the two calls over ``inputs`` (a list of (xs, ct) per step)."""
        t0 = time.perf_counter()
        for xs, ct in inputs:
            _, vjp = fwd(*xs)
            g = bwd(vjp, ct)
        t1 = time.perf_counter()
        jax.block_until_ready(g)
        return (t1 - t0) * 1e6 / len(inputs)

    rows = {}
    for name in args.inputs:
        per = []
        for rep in range(args.reps + 2):  # two warm-up batches
            if name == "same":
                inputs = [(fixed[:4], fixed[4])] * args.steps
            else:
                made = [makers[name](tensors() + [ct_tensor()]) for _ in range(args.steps)]
                inputs = [(m[:4], m[4]) for m in made]
            sync()
            us = time_steps(inputs)
            if rep >= 2:
                per.append(us)
            del inputs
        rows[name] = statistics.median(per)
        harness.emit(inputs=name, us_per_step=round(rows[name], 1), device=dev, dtype=args.dtype, size=args.size)
    if "same" in rows:
        harness.emit(summary={k: round(v / rows["same"], 2) for k, v in rows.items()}, note="each row over 'same'")


if __name__ == "__main__":
    main()
