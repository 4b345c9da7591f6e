#!/usr/bin/env python3
"""Training through a JAX layer from PyTorch: pure PyTorch, jax2torch, torch-jax-interop,
handoff, and the JAX layer alone.

Two models, each trained with SGD; the layer in the middle is JAX (or, for the baseline,
the same math in PyTorch); what feeds it and the loss are PyTorch:

  mlp   ``h = x @ w1 + b1`` (PyTorch), then layer norm + gelu + matmul
        (``gelu(layernorm(h) * gamma + beta) @ w2``), then a mean-square loss. Sizes
        ``BATCHxDIM``.
  attn  ``x = x0 @ w_in + b_in`` (PyTorch), then a causal multi-head self-attention block
        with a residual (inputs x, wq, wk, wv, wo; heads of 64 features, or one head when
        DIM < 64) with two outputs, the block's output ``x + attn(x) @ wo`` and the
        attention probabilities' entropy per token (mean over heads, float32); the loss
        is the mean-square error of the first plus ``ENT_WEIGHT`` times the mean of the
        second. Sizes ``BATCHxTOKENSxDIM``.

The variants (``--variants``):

  torch              the same math in PyTorch (the baseline every ratio is to),
  jax2torch          ``jax2torch.jax2torch(jax.jit(f))``, lucidrains' jax2torch 0.0.7 as
                     published on PyPI (2021). Its code calls ``jax.dlpack.to_dlpack`` and
                     hands capsules to ``jax.dlpack.from_dlpack``, both removed from JAX
                     since: this script maps the two calls to today's ``__dlpack__``
                     protocol (``torch.from_dlpack(jax_array)``,
                     ``jax.dlpack.from_dlpack(tensor.detach())``), changing nothing else,
  torch_jax_interop  ``torch_jax_interop.WrappedJaxFunction(jax.jit(f), jax_params=())``
                     (torch-jax-interop 0.0.8 from PyPI; it imports ``chex``, which it does
                     not declare), called with every tensor as an input (the same
                     ``_JaxFunction`` path as parameters held by the module). It takes one
                     differentiable output: the attention block's two outputs are
                     concatenated, flattened, into one array in the block's dtype (a JAX
                     concatenate, the entropy rounded to bf16 in bf16) and split into views
                     in PyTorch (its ``has_aux`` output is not differentiable: the backward
                     asserts that its gradient is None),
  handoff            ``handoff.torch_function(f)``,
  floor              no PyTorch and no crossing: the layer's inputs and the cotangents of
                     its outputs already JAX arrays, the step is the JAX layer's forward
                     (a jitted ``jax.vjp``, its residuals returned) and its VJP (jitted),
                     driven from Python as ``handoff.torch_function`` drives them: what a
                     crossing cannot go below. Its ratio is to the whole PyTorch step,
  torch_compiled     not run by default: the torch model as a ``torch.nn.Module`` (its
                     forward the loss) under ``torch.compile(model, mode=--compile-mode,
                     dynamic=False)``; ``loss.backward()`` (which runs the compiled
                     backward) and the SGD step called as in the others,
  handoff_compiled   not run by default: the same with handoff's layer (the operators
                     ``handoff::call`` / ``handoff::call_bwd`` in the compiled graphs).

Figures (JSON lines, then a markdown table, then ``{"figure": "result", ...}``):

- ``env``: versions, ``handoff.routes()`` when this handoff has it, ``--label``.
- ``step``: ms per training step (forward, backward, SGD step), the median of ``--reps``
  blocks of ``--steps`` steps after ``--warmup`` steps, each block timed to a device
  synchronize; bf16 and f32 (float32 matmuls without TF32 on both sides); for each model
  a host-bound size (the first of ``--mlp-sizes`` / ``--attn-sizes``, ``bound: host``)
  and GPU-bound ones (the rest, ``bound: gpu``). ``ratio_to_torch``; for handoff at
  host-bound sizes also ``target`` (1.15) and ``met``. On CUDA also: ``sync_warnings``,
  PyTorch's synchronizing calls in 5 steps (``torch.cuda.set_sync_debug_mode("warn")``;
  JAX's own are not seen there), ``enqueue_ms_behind_50ms``, the host time of one step
  enqueued behind 50 ms of queued GPU work, and ``blocked`` (that step waited for the
  GPU: over 40 ms, or the stream idle after it); for handoff ``host_syncs``, handoff's
  own count over the timed steps (on the CPU too), and ``routes``. A variant that raises
  gets its row with ``error`` (the exception) instead of figures. The compiled variants
  (compiled afresh for each size and dtype, ``torch._dynamo.reset()`` first) also give
  ``graph_breaks`` (``torch._dynamo.utils.counters["graph_break"]`` over their gradient
  agreement, warm-up and timed steps) and ``compile_mode``; ``handoff_compiled`` gives
  ``ratio_to_handoff`` (to the eager handoff row, ``target`` 1.0 at host-bound sizes,
  1.05 at GPU-bound ones, and ``met``), ``ratio_to_torch_compiled``, and, as handoff
  does, ``host_syncs`` and ``jax_executions_per_step`` (the layer's ``executions``).
- ``reduce_overhead`` (``--reduce-overhead-check``, CUDA only: a ``skipped`` line on the
  CPU): the MLP (its first size, float32), one model through handoff and one in PyTorch,
  each trained ``RO_STEPS`` (100) SGD steps eagerly and, from the same values, as
  ``torch.compile(model, mode="reduce-overhead")`` (CUDA graphs split around handoff's
  operators, which are ``cudagraph_unsafe``): ``max_rel_diff``, the largest relative L2
  difference of a parameter between the two runs (at most ``RO_TOL``), ``moved`` (the
  largest relative change of a parameter over the training, at least 100 times
  ``RO_TOL``, else the comparison proves nothing), ``graph_breaks``, the inductor's
  ``cudagraph_*`` counters, then ms per step of the compiled handoff model and of the
  compiled PyTorch one after those steps, and their ratio.
- ``grad_agreement``: the loss and the gradients of every parameter after one step,
  against ``jax.grad`` of the same loss in pure JAX, in float32 with "highest" matmul
  precision on both sides (TF32 off), from the same parameter values: relative L2 error
  at most 1e-4 for f32, 5e-2 for bf16 (its rounding).
- ``device_follows`` (CUDA only): one ``handoff.torch_function`` called on CPU tensors
  and on CUDA tensors runs on each one's device (outputs and gradients there) and the two
  agree (relative error at most 1e-4, "highest" matmul precision).
- ``lifetime`` (CUDA only, the MLP, ``--trials`` of them, none with ``--trials 0``):
  training steps on a non-blocking PyTorch stream (PyTorch's legacy default stream waits
  for every blocking stream and would hide a missing wait) where buffers JAX produced are
  dropped by PyTorch while PyTorch's kernels that read them are still queued: the middle
  layer's output (the loss reads it behind ~50 ms of queued work) and the gradient it
  returns for ``h`` (the first layer's weight gradient reads it behind another ~50 ms,
  queued in the backward); meanwhile JAX allocates and fills 24 same-size buffers with
  NaN. A trial is right when the gradients equal the quiet run's. The buffers PyTorch
  hands to JAX (cotangents; the VJP residuals viewing ``h``) are, on one stream, behind
  the wait for the gradients JAX returns, so they need no test of their own here.
- ``ab`` (``--ab LOG...``, no benchmark run): the step rows of earlier runs of this script
  made with ``--label`` (two labels, e.g. the previous handoff wheel's ``prev`` and this
  one's ``new``, run in turns), per model, size and dtype: the median ms of handoff under
  each label, their ratio (target at most 1.03), and the ratio of their ratios to
  PyTorch in the same runs (which takes out a drift of the machine between runs).

Checks that fail the run (exit 1): the runs of torch, handoff, the floor and the
compiled variants (an error) and their gradient agreement, the compiled variants' graph
breaks (0), the reduce-overhead check (both models), handoff's lifetime trials (all
right), handoff's and handoff_compiled's host syncs (0), handoff's unblocked step on
CUDA, ``device_follows``, and with ``--route public`` a ``handoff.routes()`` that is not
public both ways. jax2torch's and torch-jax-interop's figures and the targets are
reported, never fail the run. Without CUDA (or JAX's GPU backend) the default ``--device
cuda`` prints ``SKIPPED: <reason>`` and exits 0 (1 with ``HANDOFF_REQUIRE_GPU=1``);
``--device cpu`` runs the timings and the gradient agreement on the CPU.

``--route public|auto`` calls ``handoff._handoff._set_route(route)`` first when this
handoff has it (a note says so when it does not).

    python3 bench/train_three_way.py                               # the GPU machine
    python3 bench/train_three_way.py --device cpu --small --route public
    python3 bench/train_three_way.py --label prev --bound gpu --variants torch handoff --trials 0
    python3 bench/train_three_way.py --ab out/gpu-logs/train_three_way_ab_*.log
    python3 bench/train_three_way.py --device cpu --small --variants torch handoff torch_compiled handoff_compiled
    python3 bench/train_three_way.py --reduce-overhead-check --compile-mode reduce-overhead \
        --variants torch_compiled handoff_compiled --trials 0
"""

