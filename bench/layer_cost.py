"""What one forward + backward of a JAX layer costs through ``handoff.torch_function``,
against JAX's own dispatch of the same programs and the same layer in PyTorch.

The MLP's JAX layer (``profile_step.layer_jax``: layer norm + gelu + matmul, inputs
``h`` BATCHxDIM, and the parameters ``gamma``, ``beta``, ``w2`` DIMxDIM, ``nn.Parameter``s
as a module holds them, all requiring a gradient), µs per
forward + backward, each the median of ``--reps`` blocks of ``--iters`` iterations timed
to a device synchronize, the variants timed in turns (a block of each per rep):

  a  handoff           ``handoff.torch_function(layer_jax)``, the wheel's default
                        residuals (``"dots"``; an earlier wheel saved them all):
                        ``y = layer(h, gamma, beta, w2)``, ``y.backward(ct)``,
  b  handoff_recompute  the same with ``residuals="recompute"``,
  g  handoff_dots       the same with ``residuals=jax.checkpoint_policies.dots_saveable``
                        (the matmuls' results kept, the rest recomputed),
  c  handoff_identity   ``handoff.torch_function(lambda h: h)`` on ``h`` alone, the same
                        forward + backward: what a crossing costs around no work,
  d  jax                JAX alone: the jitted forward with VJP
                        (``jax.jit(lambda *a: jax.vjp(layer_jax, *a))``) and the jitted
                        VJP applied to a cotangent, on JAX arrays made once,
  e  jax_crossings      (d) with what the layer hands across by the public functions, one
                        tensor a call: ``handoff.to_jax`` of the 4 inputs and of the
                        cotangent, ``handoff.to_torch`` of the output and of the 4
                        gradients (the VJP residuals stay JAX arrays),
  h  by_hand            (e) inside the smallest ``torch.autograd.Function`` (the forward's
                        VJP kept on its context): what PyTorch's autograd adds to (e),
                        its backward on PyTorch's autograd thread on CUDA,
  f  torch              the same layer in PyTorch, forward + ``y.backward(ct)``.

Every variant that gives gradients sets them to ``None`` before each iteration (as
``zero_grad(set_to_none=True)``). Float32 matmuls without TF32 on both sides (JAX's
"highest" precision).

Figures (JSON lines): ``env``; one ``layer_cost`` line per variant (``us``, for handoff's
also ``host_syncs`` over the timed iterations and ``jax_executions_per_iter``); a
``summary`` line: ``a_over_e`` (target ``A_OVER_E_TARGET``, 1.2, and ``met``),
``a_over_d``, ``a_over_h``, ``b_over_a``, ``a_over_f``, ``identity_us`` (on CUDA with target 150 µs,
``IDENTITY_TARGET_US``, and ``identity_met``); with ``--memory`` (CUDA only: a
``skipped`` line on the CPU) one ``memory`` line each for (a) and (b) at
``--memory-size``: the bytes the forward leaves held until the backward (PyTorch's
``memory_allocated`` and JAX's ``bytes_in_use``: what ``residuals`` trades), PyTorch's peak over forward + backward (``max_memory_allocated``, reset
first), and JAX's ``peak_bytes_in_use`` (process-wide so far: JAX cannot reset it).

Checks (exit 1, then ``{"figure": "result", ...}``): the output and gradients of (a),
(b) and (e) agree with (d)'s (relative L2 error at most 1e-5 for f32, 1e-2 for bf16: the
same JAX programs), the identity gives ``h`` and ``ct`` back exactly. The targets are
reported, never fail the run. Without CUDA (or JAX's GPU backend) the default
``--device cuda`` prints ``SKIPPED: <reason>`` and exits 0 (1 with
``HANDOFF_REQUIRE_GPU=1``).

    python bench/layer_cost.py                                   # the GPU machine
    python bench/layer_cost.py --memory --batch 64 --dim 256 --dtype bf16
    python bench/layer_cost.py --device cpu --iters 20 --reps 3  # a smoke test
"""

import os
import statistics
import time
import types

import harness  # beside this script, in bench/ and in the GPU bundle
from harness import check, emit

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

