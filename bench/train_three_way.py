#!/usr/bin/env python3
"""Training through a JAX kernel from PyTorch, three ways (issue 32).

The model: a 2-layer MLP trained with SGD on a mean-square loss. Its first layer
(``h = x @ w1 + b1``) and the loss are PyTorch; its middle layer, layer norm + gelu +
matmul (``gelu(layernorm(h) * gamma + beta) @ w2``), is either

  torch      the same math in PyTorch (the baseline),
  jax2torch  the JAX function through ``jax2torch.jax2torch(jax.jit(f))``, as published on
             PyPI (lucidrains' jax2torch 0.0.7, the package that runs JAX in PyTorch's
             autograd; ``torch2jax`` goes the other way). Its 2021 code calls
             ``jax.dlpack.to_dlpack`` and hands capsules to ``jax.dlpack.from_dlpack``,
             both removed from JAX since: this script maps the two calls to today's
             ``__dlpack__`` protocol (``torch.from_dlpack(jax_array)``,
             ``jax.dlpack.from_dlpack(tensor.detach())``), changing nothing else,
  handoff    ``handoff.torch_function(f)``.

Figures (JSON lines, then a markdown table, then ``{"figure": "result", ...}``):

- ``step``: ms per training step (forward, backward, SGD step), the median of
  ``--reps`` blocks of ``--steps`` steps after ``--warmup`` steps, each block timed to
  a device synchronize; bf16 and f32 (float32 matmuls without TF32 on both sides), a
  host-bound size and a GPU-bound size. On CUDA
  also: ``sync_warnings``, PyTorch's synchronizing calls in 5 steps
  (``torch.cuda.set_sync_debug_mode("warn")``; JAX's own are not seen there),
  ``enqueue_ms_behind_50ms``, the host time of one step enqueued behind 50 ms of
  queued GPU work, and ``blocked`` (that step waited for the GPU: over 40 ms, or the
  stream idle after it), and for handoff ``host_syncs``, handoff's own count over
  the timed steps.
- ``grad_agreement``: the loss and the gradients of every parameter after one step,
  against ``jax.grad`` of the same loss in pure JAX, in float32 with "highest" matmul
  precision on both sides (TF32 off), from the same parameter values: relative L2
  error at most 1e-4 for f32, 5e-2 for bf16 (its rounding).
- ``device_follows`` (CUDA only): one ``handoff.torch_function`` called on CPU tensors
  and on CUDA tensors runs on each one's device (outputs and gradients there) and the
  two agree (relative error at most 1e-4, "highest" matmul precision).
- ``lifetime`` (CUDA only): ``--trials`` training steps on a non-blocking PyTorch
  stream (PyTorch's legacy default stream waits for every blocking stream and would
  hide a missing wait) where buffers JAX produced are dropped by PyTorch while
  PyTorch's kernels that read them are still queued: the middle layer's output (the
  loss reads it behind ~50 ms of queued work) and the gradient it returns for ``h``
  (the first layer's weight gradient reads it behind another ~50 ms, queued in the
  backward); meanwhile JAX allocates and fills 24 same-size buffers with NaN. A trial is
  right when the gradients equal the quiet run's. The buffers PyTorch hands to JAX
  (cotangents; the VJP residuals viewing ``h``) are, on one stream, behind the wait
  for the gradients JAX returns, so they need no test of their own here.

Checks that fail the run (exit 1): torch's and handoff's gradient agreement,
handoff's lifetime trials (all right), handoff's host syncs (0) and unblocked step on
CUDA, ``device_follows``. jax2torch's
figures are reported, never fail the run. Without CUDA (or JAX's GPU backend) the
default ``--device cuda`` prints ``SKIPPED: <reason>`` and exits 0 (1 with
``HANDOFF_REQUIRE_GPU=1``); ``--device cpu`` runs the timings and the gradient
agreement on the CPU.

    python3 bench/train_three_way.py                    # the GPU machine
    python3 bench/train_three_way.py --device cpu --steps 5 --reps 3
"""

import argparse
import faulthandler
import json
import os
import statistics
import sys
import time
import types
import warnings

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

EPS = 1e-5
QUEUED_MS = 50.0
CHURN = 24  # same-size JAX buffers filled with NaN per phase of a lifetime trial
VARIANTS = ("torch", "jax2torch", "handoff")
TOL = {"f32": 1e-4, "bf16": 5e-2}

failures = []
notes = []