import faulthandler
import json
import os
import statistics
import sys
import time
import traceback
import types
import warnings

import harness  # beside this script, in bench/ and in the GPU bundle
from harness import check, emit, skip

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

EPS = 1e-5
ENT_WEIGHT = 0.1  # the attention entropy's weight in the attention model's loss
QUEUED_MS = 50.0
CHURN = 24  # same-size JAX buffers filled with NaN per phase of a lifetime trial
VARIANTS = ("torch", "jax2torch", "torch_jax_interop", "handoff", "floor")  # the default
# Every variant, in run order: each ratio's base (torch, handoff) before what is compared.
ALL_VARIANTS = ("torch", "torch_compiled", "jax2torch", "torch_jax_interop", "handoff",
                "handoff_compiled", "floor")
COMPILED = {"torch_compiled": "torch", "handoff_compiled": "handoff"}  # -> the eager layer
COMPILED_TARGET = {"host": 1.0, "gpu": 1.05}  # handoff_compiled's step over eager handoff's
RO_STEPS, RO_TOL, RO_LR = 100, 1e-4, 5e-2  # --reduce-overhead-check
REPORTED_ONLY = ("jax2torch", "torch_jax_interop")  # their figures never fail the run
MODELS = ("mlp", "attn")
TOL = {"f32": 1e-4, "bf16": 5e-2}
HOST_TARGET = 1.15  # handoff's step at host-bound sizes, times PyTorch's
AB_TARGET = 1.03  # one handoff wheel's step against another's at GPU-bound sizes
DEFAULT_SIZES = {
    ("mlp", "cuda"): ["64x256", "4096x4096"],
    ("mlp", "cpu"): ["32x64", "512x512"],
    ("attn", "cuda"): ["8x64x128", "16x1024x1024"],
    ("attn", "cpu"): ["2x16x32", "4x128x128"],
}
SMALL_SIZES = {"mlp": ["32x64"], "attn": ["2x16x32"]}

notes = []