A_OVER_E_TARGET = 1.2  # (a) over (e): handoff's layer against JAX plus public crossings
IDENTITY_TARGET_US = 150.0  # (c) on CUDA
TOL = {"f32": 1e-5, "bf16": 1e-2}
VARIANTS = (
    ("a", "handoff"),
    ("s", "handoff_save"),
    ("b", "handoff_recompute"),
    ("g", "handoff_dots"),
    ("c", "handoff_identity"),
    ("d", "jax"),
    ("e", "jax_crossings"),
    ("h", "by_hand"),
    ("f", "torch"),
)


def main():
    ap = harness.parser(__doc__)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--iters", type=int, default=None, help="iterations per rep (default 300; 30 on the CPU)")
    ap.add_argument("--reps", type=int, default=None, help="default 15 (5 on the CPU)")
    ap.add_argument("--warmup", type=int, default=20, help="iterations of each variant before the clock")
    ap.add_argument("--memory", action="store_true", help="CUDA: also the memory of (a) against (b)")
    ap.add_argument("--memory-size", default="8192x4096", help="BATCHxDIM for --memory (GPU-bound)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    args.iters = args.iters or (300 if cuda else 30)
    args.reps = args.reps or (15 if cuda else 5)

    torch, jax, _ = harness.import_frameworks()
    import handoff

    if cuda:
        why = harness.why_no_cuda(torch, jax, handoff)
        if why is not None:
            harness.skip(why + ("" if torch.cuda.is_available() else " (--device cpu runs it on the CPU)"))
    else:
        jax.config.update("jax_platforms", "cpu")
        torch.set_num_threads(1)  # PyTorch's OpenMP threads and JAX's pool would take turns
    torch.backends.cuda.matmul.allow_tf32 = False
    jax.config.update("jax_default_matmul_precision", "highest")

    from profile_step import layer_jax  # beside this script, in bench/ and in the GPU bundle

    dev = torch.device(args.device)
    tdt = torch.float32 if args.dtype == "f32" else torch.bfloat16
    sync = harness.device_sync(torch, cuda)
    harness.env(device=torch.cuda.get_device_name(0) if cuda else "cpu", torch=torch, jax=jax,
                handoff=handoff, routes=handoff.routes(), python=harness.PYTHON)
    where = dict(device=args.device, dtype=args.dtype, batch=args.batch, dim=args.dim)

    steps, ctx = make_steps(torch, jax, handoff, layer_jax, args.batch, args.dim, tdt, dev)
    agreement(torch, steps, ctx, args.dtype)
    us = time_in_turns(jax, handoff, steps, ctx, args, sync)
    for label, name in VARIANTS:
        if name not in us:
            continue
        emit(figure="layer_cost", variant=name, label=label, us=round(us[name], 2), iters=args.iters,
             reps=args.reps, **steps[name].extra, **where)

    summary = dict(
        a_over_e=round(us["handoff"] / us["jax_crossings"], 3),
        target=A_OVER_E_TARGET,
        met=us["handoff"] / us["jax_crossings"] <= A_OVER_E_TARGET,
        a_over_d=round(us["handoff"] / us["jax"], 3),
        a_over_h=round(us["handoff"] / us["by_hand"], 3),
        b_over_a=round(us["handoff_recompute"] / us["handoff"], 3) if "handoff_recompute" in us else None,
        a_over_f=round(us["handoff"] / us["torch"], 3),
        identity_us=round(us["handoff_identity"], 2),
    )
    if cuda:
        summary.update(identity_target_us=IDENTITY_TARGET_US,
                       identity_met=us["handoff_identity"] <= IDENTITY_TARGET_US)
    emit(figure="summary", **summary, **where)

    if args.memory:
        memory(torch, jax, handoff, layer_jax, args, tdt, dev, cuda)


class Step:
    """One variant: ``run()`` is one forward + backward; ``result()`` its last output and
    gradients as torch tensors (for the agreement); ``extra`` what its line adds."""

    def __init__(self, run, result, layer=None):
        self.run, self.result, self.layer, self.extra = run, result, layer, {}


def make_steps(torch, jax, handoff, layer_jax, batch, dim, tdt, dev):
    """The six variants (see the module docs) on the same values, and what the checks
    and the clock read besides: ``h``, ``ct`` and ``jax_last`` (JAX's last results)."""
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(batch, dim, device=dev, generator=g).to(tdt)
    gamma = (1 + 0.1 * torch.randn(dim, device=dev, generator=g)).to(tdt)
    beta = (0.1 * torch.randn(dim, device=dev, generator=g)).to(tdt)
    w2 = (torch.randn(dim, dim, device=dev, generator=g) / dim**0.5).to(tdt)
    ct = torch.randn(batch, dim, device=dev, generator=g).to(tdt)
    inputs = [h.requires_grad_(), *(torch.nn.Parameter(t) for t in (gamma, beta, w2))]

    from profile_step import layer_torch  # beside this script

    def autograd_step(fn, ts):
        last = {}

        def run():
            for t in ts:
                t.grad = None
            y = fn(*ts)
            y.backward(ct)
            last["y"] = y

        return Step(run, lambda: [last["y"].detach(), *(t.grad for t in ts)], fn)

    steps = {"handoff": autograd_step(handoff.torch_function(layer_jax), inputs)}
    try:  # a handoff before the operators (an A/B against an earlier wheel) has no choice
        steps["handoff_save"] = autograd_step(handoff.torch_function(layer_jax, residuals="save"), inputs)
        steps["handoff_recompute"] = autograd_step(handoff.torch_function(layer_jax, residuals="recompute"), inputs)
        dots = jax.checkpoint_policies.dots_saveable
        steps["handoff_dots"] = autograd_step(handoff.torch_function(layer_jax, residuals=dots), inputs)
    except TypeError as e:
        print(f"note: no handoff_save, handoff_recompute and handoff_dots rows: {e}")
    steps["handoff_identity"] = autograd_step(handoff.torch_function(lambda x: x), inputs[:1])
    steps["torch"] = autograd_step(layer_torch, inputs)

    fwd = jax.jit(lambda *a: jax.vjp(layer_jax, *a))
    bwd = jax.jit(lambda vjp, c: vjp(c))
    xs = [handoff.to_jax(t.detach()) for t in inputs]
    jct = handoff.to_jax(ct)
    jlast = {}

    def run_jax():
        y, vjp = fwd(*xs)
        jlast["y"], jlast["g"] = y, bwd(vjp, jct)

    def result_jax():
        return [torch.from_dlpack(a) for a in (jlast["y"], *jlast["g"])]

    steps["jax"] = Step(run_jax, result_jax)
    tlast = {}

    def run_crossings():
        y, vjp = fwd(*[handoff.to_jax(t.detach()) for t in inputs])
        grads = bwd(vjp, handoff.to_jax(ct))
        tlast["out"] = [handoff.to_torch(y), *(handoff.to_torch(a) for a in grads)]
        jlast["crossed"] = grads

    steps["jax_crossings"] = Step(run_crossings, lambda: tlast["out"])
    steps["jax_crossings"].extra["crossings"] = {"to_jax": 5, "to_torch": 5}

    class ByHand(torch.autograd.Function):
        @staticmethod
        def forward(fctx, *ts):
            y, fctx.vjp = fwd(*[handoff.to_jax(t.detach()) for t in ts])
            return handoff.to_torch(y)

        @staticmethod
        def backward(fctx, g):
            grads = bwd(fctx.vjp, handoff.to_jax(g))
            return tuple(handoff.to_torch(a) for a in grads)

    steps["by_hand"] = autograd_step(ByHand.apply, inputs)
    return steps, types.SimpleNamespace(h=h, ct=ct, jax_last=jlast)


def agreement(torch, steps, ctx, dtype):
    """One iteration each: (a), (b), (e) against (d); the identity gives h and ct back."""

    def once(name):  # the variants share their inputs: each read right after its run
        steps[name].run()
        return [t.detach().clone() for t in steps[name].result()]

    want = [t.float().cpu() for t in once("jax")]
    for name in ("handoff", "handoff_save", "handoff_recompute", "handoff_dots", "jax_crossings", "by_hand"):
        if name not in steps:
            continue
        got = [t.float().cpu() for t in once(name)]
        errs = [float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(got, want)]
        worst = max(float("inf") if e != e else e for e in errs)
        ok = len(got) == len(want) and worst <= TOL[dtype]
        emit(figure="agreement", variant=name, against="jax", worst_rel_err=float(f"{worst:.3g}"),
             tol=TOL[dtype], ok=ok)
        check(ok, f"{name}: output and gradients differ from JAX's own (worst {worst:.3g} > {TOL[dtype]})")
    y, gh = once("handoff_identity")
    ok = torch.equal(y, ctx.h.detach()) and torch.equal(gh, ctx.ct)
    emit(figure="agreement", variant="handoff_identity", ok=ok)
    check(ok, "handoff_identity: the output is not h or the gradient not ct")


def time_in_turns(jax, handoff, steps, ctx, args, sync):
    """µs per iteration of each variant: ``--warmup`` iterations each, then ``--reps``
    rounds of a block of ``--iters`` iterations of each variant in turn, each block
    timed to a synchronize of the device (for (d), of JAX's last gradients)."""
    names = [n for _, n in VARIANTS if n in steps]
    jlast = ctx.jax_last

    def jax_sync():
        jax.block_until_ready(jlast["g"])

    def crossings_sync():
        jax.block_until_ready(jlast["crossed"])
        sync()

    waits = {"jax": jax_sync, "jax_crossings": crossings_sync}
    for n in names:
        for _ in range(args.warmup):
            steps[n].run()
        waits.get(n, sync)()
    per = {n: [] for n in names}
    counts = {}
    for _ in range(args.reps):
        for n in names:
            step, wait = steps[n], waits.get(n, sync)
            before = handoff.stats()["host_syncs"], getattr(step.layer, "executions", None)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                step.run()
            wait()
            per[n].append((time.perf_counter() - t0) * 1e6 / args.iters)
            syncs, runs = counts.get(n, (0, 0))
            counts[n] = (syncs + handoff.stats()["host_syncs"] - before[0],
                         runs + (step.layer.executions - before[1] if before[1] is not None else 0))
    for n in names:
        if n.startswith("handoff"):
            syncs, runs = counts[n]
            steps[n].extra["host_syncs"] = syncs
            if getattr(steps[n].layer, "executions", None) is not None:
                steps[n].extra["jax_executions_per_iter"] = round(runs / (args.iters * args.reps), 2)
    return {n: statistics.median(v) for n, v in per.items()}


def memory(torch, jax, handoff, layer_jax, args, tdt, dev, cuda):
    """--memory: (a) against (b) at --memory-size (see the module docs)."""
    batch, dim = (int(v) for v in args.memory_size.lower().split("x"))
    if not cuda:
        emit(figure="memory", skipped="CUDA only (torch.cuda memory statistics)")
        return
    jdev = jax.devices("gpu")[0]

    def jax_stats():
        try:
            return jdev.memory_stats() or {}
        except Exception:  # noqa: BLE001
            return {}

    g = torch.Generator(device=dev).manual_seed(1)
    ts = [torch.randn(s, device=dev, generator=g).to(tdt).requires_grad_()
          for s in ((batch, dim), (dim,), (dim,), (dim, dim))]
    ct = torch.randn(batch, dim, device=dev, generator=g).to(tdt)
    for mode in ("recompute", "dots", "save"):
        policy = jax.checkpoint_policies.dots_saveable if mode == "dots" else mode
        layer = handoff.torch_function(layer_jax, residuals=policy)
        layer(*ts).backward(ct)  # compiled and warm before the figures
        for t in ts:
            t.grad = None
        torch.cuda.synchronize()
        handoff.flush()  # the warm-up's buffers given back before the first reading
        torch.cuda.reset_peak_memory_stats()
        t0, j0 = torch.cuda.memory_allocated(), jax_stats().get("bytes_in_use")
        y = layer(*ts)
        torch.cuda.synchronize()
        t1, j1 = torch.cuda.memory_allocated(), jax_stats().get("bytes_in_use")
        y.backward(ct)
        del y
        torch.cuda.synchronize()
        j_peak = jax_stats().get("peak_bytes_in_use")
        emit(
            figure="memory", variant=f"handoff_{mode}", residuals=mode, device=args.device, dtype=args.dtype,
            batch=batch, dim=dim,
            torch_held_after_forward=t1 - t0,
            jax_held_after_forward=None if j0 is None or j1 is None else j1 - j0,
            torch_peak_over_step=torch.cuda.max_memory_allocated() - t0,
            jax_peak_bytes_in_use=j_peak,
            note="jax_peak_bytes_in_use is process-wide so far (recompute, then dots, then save)",
        )
        for t in ts:
            t.grad = None
        del layer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    harness.run(main)