def emit(**fields):
    print(json.dumps(fields), flush=True)


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"CHECK FAILED: {what}", flush=True)
    return ok


def skip(reason):
    print(f"SKIPPED: {reason}", flush=True)
    sys.exit(1 if os.environ.get("HANDOFF_REQUIRE_GPU") == "1" else 0)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        help="BATCHxDIM pairs (default: 64x256 and 4096x4096 on CUDA, 32x64 and 512x512 on CPU)",
    )
    ap.add_argument("--dtypes", nargs="+", choices=["bf16", "f32"], default=["bf16", "f32"])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("HANDOFF_GPU_TIMEOUT", "500")))
    return ap.parse_args()


def main():
    args = parse_args()
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        skip(f"torch does not import ({e})")
    try:
        import jax
        import jax.dlpack
        import jax.numpy as jnp
    except Exception as e:  # noqa: BLE001
        skip(f"jax does not import ({e})")
    import handoff

    cuda = args.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            skip("torch sees no CUDA device (run with --device cpu for the CPU figures)")
        try:
            jax.devices("gpu")
        except Exception as e:  # noqa: BLE001
            skip(f"jax has no GPU backend ({e})")
        if not handoff.cuda_available():
            skip("handoff cannot use the CUDA driver")
        dev = torch.device("cuda")
    else:
        dev = torch.device("cpu")
        jax.config.update("jax_platforms", "cpu")
    # float32 matmuls in float32 on both sides (PyTorch's default; JAX's GPU default is
    # TF32), so that the f32 timings compare the same arithmetic.
    torch.backends.cuda.matmul.allow_tf32 = False
    jax.config.update("jax_default_matmul_precision", "highest")

    j2t, j2t_version = load_jax2torch(torch, jax)
    variants = [v for v in args.variants if v != "jax2torch" or j2t is not None]
    emit(
        figure="env",
        device=torch.cuda.get_device_name(0) if cuda else "cpu",
        torch=torch.__version__,
        jax=jax.__version__,
        jax_backend=jax.default_backend(),
        handoff=handoff.__version__,
        jax2torch=j2t_version,
        python=sys.version.split()[0],
    )

    def middle_jax(h, gamma, beta, w2):
        """layernorm + gelu + matmul, in JAX (statistics in float32)."""
        hf = h.astype(jnp.float32)
        mu = hf.mean(-1, keepdims=True)
        var = ((hf - mu) ** 2).mean(-1, keepdims=True)
        z = (hf - mu) * jax.lax.rsqrt(var + EPS) * gamma.astype(jnp.float32) + beta.astype(jnp.float32)
        return jax.nn.gelu(z, approximate=True).astype(h.dtype) @ w2

    def middle_torch(h, gamma, beta, w2):
        hf = h.float()
        mu = hf.mean(-1, keepdim=True)
        var = ((hf - mu) ** 2).mean(-1, keepdim=True)
        z = (hf - mu) * torch.rsqrt(var + EPS) * gamma.float() + beta.float()
        return torch.nn.functional.gelu(z, approximate="tanh").to(h.dtype) @ w2

    middles = {
        "torch": middle_torch,
        "jax2torch": j2t(jax.jit(middle_jax)) if j2t is not None else None,
        "handoff": handoff.torch_function(middle_jax),
    }

    sizes = args.sizes or (["64x256", "4096x4096"] if cuda else ["32x64", "512x512"])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sleep_cycles = calibrate(torch) if cuda else 0
    rows = []

    for size in sizes:
        batch, dim = (int(v) for v in size.lower().split("x"))
        for dt in args.dtypes:
            tdt = torch.bfloat16 if dt == "bf16" else torch.float32
            init = make_params(torch, dim, dev)  # float32 master values
            g = torch.Generator(device=dev).manual_seed(1)
            x = torch.randn(batch, dim, device=dev, generator=g).to(tdt)
            tgt = torch.randn(batch, dim, device=dev, generator=g)
            ref = jax_reference(jax, jnp, middle_jax, init, x, tgt)
            base_ms = None
            for v in variants:
                mid = middles[v]
                row = {"variant": v, "dtype": dt, "batch": batch, "dim": dim}
                # Gradient agreement: one step's gradients from the same values.
                params = [p.detach().to(tdt, copy=True).requires_grad_() for p in init]
                with jax.default_matmul_precision("highest"):
                    loss = forward_loss(mid, params, x, tgt)
                    loss.backward()
                sync()
                errs = {
                    n: rel_err(torch, p.grad, r)
                    for n, p, r in zip(("w1", "b1", "gamma", "beta", "w2"), params, ref["grads"])
                }
                loss_err = abs(loss.item() - ref["loss"]) / abs(ref["loss"])
                worst = worst_of([loss_err, *errs.values()])
                ok = worst <= TOL[dt]
                emit(
                    figure="grad_agreement",
                    **row,
                    loss=round(loss.item(), 6),
                    loss_jax=round(ref["loss"], 6),
                    rel_err={k: jnum(e) for k, e in errs.items()},
                    worst=jnum(worst),
                    tol=TOL[dt],
                    ok=ok,
                )
                if v != "jax2torch":
                    check(ok, f"{v} {dt} {size}: gradients differ from jax.grad (worst {worst:.3g} > {TOL[dt]})")
                row["grad_err"] = worst
                row["grad_ok"] = ok

                # Timing.
                params = [p.detach().to(tdt, copy=True).requires_grad_() for p in init]
                opt = torch.optim.SGD(params, lr=1e-3, foreach=True)

                def step():
                    loss = forward_loss(mid, params, x, tgt)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    return loss

                for _ in range(args.warmup):
                    step()
                sync()
                before = handoff.stats()
                per = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        step()
                    sync()
                    per.append((time.perf_counter() - t0) * 1e3 / args.steps)
                after = handoff.stats()
                ms = statistics.median(per)
                base_ms = ms if v == "torch" else base_ms
                row["ms_per_step"] = round(ms, 4)
                row["ratio_to_torch"] = round(ms / base_ms, 3) if base_ms else None
                if v == "handoff":
                    row["host_syncs"] = after["host_syncs"] - before["host_syncs"]
                    row["waits_enqueued"] = after["waits_enqueued"] - before["waits_enqueued"]
                    row["releases_deferred"] = after["releases_deferred"] - before["releases_deferred"]
                if cuda:
                    row["sync_warnings"] = count_sync_warnings(torch, step, 5)
                    enq, busy = enqueue_behind(torch, step, sleep_cycles)
                    row["enqueue_ms_behind_50ms"] = round(enq, 3)
                    row["blocked"] = enq > 0.8 * QUEUED_MS or not busy
                    if v == "handoff":
                        check(row["host_syncs"] == 0, f"handoff {dt} {size}: {row['host_syncs']} host syncs")
                        check(not row["blocked"], f"handoff {dt} {size}: a step waited for the GPU")
                emit(figure="step", **row)
                rows.append(row)

    if cuda and "handoff" in variants:
        device_follows(torch, jax, middles["handoff"])

    lifetimes = {}
    if cuda:
        lifetimes = lifetime_checks(torch, jax, jnp, middles, variants, args.trials, sleep_cycles, dev)
    else:
        notes.append("lifetime: CUDA only (no streams on the CPU)")

    print(table(rows, lifetimes, j2t_version), flush=True)
    for n in notes:
        print(f"note: {n}", flush=True)
    emit(figure="result", ok=not failures, failures=failures)
    sys.exit(1 if failures else 0)