def parse_args():
    ap = harness.parser(__doc__)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument(
        "--mlp-sizes",
        "--sizes",
        nargs="+",
        default=None,
        help="BATCHxDIM, the first host-bound, the rest GPU-bound (default: 64x256 4096x4096 "
        "on CUDA, 32x64 512x512 on CPU)",
    )
    ap.add_argument(
        "--attn-sizes",
        nargs="+",
        default=None,
        help="BATCHxTOKENSxDIM, the first host-bound, the rest GPU-bound (default: 8x64x128 "
        "16x1024x1024 on CUDA, 2x16x32 4x128x128 on CPU)",
    )
    ap.add_argument("--bound", choices=["host", "gpu", "all"], default="all", help="which sizes run")
    ap.add_argument(
        "--small",
        action="store_true",
        help="the CPU check: one small size per model, few steps (meant for `cargo xtask test`, with --device cpu)",
    )
    ap.add_argument("--dtypes", nargs="+", choices=["bf16", "f32"], default=["bf16", "f32"])
    ap.add_argument(
        "--variants",
        nargs="+",
        choices=ALL_VARIANTS + ("tji",),
        default=list(VARIANTS),
        help="tji is short for torch_jax_interop (default: all but the compiled ones)",
    )
    ap.add_argument("--residuals", choices=["default", "save", "recompute", "dots"], default="default",
                    help="handoff.torch_function's residuals (default: the wheel's own, dots since the "
                         "operators; an earlier wheel saved them all)")
    ap.add_argument("--compile-mode", choices=["default", "reduce-overhead"], default="default",
                    help="torch.compile's mode for the compiled variants")
    ap.add_argument("--reduce-overhead-check", action="store_true",
                    help="CUDA: also the reduce_overhead check (see the module docs)")
    ap.add_argument(
        "--graph",
        action="store_true",
        help="CUDA: also time the torch and handoff steps captured into one CUDA graph each "
        "(torch.cuda.graph, thread-local, handoff.prune_graph) and replayed; turns XLA's own "
        "command buffers off in this process (XLA_FLAGS), as a capture with JAX work needs, "
        "so every JAX figure of the run is without them",
    )
    ap.add_argument("--warmup", type=int, default=None, help="default 10 (2 with --small)")
    ap.add_argument("--steps", type=int, default=None, help="default 20 (3 with --small)")
    ap.add_argument("--reps", type=int, default=None, help="default 7 (3 with --small)")
    ap.add_argument("--trials", type=int, default=20, help="lifetime trials (CUDA); 0: none")
    ap.add_argument("--route", choices=["public", "auto"], default=None)
    ap.add_argument("--label", default=None, help="put into every JSON line (for --ab)")
    ap.add_argument(
        "--ab",
        nargs="+",
        default=None,
        metavar="LOG",
        help="no benchmark: compare handoff's step rows of these logs by their labels",
    )
    ap.add_argument("--ab-base", default="prev", help="the label the others are compared with")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("HANDOFF_GPU_TIMEOUT", "500")))
    args = ap.parse_args()
    args.variants = list(dict.fromkeys("torch_jax_interop" if v == "tji" else v for v in args.variants))
    args.variants = [v for v in ALL_VARIANTS if v in args.variants]  # bases first: the ratios
    small = args.small
    args.warmup = args.warmup if args.warmup is not None else (2 if small else 10)
    args.steps = args.steps if args.steps is not None else (3 if small else 20)
    args.reps = args.reps if args.reps is not None else (3 if small else 7)
    return args


def main():
    args = parse_args()
    if args.ab:
        sys.exit(ab_report(args.ab, args.ab_base))
    if args.graph:
        # XLA cannot launch a CUDA graph of its own inside PyTorch's capture.
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_gpu_enable_command_buffer=".strip()
    harness.lead(label=args.label)
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    torch, jax, jnp = harness.import_frameworks()
    import handoff

    cuda = args.device == "cuda"
    if cuda:
        why = harness.why_no_cuda(torch, jax, handoff)
        if why == harness.NO_TORCH_CUDA:
            why += " (run with --device cpu for the CPU figures)"
        if why is not None:
            skip(why)
        dev = torch.device("cuda")
    else:
        dev = torch.device("cpu")
        jax.config.update("jax_platforms", "cpu")
        # PyTorch's OpenMP threads and JAX's CPU pool, both spinning on a small machine,
        # take turns at tens of ms a step: PyTorch gets one intra-op thread.
        torch.set_num_threads(1)
    # float32 matmuls in float32 on both sides (PyTorch's default; JAX's GPU default is
    # TF32), so that the f32 timings compare the same arithmetic.
    torch.backends.cuda.matmul.allow_tf32 = False
    jax.config.update("jax_default_matmul_precision", "highest")

    routes = select_route(handoff, args.route)
    j2t, j2t_version = load_jax2torch(torch, jax)
    tji, tji_version = load_torch_jax_interop()
    versions = {"jax2torch": j2t_version, "torch_jax_interop": tji_version}
    dropped = {v for v, impl in (("jax2torch", j2t), ("torch_jax_interop", tji)) if impl is False}
    args.variants = [v for v in args.variants if v not in dropped]
    harness.env(
        device=torch.cuda.get_device_name(0) if cuda else "cpu",
        torch=torch,
        jax=jax,
        jax_backend=jax.default_backend(),
        handoff=handoff,
        handoff_path=os.path.dirname(handoff.__file__),
        routes=routes,
        route_requested=args.route,
        jax2torch=j2t_version,
        torch_jax_interop=tji_version,
        python=harness.PYTHON,
        torch_threads=torch.get_num_threads(),
    )

    models = make_models(torch, jax, jnp)
    layers = {}
    for name in args.models:
        m = models[name]
        layers[name] = {
            "torch": m.layer_torch,
            "jax2torch": j2t(jax.jit(m.layer_jax)) if j2t else Unavailable(j2t_version),
            "torch_jax_interop": tji_layer(tji, jax, jnp, m) if tji else Unavailable(tji_version),
            "handoff": handoff_layer(handoff, m.layer_jax, args.residuals),
        }

    sync = harness.device_sync(torch, cuda)
    sleep_cycles = calibrate(torch) if cuda else 0
    rows = []
    for name in args.models:
        m = models[name]
        if args.small:
            sizes = SMALL_SIZES[name]
        else:
            given = args.mlp_sizes if name == "mlp" else args.attn_sizes
            sizes = given or DEFAULT_SIZES[(name, args.device)]
        for k, size in enumerate(sizes):
            bound = "host" if k == 0 else "gpu"
            if args.bound not in ("all", bound):
                continue
            dims = m.parse(size)
            for dt in args.dtypes:
                rows += run_cell(
                    torch, jax, jnp, handoff, m, layers[name], args, dims, size, bound, dt, dev,
                    cuda, sync, sleep_cycles, routes,
                )
                if cuda:
                    torch.cuda.empty_cache()

    if args.reduce_overhead_check:
        reduce_overhead_check(torch, handoff, models["mlp"], args, dev, cuda, sync)

    if cuda and "handoff" in args.variants and "mlp" in layers:
        device_follows(torch, jax, layers["mlp"]["handoff"])

    lifetimes = {}
    if cuda and args.trials > 0 and "mlp" in layers:
        crossing = [v for v in args.variants if v in layers["mlp"]]
        lifetimes = lifetime_checks(
            torch, jax, jnp, models["mlp"], layers["mlp"], crossing, args.trials, sleep_cycles, dev
        )
    elif not cuda:
        notes.append("lifetime: CUDA only (no streams on the CPU)")

    print(table(rows, lifetimes, versions, routes), flush=True)
    for n in notes:
        print(f"note: {n}", flush=True)
    harness.finish()


