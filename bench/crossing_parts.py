"""Where a crossing to JAX and a jitted dispatch spend host time on CUDA (a probe): handoff.to_jax
against its parts (the ordered capsule, jaxlib's import) and PyTorch's and JAX's own DLPack paths,
and JAX's dispatch on native and imported arrays, on the main thread, another one and
PyTorch's autograd thread (inside a backward).

    python bench/crossing_parts.py
"""
import os
import threading
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax
import jax.numpy as jnp
import torch
from jax._src.lib import _jax

import handoff
from handoff._handoff import _to_jax_many, _to_torch_many

N = 2000


def timeit(label, fn, n=N, reps=5):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t) / n * 1e6)
    best.sort()
    print(f"{label:55s} {best[len(best) // 2]:8.2f} us  (min {best[0]:.2f})", flush=True)


x = torch.randn(64, 256, device="cuda")
dev = jax.devices()[0]
stream = dev.get_stream_for_external_ready_events()
native = jnp.ones((64, 256))
imported = handoff.to_jax(x)
f1 = jax.jit(lambda a: a * 2)
f4 = jax.jit(lambda a, b, c, d: (a * 2, b + c, d))
fl = jax.jit(lambda xs, ys: [a * 2 for a in xs + ys])

timeit("handoff.to_jax", lambda: handoff.to_jax(x))
timeit("handoff.ordered(x).__dlpack__(stream) only", lambda: handoff.ordered(x).__dlpack__(stream=stream))
timeit("ordered capsule + jaxlib import",
       lambda: _jax.dlpack_managed_tensor_to_buffer(handoff.ordered(x).__dlpack__(stream=stream), dev, stream,
                                                    False, 2))
timeit("x.__dlpack__(stream) (torch's own)", lambda: x.__dlpack__(stream=stream))
timeit("torch capsule + jaxlib import",
       lambda: _jax.dlpack_managed_tensor_to_buffer(x.__dlpack__(stream=stream), dev, stream, False, 2))
timeit("jax.dlpack.from_dlpack(x)", lambda: jax.dlpack.from_dlpack(x))
timeit("handoff.to_torch(native)", lambda: handoff.to_torch(native))
timeit("jit a*2 (native input)", lambda: f1(native))
timeit("jit a*2 (imported input)", lambda: f1(imported))
timeit("jit a*2 (fresh imported input each call)", lambda: f1(handoff.to_jax(x)))
timeit("jit 4 in/3 out (native)", lambda: f4(native, native, native, native))
timeit("jit 4 in/3 out (imported)", lambda: f4(imported, imported, imported, imported))
timeit("jit lists 2+2 (native)", lambda: fl([native, native], [native, native]))


def on_thread(label, fn):
    def body():
        timeit(label + " [other thread]", fn)
    t = threading.Thread(target=body)
    t.start()
    t.join()


def on_autograd_thread(label, fn):
    """Times `fn` inside a backward, on PyTorch's autograd device thread."""
    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.clone()

        @staticmethod
        def backward(ctx, g):
            timeit(label + " [autograd thread]", fn)
            return g

    Probe.apply(torch.ones(4, device="cuda", requires_grad=True)).sum().backward()


timeit("_to_jax_many([x])", lambda: _to_jax_many([x]))
timeit("_to_torch_many([native])", lambda: _to_torch_many([native]))
timeit("torch.cuda.current_stream()", torch.cuda.current_stream)
for label, fn in [("jit a*2 (native input)", lambda: f1(native)),
                  ("handoff.to_jax", lambda: handoff.to_jax(x)),
                  ("jit 4 in/3 out (imported)", lambda: f4(imported, imported, imported, imported)),
                  ("_to_jax_many([x])", lambda: _to_jax_many([x])),
                  ("_to_torch_many([native])", lambda: _to_torch_many([native])),
                  ("torch capsule + jaxlib import",
                   lambda: _jax.dlpack_managed_tensor_to_buffer(x.__dlpack__(stream=stream), dev, stream, False, 2)),
                  ("torch.cuda.current_stream()", torch.cuda.current_stream)]:
    on_thread(label, fn)
    on_autograd_thread(label, fn)