def load_jax2torch(torch, jax):
    """jax2torch as published, with its two removed JAX calls mapped (see the module
    docs); (None, reason) when it is not installed."""
    try:
        import importlib.metadata

        import jax2torch  # noqa: F401  (loads jax2torch.jax2torch)

        # The package's __init__ rebinds the name jax2torch.jax2torch to the function.
        impl = sys.modules["jax2torch.jax2torch"]
    except Exception as e:  # noqa: BLE001
        notes.append(f"jax2torch not run: it does not import ({e})")
        return None, None
    try:
        version = importlib.metadata.version("jax2torch")
    except Exception:  # noqa: BLE001
        version = "unknown"
    if not hasattr(jax.dlpack, "to_dlpack"):
        impl.jax_dlpack = types.SimpleNamespace(
            to_dlpack=lambda x: x, from_dlpack=jax.dlpack.from_dlpack
        )
        impl.torch_dlpack = types.SimpleNamespace(
            to_dlpack=lambda t: t.detach(), from_dlpack=torch.from_dlpack
        )
        notes.append(
            f"jax2torch {version}: jax.dlpack.to_dlpack and capsule input to from_dlpack are "
            "gone from this JAX; mapped to the __dlpack__ protocol"
        )
    return impl.jax2torch, version


def make_params(torch, dim, dev):
    g = torch.Generator(device=dev).manual_seed(0)
    w1 = torch.randn(dim, dim, device=dev, generator=g) / dim**0.5
    b1 = torch.randn(dim, device=dev, generator=g) * 0.1
    gamma = 1.0 + 0.1 * torch.randn(dim, device=dev, generator=g)
    beta = 0.1 * torch.randn(dim, device=dev, generator=g)
    w2 = torch.randn(dim, dim, device=dev, generator=g) / dim**0.5
    return [w1, b1, gamma, beta, w2]


