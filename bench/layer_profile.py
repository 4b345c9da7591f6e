"""Where an eager torch_function call spends its host time on CUDA (a profiling probe,
not a benchmark): times per named function on every thread, the autograd thread hop,
cProfile of the forward (main thread) and of the backward (the autograd device thread),
and the reference costs (a no-op Python autograd.Function, one crossing each way, one
jitted dispatch).

    python bench/layer_profile.py cuda 300   # device, calls per timing block
"""
import cProfile
import collections
import io
import os
import pstats
import sys
import threading
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax
import jax.numpy as jnp
import torch

import handoff

DEV = sys.argv[1] if len(sys.argv) > 1 else "cuda"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 300
print("handoff", handoff.__file__, "device", DEV, flush=True)
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)


def timeit(label, fn, n=N, reps=5):
    for _ in range(20):
        fn()
    sync()
    best = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best.append((time.perf_counter() - t) / n * 1e6)
    best.sort()
    print(f"{label:40s} {best[len(best) // 2]:9.1f} us  (min {best[0]:.1f})", flush=True)
    return best[len(best) // 2]


h = torch.randn(64, 256, device=DEV, requires_grad=True)
ct = torch.randn(64, 256, device=DEV)
ident = handoff.torch_function(lambda x: x)
double = handoff.torch_function(lambda x: x * 2)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "gpu-bundle"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from profile_step import layer_jax  # noqa: E402

layer = handoff.torch_function(layer_jax)
g = torch.ones(256, device=DEV, requires_grad=True)
b = torch.zeros(256, device=DEV, requires_grad=True)
w = (torch.randn(256, 256, device=DEV) / 16).requires_grad_()


def fb(f, *a):
    def step():
        for t in a:
            t.grad = None
        f(*a).backward(ct)
    return step


class Clone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, gy):
        return gy


class Noop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, gy):
        return gy


print("== reference costs")
timeit("torch autograd.Function clone fwd+bwd", fb(Clone.apply, h))
timeit("torch autograd.Function view fwd+bwd", fb(Noop.apply, h))
timeit("torch x*2 fwd+bwd", fb(lambda x: x * 2, h))
hd = h.detach()
timeit("to_jax(1)", lambda: handoff.to_jax(hd))
from handoff import _handoff as ext  # noqa: E402

if hasattr(ext, "_to_jax_many"):
    timeit("_to_jax_many([1])", lambda: ext._to_jax_many([hd]))
    timeit("_to_jax_many([4])", lambda: ext._to_jax_many([hd, hd, hd, hd]))
a = handoff.to_jax(hd)
timeit("to_torch(1)", lambda: handoff.to_torch(a))
if hasattr(ext, "_to_torch_many"):
    timeit("_to_torch_many([1])", lambda: ext._to_torch_many([a]))
    timeit("_to_torch_many([4])", lambda: ext._to_torch_many([a, a, a, a]))
jid = jax.jit(lambda x: x * 2)
timeit("jax.jit(x*2) dispatch", lambda: jid(a))
timeit("torch.cuda.current_stream()" if DEV == "cuda" else "noop", (torch.cuda.current_stream if DEV == "cuda" else (lambda: None)))

# The floor of an identity layer by hand: the same crossings and executions, no autograd.
fwd_j = jax.jit(lambda x: jax.vjp(lambda v: v * 1.0, x))
bwd_j = jax.jit(lambda vjp, c: vjp(c))
if hasattr(ext, "_to_jax_many"):
    def by_hand():
        (x,) = ext._to_jax_many([hd])
        out, vjp = fwd_j(x)
        (y,) = ext._to_torch_many([out])
        (c,) = ext._to_jax_many([ct])
        (gx,) = bwd_j(vjp, c)
        ext._to_torch_many([gx])
    timeit("by hand: 2 crossings each way + 2 jits", by_hand)
    def by_hand_jax_only():
        out, vjp = fwd_j(a)
        bwd_j(vjp, a)
    timeit("by hand: the 2 jits only", by_hand_jax_only)

print("== handoff totals")
timeit("identity fwd+bwd", fb(ident, h))
timeit("x*2 fwd+bwd", fb(double, h))
timeit("layer fwd+bwd", fb(layer, h, g, b, w))
timeit("identity fwd (grad)", lambda: ident(h))
with torch.no_grad():
    timeit("identity fwd (no_grad)", lambda: ident(h))