def run_cell(torch, jax, jnp, handoff, m, layers, args, dims, size, bound, dt, dev, cuda, sync,
             sleep_cycles, routes):
    """Every variant at one model, size and dtype: gradient agreement, then timing."""
    tdt = torch.bfloat16 if dt == "bf16" else torch.float32
    init = m.make_params(torch, dims, dev)  # float32 master values
    x, tgt = m.make_data(torch, dims, dev, tdt)
    ref = jax_reference(jax, jnp, m, init, x, tgt)
    base_ms = base_graph_ms = None
    cell_ms = {}  # variant -> its ms per step here (the compiled variants' ratios)
    rows = []
    for v in args.variants:
        row = {"model": m.name, "variant": v, "dtype": dt, "size": size, "bound": bound}
        if m.name == "mlp":
            row["batch"], row["dim"] = dims
        try:
            if v == "floor":
                ms = time_floor(torch, jax, jnp, m, init, x, tdt, args)
                row["ms_per_step"] = round(ms, 4)
                row["ratio_to_torch"] = round(ms / base_ms, 3) if base_ms else None
                emit(figure="step", **row)
                rows.append(row)
                continue
            layer = layers[COMPILED.get(v, v)]
            if isinstance(layer, Unavailable):
                raise layer
            build = model_builder(torch, m, layer, v, args.compile_mode)
            if v in COMPILED:
                torch._dynamo.reset()  # compiled afresh for this size and dtype
                breaks = graph_breaks()
            grad_agreement(torch, jax, m, build, init, x, tgt, tdt, ref, row, sync)
            timing(torch, handoff, layer, build, init, x, tgt, tdt, args, row, sync, cuda, sleep_cycles)
            if v in COMPILED:
                row["graph_breaks"] = graph_breaks() - breaks
                row["compile_mode"] = args.compile_mode
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
            print(f"{v} {m.name} {dt} {size}: {row['error']}", flush=True)
            if not isinstance(e, Unavailable):
                traceback.print_exc()
            if v not in REPORTED_ONLY:
                check(False, f"{v} {m.name} {dt} {size}: raised {row['error'][:300]}")
            emit(figure="step", **row)
            rows.append(row)
            continue
        ms = row["ms_per_step"]
        cell_ms[v] = ms
        base_ms = ms if v == "torch" else base_ms
        if "ms_per_step_graph" in row:
            base_graph_ms = row["ms_per_step_graph"] if v == "torch" else base_graph_ms
            if v == "handoff" and base_graph_ms:
                row["graph_ratio_to_torch_graph"] = round(row["ms_per_step_graph"] / base_graph_ms, 3)
                row["graph_target"] = GRAPH_TARGET
                row["graph_met"] = row["graph_ratio_to_torch_graph"] <= GRAPH_TARGET
        row["ratio_to_torch"] = round(ms / base_ms, 3) if base_ms else None
        if v in COMPILED:
            check(row["graph_breaks"] == 0, f"{v} {m.name} {dt} {size}: {row['graph_breaks']} graph breaks")
        if v == "handoff_compiled":
            row["routes"] = routes
            if cell_ms.get("handoff"):
                row["ratio_to_handoff"] = round(ms / cell_ms["handoff"], 3)
                row["target"] = COMPILED_TARGET[bound]
                row["met"] = row["ratio_to_handoff"] <= row["target"]
            if cell_ms.get("torch_compiled"):
                row["ratio_to_torch_compiled"] = round(ms / cell_ms["torch_compiled"], 3)
            check(row["host_syncs"] == 0, f"{v} {m.name} {dt} {size}: {row['host_syncs']} host syncs")
        if v == "handoff":
            row["routes"] = routes
            if bound == "host" and row["ratio_to_torch"] is not None:
                row["target"] = HOST_TARGET
                row["met"] = row["ratio_to_torch"] <= HOST_TARGET
            check(row["host_syncs"] == 0, f"handoff {m.name} {dt} {size}: {row['host_syncs']} host syncs")
            if cuda:
                check(not row["blocked"], f"handoff {m.name} {dt} {size}: a step waited for the GPU")
        emit(figure="step", **row)
        rows.append(row)
    return rows


def handoff_layer(handoff, f, residuals):
    """``handoff.torch_function(f)`` with ``--residuals`` (``default``: none given, as an
    earlier handoff without the option takes it)."""
    if residuals == "default":
        return handoff.torch_function(f)
    return handoff.torch_function(f, residuals=residuals)


def model_builder(torch, m, layer, variant, mode):
    """``build(init, tdt) -> (params, forward)``: the model's parameters (copies of
    ``init`` in ``tdt``, requiring grad) and ``forward(x, tgt)``, the loss through
    ``layer``. For a compiled variant the model is a ``torch.nn.Module`` holding the
    parameters, ``forward`` that module under ``torch.compile(mode=mode, dynamic=False)``."""
    if variant not in COMPILED:

        def build(init, tdt):
            params = [p.detach().to(tdt, copy=True).requires_grad_() for p in init]
            return params, lambda x, tgt: m.loss(layer(*m.front(params, x)), tgt)

        return build

    class Model(torch.nn.Module):
        def __init__(self, init, tdt):
            super().__init__()
            for n, p in zip(m.names, init):
                setattr(self, n, torch.nn.Parameter(p.detach().to(tdt, copy=True)))

        def forward(self, x, tgt):
            return m.loss(layer(*m.front([getattr(self, n) for n in m.names], x)), tgt)

    def build(init, tdt):
        model = Model(init, tdt)
        return [getattr(model, n) for n in m.names], torch.compile(model, mode=mode, dynamic=False)

    return build