def forward_loss(mid, params, x, tgt):
    w1, b1, gamma, beta, w2 = params
    h = x @ w1 + b1
    y = mid(h, gamma, beta, w2)
    return (y.float() - tgt).square().mean()


def jax_reference(jax, jnp, middle_jax, init, x, tgt):
    """jax.grad of the same loss in float32 from the same values (rounded to x's dtype
    first, as the variants see them), with "highest" matmul precision."""
    import numpy as np

    def host(t):
        return np.asarray(t.detach().to(x.dtype).float().cpu().numpy())

    ps = [jnp.asarray(host(p)) for p in init]
    xs, ts = jnp.asarray(host(x)), jnp.asarray(tgt.cpu().numpy())

    def loss(ps):
        w1, b1, gamma, beta, w2 = ps
        h = xs @ w1 + b1
        return ((middle_jax(h, gamma, beta, w2) - ts) ** 2).mean()

    with jax.default_matmul_precision("highest"):
        val, grads = jax.jit(jax.value_and_grad(loss))(ps)
    return {"loss": float(val), "grads": [np.asarray(g) for g in grads]}


def rel_err(torch, got, want):
    import numpy as np

    g = got.detach().float().cpu().numpy().astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))


def jnum(e):
    """A float for JSON: 3 significant digits, or "inf"/"nan" as strings."""
    return float(f"{e:.3g}") if e == e and abs(e) != float("inf") else str(e)


def worst_of(errors):
    """The largest error, a NaN counting as infinite (max() would skip it)."""
    return max(float("inf") if e != e else e for e in errors)


def calibrate(torch):
    """GPU clock cycles for QUEUED_MS of torch.cuda._sleep."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(1_000_000)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.cuda._sleep(20_000_000)
        e1.record()
    e1.synchronize()
    return int(20_000_000 / e0.elapsed_time(e1) * QUEUED_MS)


def count_sync_warnings(torch, step, n):
    """PyTorch's synchronizing calls in n steps (sync debug mode "warn")."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(n):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum(1 for w in caught if "synchroniz" in str(w.message).lower())


def enqueue_behind(torch, step, cycles):
    """Host ms of one step enqueued behind QUEUED_MS of GPU work on the current stream,
    and whether the stream was still busy after it (no host wait for the GPU)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    step()
    ms = (time.perf_counter() - t0) * 1e3
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return ms, busy


def device_follows(torch, jax, layer):
    """The same handoff.torch_function on CPU tensors and on CUDA tensors: each runs on
    its tensors' device (JAX CPU, JAX GPU) and both agree."""
    g = torch.Generator().manual_seed(3)
    cpu = [torch.randn(*s, generator=g).requires_grad_() for s in [(8, 16), (16,), (16,), (16, 4)]]
    gpu = [t.detach().cuda().requires_grad_() for t in cpu]
    out = {}
    for name, ts in (("cpu", cpu), ("cuda", gpu)):
        with jax.default_matmul_precision("highest"):
            y = layer(*ts)
            y.square().sum().backward()
        out[name] = (y, [t.grad for t in ts])
    devices = {n: {y.device.type, *(gr.device.type for gr in grads)} for n, (y, grads) in out.items()}
    err = worst_of(
        [rel_err(torch, a, b.detach().cpu().numpy()) for a, b in zip(
            [out["cuda"][0], *out["cuda"][1]], [out["cpu"][0], *out["cpu"][1]])]
    )
    ok = devices == {"cpu": {"cpu"}, "cuda": {"cuda"}} and err <= 1e-4
    emit(figure="device_follows", devices={k: sorted(v) for k, v in devices.items()}, rel_err=jnum(err), ok=ok)
    check(ok, f"handoff.torch_function on CPU and CUDA tensors: devices {devices}, rel err {err:.3g}")