with torch.autograd.set_multithreading_enabled(False):
    timeit("identity fwd+bwd, backward on this thread", fb(ident, h))
    timeit("torch Function clone, backward on this thread", fb(Clone.apply, h))
y = ident(h)
timeit("identity bwd only (retain)", lambda: y.backward(ct, retain_graph=True))

try:
    from handoff import _program, _torch_ops
except ImportError:
    print("old wheel: no per-function breakdown")
    sys.exit(0)

print("== per function (us per call; main / other threads)")
acc = collections.defaultdict(lambda: [0, 0])
MAIN = threading.main_thread().ident


def wrap(owner, name, label=None, static=False):
    f = getattr(owner, name)
    f = f.__func__ if static and hasattr(f, "__func__") else f
    label = label or f"{getattr(owner, '__name__', owner)}.{name}"

    def w(*a, **k):
        t = time.perf_counter_ns()
        try:
            return f(*a, **k)
        finally:
            key = (label, "main" if threading.get_ident() == MAIN else "other")
            acc[key][0] += time.perf_counter_ns() - t
            acc[key][1] += 1
    setattr(owner, name, staticmethod(w) if static else w)


wrap(_program.Program, "forward")
wrap(_program.Program, "backward")
wrap(_program, "_to_jax_many", "_to_jax_many")
wrap(_program, "_to_torch_many", "_to_torch_many")
wrap(_program, "_as_jax", "_as_jax")
wrap(_program, "_distinct", "_distinct")
wrap(_program.Program, "traced")
wrap(_torch_ops, "_setup_context", "_setup_context")
wrap(_torch_ops, "_backward", "_backward")
wrap(_torch_ops._Call, "forward", "_Call.forward", static=True)
wrap(_torch_ops._Call, "backward", "_Call.backward", static=True)
wrap(_torch_ops, "call", "_torch_ops.call")
wrap(type(ident), "__call__", "TorchFunction.__call__")
wrap(_program.Program, "reached")
wrap(_program.Program, "saved")
stamps = {}
orig_bwd = _torch_ops._Call.backward


def stamped(ctx, *gs):
    stamps["enter"] = time.perf_counter_ns()
    try:
        return orig_bwd(ctx, *gs)
    finally:
        stamps["exit"] = time.perf_counter_ns()


_torch_ops._Call.backward = staticmethod(stamped)
for lbl, step in (("identity", fb(ident, h)), ("layer", fb(layer, h, g, b, w))):
    for _ in range(20):
        step()
    # the traced programs' jitted callables
    for prog in list(_program.Program.__dict__.get("_all", [])):
        pass
    acc.clear()
    hop_in = hop_out = 0
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(N):
        for t in (h, g, b, w):
            t.grad = None
        yy = (ident(h) if lbl == "identity" else layer(h, g, b, w))
        t1 = time.perf_counter_ns()
        yy.backward(ct)
        t2 = time.perf_counter_ns()
        hop_in += stamps["enter"] - t1
        hop_out += t2 - stamps["exit"]
    total = (time.perf_counter_ns() - t0) / N / 1e3
    print(f"-- {lbl}: {total:.1f} us per step (instrumented); backward() to _Call.backward entry "
          f"{hop_in / N / 1e3:.1f} us, exit to backward() return {hop_out / N / 1e3:.1f} us")
    for (name, th), (ns, n) in sorted(acc.items(), key=lambda kv: -kv[1][0]):
        print(f"   {name:28s} {th:5s} {ns / n / 1e3:8.1f} us x {n / N:.0f}")

print("== cProfile, forward on the main thread (identity, grad)")
pr = cProfile.Profile()
pr.enable()
for _ in range(N):
    yy = ident(h)
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print(s.getvalue())

print("== cProfile, backward on its thread (identity)")
bp = cProfile.Profile()


def profiled(ctx, *gs):
    bp.enable()
    try:
        return orig_bwd(ctx, *gs)
    finally:
        bp.disable()


_torch_ops._Call.backward = staticmethod(profiled)
for _ in range(N):
    ident(h).backward(ct)
s = io.StringIO()
pstats.Stats(bp, stream=s).sort_stats("tottime").print_stats(25)
print(s.getvalue())