def graph_breaks():
    """Dynamo's graph breaks so far in this process."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def sgd_step(torch, params, forward, x, tgt, lr=1e-3):
    """A training step: the loss (``forward(x, tgt)``), its gradients, an SGD update."""
    opt = torch.optim.SGD(params, lr=lr, foreach=True)

    def step():
        loss = forward(x, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def grad_agreement(torch, jax, m, build, init, x, tgt, tdt, ref, row, sync):
    """One step's loss and gradients from the same values, against jax.grad's."""
    params, forward = build(init, tdt)
    with jax.default_matmul_precision("highest"):
        loss = forward(x, tgt)
        loss.backward()
    sync()
    errs = {n: rel_err(p.grad, r) for n, p, r in zip(m.names, params, ref["grads"])}
    loss_err = abs(loss.item() - ref["loss"]) / abs(ref["loss"])
    worst = worst_of([loss_err, *errs.values()])
    dt = row["dtype"]
    ok = worst <= TOL[dt]
    emit(
        figure="grad_agreement",
        **{k: row[k] for k in ("model", "variant", "dtype", "size")},
        loss=round(loss.item(), 6),
        loss_jax=round(ref["loss"], 6),
        rel_err={k: jnum(e) for k, e in errs.items()},
        worst=jnum(worst),
        tol=TOL[dt],
        ok=ok,
    )
    v = row["variant"]
    if v not in REPORTED_ONLY:
        check(ok, f"{v} {m.name} {dt} {row['size']}: gradients differ from jax.grad (worst {worst:.3g} > {TOL[dt]})")
    row["grad_err"] = worst
    row["grad_ok"] = ok


def timing(torch, handoff, layer, build, init, x, tgt, tdt, args, row, sync, cuda, sleep_cycles):
    params, forward = build(init, tdt)
    step = sgd_step(torch, params, forward, x, tgt)
    for _ in range(args.warmup):
        step()
    sync()
    before = handoff.stats()
    runs = getattr(layer, "executions", None)
    ms = harness.median_ms(step, args.steps, reps=args.reps, sync=sync)
    after = handoff.stats()
    row["ms_per_step"] = round(ms, 4)
    if row["variant"] in ("handoff", "handoff_compiled"):
        for k in ("host_syncs", "waits_enqueued", "releases_deferred"):
            row[k] = after[k] - before[k]
        if runs is not None:
            row["jax_executions_per_step"] = round((layer.executions - runs) / (args.steps * args.reps), 2)
    if cuda and args.graph and row["variant"] in GRAPHED:
        row["ms_per_step_graph"] = round(graph_ms(torch, handoff, step, args, sync), 4)
    if cuda:
        row["sync_warnings"] = count_sync_warnings(torch, step, 5)
        enq, busy = enqueue_behind(torch, step, sleep_cycles)
        row["enqueue_ms_behind_50ms"] = round(enq, 3)
        row["blocked"] = enq > 0.8 * QUEUED_MS or not busy


# The variants whose step `--graph` captures: PyTorch's own and handoff's.
GRAPHED = ("torch", "handoff")
# A captured handoff step against the captured PyTorch step.
GRAPH_TARGET = 1.1


def graph_ms(torch, handoff, step, args, sync):
    """Median ms per replay of `step` captured into one CUDA graph: warmed up on a side
    stream, captured in thread-local mode into `CUDAGraph(keep_graph=True)`, the host
    nodes handoff took out removed (`handoff.prune_graph`), instantiated."""
    harness.on_side_stream(torch, lambda: [step() for _ in range(3)])
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        step()
    handoff.prune_graph(graph)
    graph.instantiate()
    ms = harness.median_ms(graph.replay, args.steps, reps=args.reps, warmup=3, sync=sync)
    del graph
    sync()
    return ms


def reduce_overhead_check(torch, handoff, m, args, dev, cuda, sync):
    """--reduce-overhead-check (see the module docs): for PyTorch's layer, then handoff's,
    the MLP trained eagerly and under torch.compile(mode="reduce-overhead") from the same
    values; the parameters compared, then the compiled steps timed."""
    from torch._dynamo.utils import counters

    if not cuda:
        emit(figure="reduce_overhead", skipped="CUDA only (CUDA graphs)")
        notes.append("reduce_overhead: CUDA only (CUDA graphs); not run")
        return
    size = (args.mlp_sizes or DEFAULT_SIZES[("mlp", args.device)])[0]
    dims = m.parse(size)
    init = m.make_params(torch, dims, dev)
    x, tgt = m.make_data(torch, dims, dev, torch.float32)
    want = [p.cpu().numpy() for p in init]
    torch_ms = None
    for v, layer in (("torch", m.layer_torch), ("handoff", handoff.torch_function(m.layer_jax))):
        row = {"model": "mlp", "variant": v, "dtype": "f32", "size": size, "steps": RO_STEPS, "lr": RO_LR}
        try:
            torch._dynamo.reset()
            breaks, inductor = graph_breaks(), dict(counters["inductor"])
            final = {}
            for mode in ("eager", "reduce-overhead"):
                name = v if mode == "eager" else v + "_compiled"
                params, forward = model_builder(torch, m, layer, name, mode)(init, torch.float32)
                step = sgd_step(torch, params, forward, x, tgt, lr=RO_LR)
                for _ in range(RO_STEPS):
                    step()
                sync()
                final[mode] = [p.detach().clone() for p in params]
            diff = worst_of([rel_err(a, b.cpu().numpy()) for a, b in zip(final["reduce-overhead"], final["eager"])])
            moved = max(rel_err(a, w) for a, w in zip(final["eager"], want))
            row.update(max_rel_diff=jnum(diff), tol=RO_TOL, moved=jnum(moved), graph_breaks=graph_breaks() - breaks)
            row.update({k: n - inductor.get(k, 0) for k, n in counters["inductor"].items() if "cudagraph" in k})
            ms = harness.median_ms(step, args.steps, reps=args.reps, sync=sync)  # the compiled step
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
            emit(figure="reduce_overhead", **row)
            check(False, f"reduce_overhead {v}: raised {row['error'][:300]}")
            continue
        row["ms_per_step"] = round(ms, 4)
        torch_ms = ms if v == "torch" else torch_ms
        if v == "handoff" and torch_ms:
            row["ratio_to_torch"] = round(ms / torch_ms, 3)
        row["ok"] = diff <= RO_TOL and moved >= 100 * RO_TOL and row["graph_breaks"] == 0
        emit(figure="reduce_overhead", **row)
        check(row["ok"], f"reduce_overhead {v}: compiled against eager parameters: rel diff {diff:.3g} "
              f"(tol {RO_TOL}), moved {moved:.3g} (at least {100 * RO_TOL}), {row['graph_breaks']} graph breaks")


def time_floor(torch, jax, jnp, m, init, x, tdt, args):
    """The JAX layer alone: its inputs and its outputs' cotangents already JAX arrays on
    the JAX device matching x's; per step the jitted forward with VJP residuals and the
    jitted VJP, as handoff.torch_function runs them, without a crossing. ms per step."""
    import numpy as np

    jdt = jnp.bfloat16 if tdt == torch.bfloat16 else jnp.float32
    jdev = jax.devices("gpu" if x.device.type == "cuda" else "cpu")[0]
    with torch.no_grad():
        params = [p.to(tdt) for p in init]
        args_t = m.front(params, x)
        outs_t = m.layer_torch(*args_t)

    def to_jax(t, dtype):
        return jax.device_put(jnp.asarray(t.detach().float().cpu().numpy()).astype(dtype), jdev)

    xs = [to_jax(t, jdt) for t in args_t]
    rng = np.random.default_rng(4)
    single = not isinstance(outs_t, tuple)
    outs = (outs_t,) if single else outs_t
    cts = [
        jax.device_put(jnp.asarray(rng.standard_normal(tuple(o.shape), dtype=np.float32)).astype(
            jdt if o.dtype == tdt else jnp.float32), jdev)
        for o in outs
    ]
    cts = cts[0] if single else tuple(cts)
    fwd = jax.jit(lambda *a: jax.vjp(m.layer_jax, *a))
    bwd = jax.jit(lambda vjp, ct: vjp(ct))

    g = None  # the last step's gradients, which the clock waits for

    def step():
        nonlocal g
        _, vjp = fwd(*xs)
        g = bwd(vjp, cts)

    return harness.median_ms(step, args.steps, reps=args.reps, warmup=args.warmup,
                             sync=lambda: jax.block_until_ready(g))


def make_models(torch, jax, jnp):
    """The two models: their PyTorch front, JAX layer, the layer's PyTorch twin, loss."""

    def heads(dim):
        return max(1, dim // 64)

    # ---- mlp: h = x @ w1 + b1; layernorm + gelu + matmul; mean-square loss ----
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

    def mlp_params(torch, dims, dev):
        _, dim = dims
        g = torch.Generator(device=dev).manual_seed(0)
        w1 = torch.randn(dim, dim, device=dev, generator=g) / dim**0.5
        b1 = torch.randn(dim, device=dev, generator=g) * 0.1
        gamma = 1.0 + 0.1 * torch.randn(dim, device=dev, generator=g)
        beta = 0.1 * torch.randn(dim, device=dev, generator=g)
        w2 = torch.randn(dim, dim, device=dev, generator=g) / dim**0.5
        return [w1, b1, gamma, beta, w2]

    def mlp_data(torch, dims, dev, tdt):
        batch, dim = dims
        g = torch.Generator(device=dev).manual_seed(1)
        x = torch.randn(batch, dim, device=dev, generator=g).to(tdt)
        tgt = torch.randn(batch, dim, device=dev, generator=g)
        return x, tgt

    def mlp_front(params, x):
        w1, b1, gamma, beta, w2 = params
        return (x @ w1 + b1, gamma, beta, w2)

    mlp = types.SimpleNamespace(
        name="mlp",
        names=("w1", "b1", "gamma", "beta", "w2"),
        parse=lambda s: tuple(int(v) for v in s.lower().split("x")),
        make_params=mlp_params,
        make_data=mlp_data,
        front=mlp_front,
        front_jax=mlp_front,  # the same operators in jax.numpy
        layer_jax=middle_jax,
        layer_torch=middle_torch,
        loss=lambda y, tgt: (y.float() - tgt).square().mean(),
        loss_jax=lambda y, ts: ((y - ts) ** 2).mean(),
        n_out=1,
    )

    # ---- attn: x = x0 @ w_in + b_in; causal self-attention + residual, two outputs ----
    masks = {}

    def attention_jax(x, wq, wk, wv, wo):
        """Causal multi-head self-attention with a residual: (x + attn(x) @ wo, the
        attention probabilities' entropy per token, mean over heads, float32). Scores,
        softmax and entropy in float32; masked scores -1e9 (finite: no NaN in p log p)."""
        b, t, d = x.shape
        nh = heads(d)
        dh = d // nh

        def split(z):
            return z.reshape(b, t, nh, dh).transpose(0, 2, 1, 3)

        q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
        s = (q @ k.transpose(0, 1, 3, 2)).astype(jnp.float32) * (dh**-0.5)
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
        logp = jax.nn.log_softmax(s, axis=-1)
        p = jnp.exp(logp)
        ent = -(p * logp).sum(-1).mean(1)
        o = (p.astype(x.dtype) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        return x + o @ wo, ent

    def attention_torch(x, wq, wk, wv, wo):
        b, t, d = x.shape
        nh = heads(d)
        dh = d // nh

        def split(z):
            return z.reshape(b, t, nh, dh).transpose(1, 2)

        q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
        s = (q @ k.transpose(-1, -2)).float() * (dh**-0.5)
        key = (t, x.device)
        if key not in masks:
            masks[key] = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        s = s.masked_fill(~masks[key], -1e9)
        logp = torch.log_softmax(s, dim=-1)
        p = logp.exp()
        ent = -(p * logp).sum(-1).mean(1)
        o = (p.to(x.dtype) @ v).transpose(1, 2).reshape(b, t, d)
        return x + o @ wo, ent

    def attn_params(torch, dims, dev):
        _, _, dim = dims
        g = torch.Generator(device=dev).manual_seed(0)
        w_in = torch.randn(dim, dim, device=dev, generator=g) / dim**0.5
        b_in = torch.randn(dim, device=dev, generator=g) * 0.1
        ws = [torch.randn(dim, dim, device=dev, generator=g) / dim**0.5 for _ in range(4)]
        return [w_in, b_in, *ws]

    def attn_data(torch, dims, dev, tdt):
        batch, tokens, dim = dims
        g = torch.Generator(device=dev).manual_seed(1)
        x = torch.randn(batch, tokens, dim, device=dev, generator=g).to(tdt)
        tgt = torch.randn(batch, tokens, dim, device=dev, generator=g)
        return x, tgt

    def attn_front(params, x):
        w_in, b_in, wq, wk, wv, wo = params
        return (x @ w_in + b_in, wq, wk, wv, wo)

    def attn_split(flat, x):
        """torch-jax-interop's one packed output back into the two (views)."""
        n = x.numel()
        return flat[:n].view(x.shape), flat[n:].view(x.shape[:2])

    attn = types.SimpleNamespace(
        name="attn",
        names=("w_in", "b_in", "wq", "wk", "wv", "wo"),
        parse=lambda s: tuple(int(v) for v in s.lower().split("x")),
        make_params=attn_params,
        make_data=attn_data,
        front=attn_front,
        front_jax=attn_front,
        layer_jax=attention_jax,
        layer_torch=attention_torch,
        loss=lambda outs, tgt: (outs[0].float() - tgt).square().mean() + ENT_WEIGHT * outs[1].float().mean(),
        loss_jax=lambda outs, ts: ((outs[0] - ts) ** 2).mean() + ENT_WEIGHT * outs[1].mean(),
        n_out=2,
        split=attn_split,
    )
    for mdl, n in ((mlp, 2), (attn, 3)):
        parse = mdl.parse

        def checked(s, parse=parse, n=n, name=mdl.name):
            dims = parse(s)
            if len(dims) != n:
                raise SystemExit(f"{name} size {s!r}: want {n} numbers joined by x")
            return dims

        mdl.parse = checked
    return {"mlp": mlp, "attn": attn}


def select_route(handoff, route):
    """--route: handoff._handoff._set_route(route) when this handoff has it; returns
    handoff.routes() (None when it has no such function)."""
    setter = getattr(getattr(handoff, "_handoff", None), "_set_route", None)
    if route is not None:
        if setter is None:
            notes.append(f"--route {route}: this handoff has no _handoff._set_route; its only route ran")
        else:
            setter(route)
    routes = handoff.routes() if hasattr(handoff, "routes") else None
    if routes is not None:
        routes = dict(routes)
    if route == "public" and routes is not None:
        ways = {k: routes.get(k) for k in ("torch_to_jax", "jax_to_torch")}
        check(all(v == "public" for v in ways.values()), f"--route public: handoff.routes() gives {ways}")
    return routes


class Unavailable(RuntimeError):
    """A compared package that is installed but does not import (its rows say why)."""


def load_compared(label, module, load):
    """``(load(), version)`` of a compared package (``module`` its import name and
    distribution); (False, None) when it is not installed, (None, the error) when it
    does not import. Each outcome is noted."""
    import importlib.metadata

    try:
        loaded = load()
    except Exception as e:  # noqa: BLE001
        if isinstance(e, ModuleNotFoundError) and e.name == module:
            notes.append(f"{label} not run: not installed")
            return False, None
        notes.append(f"{label} not run: it does not import ({type(e).__name__}: {e})")
        return None, f"does not import: {type(e).__name__}: {e}"
    try:
        version = importlib.metadata.version(module)
    except Exception:  # noqa: BLE001
        version = "unknown"
    return loaded, version


def load_jax2torch(torch, jax):
    """jax2torch as published, with its two removed JAX calls mapped (see the module
    docs); as :func:`load_compared`."""

    def load():
        import jax2torch  # noqa: F401  (loads jax2torch.jax2torch)

        # The package's __init__ rebinds the name jax2torch.jax2torch to the function.
        return sys.modules["jax2torch.jax2torch"]

    impl, version = load_compared("jax2torch", "jax2torch", load)
    if not impl:
        return impl, version
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


def load_torch_jax_interop():
    """torch_jax_interop.WrappedJaxFunction as published (it imports chex, which needs
    absl-py and toolz; torch-jax-interop does not declare chex); as :func:`load_compared`."""

    def load():
        from torch_jax_interop import WrappedJaxFunction

        return WrappedJaxFunction

    return load_compared("torch-jax-interop", "torch_jax_interop", load)


def tji_layer(wrapped, jax, jnp, m):
    """The model's JAX layer through torch_jax_interop.WrappedJaxFunction (see the
    module docs): no parameters held, every tensor an input; two outputs packed."""
    if m.n_out == 1:
        return wrapped(jax.jit(lambda params, *a: m.layer_jax(*a)), jax_params=())

    def packed(params, *a):
        outs = m.layer_jax(*a)
        return jnp.concatenate([o.reshape(-1).astype(outs[0].dtype) for o in outs])

    module = wrapped(jax.jit(packed), jax_params=())

    def call(*tensors):
        return m.split(module(*tensors), tensors[0])

    return call


def jax_reference(jax, jnp, m, init, x, tgt):
    """jax.grad of the same loss in float32 from the same values (rounded to x's dtype
    first, as the variants see them), with "highest" matmul precision."""
    import numpy as np

    def host(t):
        return np.asarray(t.detach().to(x.dtype).float().cpu().numpy())

    ps = [jnp.asarray(host(p)) for p in init]
    xs, ts = jnp.asarray(host(x)), jnp.asarray(tgt.cpu().numpy())

    def loss(ps):
        return m.loss_jax(m.layer_jax(*m.front_jax(ps, xs)), ts)

    with jax.default_matmul_precision("highest"):
        val, grads = jax.jit(jax.value_and_grad(loss))(ps)
    return {"loss": float(val), "grads": [np.asarray(g) for g in grads]}


def rel_err(got, want):
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
    return int(harness.cuda_sleep_cycles_per_ms(torch) * QUEUED_MS)


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
        [rel_err(a, b.detach().cpu().numpy()) for a, b in zip(
            [out["cuda"][0], *out["cuda"][1]], [out["cpu"][0], *out["cpu"][1]])]
    )
    ok = devices == {"cpu": {"cpu"}, "cuda": {"cuda"}} and err <= 1e-4
    emit(figure="device_follows", devices={k: sorted(v) for k, v in devices.items()}, rel_err=jnum(err), ok=ok)
    check(ok, f"handoff.torch_function on CPU and CUDA tensors: devices {devices}, rel err {err:.3g}")


def lifetime_checks(torch, jax, jnp, mlp, middles, variants, trials, cycles, dev):
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

    init = mlp.make_params(torch, (batch, dim), dev)
    gen = torch.Generator(device=dev).manual_seed(2)
    x = torch.randn(batch, dim, device=dev, generator=gen)
    tgt = torch.randn(batch, dim, device=dev, generator=gen)
    fill = jax.jit(lambda v: jnp.full((batch, dim), v, jnp.float32))
    fill(jnp.float32(0)).block_until_ready()
    side = torch.cuda.Stream()  # a pool stream: non-blocking
    results = {}
    for v in variants:
        mid = middles[v]
        if isinstance(mid, Unavailable):
            continue
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

        t0 = time.perf_counter()
        try:
            quiet_loss, quiet = run(False)
            right = 0
            worst = 0.0
            for _ in range(trials):
                loss, grads = run(True)
                errs = [rel_err(g, q.cpu().numpy()) for g, q in zip(grads, quiet)]
                err = worst_of([abs(loss - quiet_loss) / abs(quiet_loss), *errs])
                worst = max(worst, err)
                right += err <= 1e-5
        except Exception as e:  # noqa: BLE001
            torch.cuda.synchronize()
            error = f"{type(e).__name__}: {e}"[:2000]
            emit(figure="lifetime", model="mlp", variant=v, error=error)
            if v not in REPORTED_ONLY:
                check(False, f"{v} lifetime: raised {error[:300]}")
            continue
        results[v] = (right, trials)
        emit(
            figure="lifetime",
            model="mlp",
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


def variant_name(v, versions):
    if v == "jax2torch" or v == "torch_jax_interop":
        version = versions.get(v) or ""
        return v.replace("_", "-") + ("" if version.startswith("does not import") else f" {version}")
    if v == "floor":
        return "floor (JAX layer alone)"
    return v


def table(rows, lifetimes, versions, routes):
    head = "" if routes is None else f"handoff routes: {routes}\n"
    out = [
        "",
        head + "| model | variant | dtype | size | bound | ms/step | vs torch | host syncs | torch sync warnings | enqueue ms behind 50 ms | grad rel err (tol) | lifetime |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = variant_name(r["variant"], versions)
        life = lifetimes.get(r["variant"]) if r["model"] == "mlp" else None
        if "error" in r:
            err = r["error"].replace("|", "/").replace("\n", " ")[:160]
            out.append(
                f"| {r['model']} | {name} | {r['dtype']} | {r['size']} | {r['bound']} | error: {err} "
                "| - | - | - | - | - | - |"
            )
            continue
        if "compile_mode" in r:
            name += f" ({r['compile_mode']})"
        ratio = f"{r['ratio_to_torch']:.2f}x" if r.get("ratio_to_torch") else "-"
        for base in ("torch_compiled", "handoff"):
            if f"ratio_to_{base}" in r:
                ratio += f"; {r[f'ratio_to_{base}']:.2f}x {base}"
        if "met" in r:
            ratio += f" ({'met' if r['met'] else 'not met'}: <= {r['target']})"
        grad = (
            "{:.2g} ({}) {}".format(r["grad_err"], TOL[r["dtype"]], "ok" if r["grad_ok"] else "FAIL")
            if "grad_err" in r
            else "-"
        )
        out.append(
            "| {} | {} | {} | {} | {} | {:.3f} | {} | {} | {} | {} | {} | {} |".format(
                r["model"],
                name,
                r["dtype"],
                r["size"],
                r["bound"],
                r["ms_per_step"],
                ratio,
                r.get("host_syncs", "-"),
                r.get("sync_warnings", "-"),
                (
                    f"{r['enqueue_ms_behind_50ms']:.2f}{' (blocked)' if r['blocked'] else ''}"
                    if "enqueue_ms_behind_50ms" in r
                    else "-"
                ),
                grad,
                f"{life[0]}/{life[1]} right" if life else "-",
            )
        )
    return "\n".join(out)


def ab_report(paths, base):
    """--ab: handoff's step rows of labelled runs, one label against the others."""
    ms = {}  # (label, model, size, dtype, variant) -> [ms]
    ratio = {}  # the same -> [ratio_to_torch]
    labels = []
    bounds = {}
    for path in paths:
        try:
            lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
        except OSError as e:
            print(f"ab: cannot read {path}: {e}", flush=True)
            continue
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("figure") != "step" or "ms_per_step" not in d or d.get("label") is None:
                continue
            key = (d["label"], d["model"], d["size"], d["dtype"], d["variant"])
            ms.setdefault(key, []).append(d["ms_per_step"])
            if d.get("ratio_to_torch"):
                ratio.setdefault(key, []).append(d["ratio_to_torch"])
            bounds[(d["model"], d["size"])] = d.get("bound")
            if d["label"] not in labels:
                labels.append(d["label"])
    if base not in labels or len(labels) < 2:
        print(f"ab: want step rows labelled {base!r} and another label; found {labels}", flush=True)
        return 1
    out = [
        "",
        f"| model | size | dtype | handoff ms ({base}) | handoff ms (other) | ratio | vs torch ({base}) | vs torch (other) | ratio of ratios |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    med = statistics.median
    for cand in (lb for lb in labels if lb != base):
        cells = sorted({k[1:4] for k in ms if k[0] == cand and k[4] == "handoff"})
        for model, size, dtype in cells:
            a, b = ms.get((base, model, size, dtype, "handoff")), ms[(cand, model, size, dtype, "handoff")]
            if not a:
                continue
            r = med(b) / med(a)
            ra, rb = ratio.get((base, model, size, dtype, "handoff")), ratio.get((cand, model, size, dtype, "handoff"))
            rr = med(rb) / med(ra) if ra and rb else None
            emit(
                figure="ab", model=model, size=size, dtype=dtype,
                bound=bounds.get((model, size)), base=base, other=cand,
                base_ms=a, other_ms=b, ratio=round(r, 4),
                base_ratio_to_torch=ra, other_ratio_to_torch=rb,
                ratio_of_ratios=round(rr, 4) if rr else None,
                target=AB_TARGET, met=r <= AB_TARGET,
            )
            out.append(
                f"| {model} | {size} | {dtype} | {med(a):.3f} | {med(b):.3f} ({cand}) | {r:.3f}x "
                f"({'met' if r <= AB_TARGET else 'not met'}: <= {AB_TARGET}) | "
                f"{f'{med(ra):.3f}x' if ra else '-'} | {f'{med(rb):.3f}x' if rb else '-'} | "
                f"{f'{rr:.3f}x' if rr else '-'} |"
            )
    print("\n".join(out), flush=True)
    return 0


if __name__ == "__main__":
    main()