def lifetime_checks(torch, jax, jnp, middles, variants, trials, cycles, dev):
    """See the module docs: JAX-produced buffers dropped by PyTorch while PyTorch
    kernels reading them are queued on a non-blocking stream, JAX reallocating."""
    batch, dim = 1024, 1024  # float32

    class SleepInBackward(torch.autograd.Function):
        """Identity; its backward queues ~50 ms of GPU work before the gradient is read."""

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            torch.cuda._sleep(cycles)
            return g

    init = make_params(torch, dim, dev)
    gen = torch.Generator(device=dev).manual_seed(2)
    x = torch.randn(batch, dim, device=dev, generator=gen)
    tgt = torch.randn(batch, dim, device=dev, generator=gen)
    fill = jax.jit(lambda v: jnp.full((batch, dim), v, jnp.float32))
    fill(jnp.float32(0)).block_until_ready()
    side = torch.cuda.Stream()  # a pool stream: non-blocking
    results = {}
    for v in variants:
        mid = middles[v]
        params = [p.clone().requires_grad_() for p in init]
        torch.cuda.synchronize()  # made on the default stream, read on `side`

        def run(queued):
            for p in params:
                p.grad = None
            churn = []
            with torch.cuda.stream(side):
                w1, b1, gamma, beta, w2 = params
                h = x @ w1 + b1
                if queued:
                    h = SleepInBackward.apply(h)
                y = mid(h, gamma, beta, w2)
                if queued:
                    torch.cuda._sleep(cycles)  # the loss reads y behind ~50 ms
                loss = (y.float() - tgt).square().mean()
                del y, h  # PyTorch lets go of JAX's output; the loss's read is queued
                if queued:
                    churn += [fill(jnp.float32(float("nan"))) for _ in range(CHURN)]
                loss.backward()  # the gradient for h: read behind ~50 ms, then dropped
                if queued:
                    churn += [fill(jnp.float32(float("nan"))) for _ in range(CHURN)]
                value = loss.detach()
                del loss
            side.synchronize()
            for c in churn:
                c.block_until_ready()
            return value.item(), [p.grad.clone() for p in params]

        quiet_loss, quiet = run(False)
        right = 0
        worst = 0.0
        t0 = time.perf_counter()
        for _ in range(trials):
            loss, grads = run(True)
            errs = [rel_err(torch, g, q.cpu().numpy()) for g, q in zip(grads, quiet)]
            err = worst_of([abs(loss - quiet_loss) / abs(quiet_loss), *errs])
            worst = max(worst, err)
            right += err <= 1e-5
        results[v] = (right, trials)
        emit(
            figure="lifetime",
            variant=v,
            right=right,
            trials=trials,
            worst_rel_err=jnum(worst),
            seconds=round(time.perf_counter() - t0, 1),
        )
        if v == "handoff":
            check(right == trials, f"handoff lifetime: {trials - right} of {trials} trials wrong")
        if v == "torch" and right != trials:
            notes.append("lifetime: the pure PyTorch control was wrong too: the scenario is broken")
            check(False, "lifetime: pure PyTorch trials wrong (the harness, not an interop)")
    return results


def table(rows, lifetimes, j2t_version):
    out = [
        "",
        "| variant | dtype | batch x dim | ms/step | vs torch | host syncs | torch sync warnings | enqueue ms behind 50 ms | grad rel err (tol) | lifetime |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = r["variant"] + (f" {j2t_version}" if r["variant"] == "jax2torch" else "")
        life = lifetimes.get(r["variant"])
        out.append(
            "| {} | {} | {}x{} | {:.3f} | {} | {} | {} | {} | {:.2g} ({}) {} | {} |".format(
                name,
                r["dtype"],
                r["batch"],
                r["dim"],
                r["ms_per_step"],
                f"{r['ratio_to_torch']:.2f}x" if r.get("ratio_to_torch") else "-",
                r.get("host_syncs", "-"),
                r.get("sync_warnings", "-"),
                (
                    f"{r['enqueue_ms_behind_50ms']:.2f}{' (blocked)' if r['blocked'] else ''}"
                    if "enqueue_ms_behind_50ms" in r
                    else "-"
                ),
                r["grad_err"],
                TOL[r["dtype"]],
                "ok" if r["grad_ok"] else "FAIL",
                f"{life[0]}/{life[1]} right" if life else "-",
            )
        )
    return "\n".join(out)


if __name__ == "__main__":
    main()
