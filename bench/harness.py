"""What the benchmark scripts share: JSON lines, checks, ``SKIPPED:``, timing, setup.

The scripts import it as ``import harness``, from their own directory: ``bench/`` here,
``gpu-bundle/`` on the GPU machine (where the scripts are copied flat, this file beside
them). Standard library only; torch, JAX and handoff are passed in or imported late.

What the scripts print, which ``gpu-bundle/run.sh``, ``bench/summarize.py`` and
``train_three_way.py --ab`` read:

- one JSON object a line (:func:`emit`), ``{"figure": "env", ...}`` among them
  (:func:`env`), and last, where a script checks, ``{"figure": "result", "ok": ...,
  "failures": [...]}`` (:func:`finish`);
- ``CHECK FAILED: <what>`` for each failed check (:func:`check`);
- ``SKIPPED: <reason>`` where the script cannot run here (:func:`skip`).
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import types

PYTHON = sys.version.split()[0]
"""This Python's version, as the ``env`` lines give it (``3.12.3``)."""

NO_TORCH_CUDA = "torch sees no CUDA device"
""":func:`why_no_cuda`'s reason when PyTorch has no CUDA device."""

failures = []
"""What :func:`check` found wrong (its ``what``), in order; :func:`finish` reports it."""

_lead = {}


# ---- JSON lines ------------------------------------------------------------------------


def lead(**fields):
    """Put ``fields`` first into every later :func:`emit` line (``train_three_way.py
    --label``); a field whose value is ``None`` is left out."""
    _lead.clear()
    _lead.update({k: v for k, v in fields.items() if v is not None})


def emit(**fields):
    """Print ``fields`` (after :func:`lead`'s) as one JSON line, flushed."""
    if _lead:
        fields = {**_lead, **fields}
    print(json.dumps(fields), flush=True)


def env(**fields):
    """Emit ``{"figure": "env", **fields}``; a module given as a value stands for its
    ``__version__`` (``torch=torch``). :data:`PYTHON` is this Python's version."""
    emit(figure="env", **{k: getattr(v, "__version__", None) if isinstance(v, types.ModuleType) else v
                          for k, v in fields.items()})


# ---- checks and the result line -------------------------------------------------------


def check(ok, what):
    """Unless ``ok``: note ``what`` in :data:`failures` and print ``CHECK FAILED: what``.
    Returns ``ok``."""
    if not ok:
        failures.append(what)
        print(f"CHECK FAILED: {what}", flush=True)
    return ok


def finish():
    """Emit ``{"figure": "result", "ok": ..., "failures": [...]}`` and exit: 1 when a
    check failed, else 0."""
    emit(figure="result", ok=not failures, failures=failures)
    sys.stdout.flush()
    sys.exit(1 if failures else 0)


def run(main):
    """Run ``main()``, then :func:`finish`. An exception from it is printed and counts as
    a failure (``exception: <repr>``); ``sys.exit`` (a :func:`skip`) passes through."""
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        failures.append(f"exception: {e!r}")
    finish()


# ---- skipping -------------------------------------------------------------------------


def gpu_required():
    """Whether ``HANDOFF_REQUIRE_GPU=1`` (``gpu-bundle/run.sh`` sets it): a GPU script
    that cannot run then fails rather than skips."""
    return os.environ.get("HANDOFF_REQUIRE_GPU") == "1"


def skip(reason, honour_require_gpu=True):
    """Print ``SKIPPED: reason`` and exit: 0, or 1 where :func:`gpu_required` (unless
    ``honour_require_gpu`` is false: then always 0)."""
    print(f"SKIPPED: {reason}", flush=True)
    sys.exit(1 if honour_require_gpu and gpu_required() else 0)


def import_frameworks():
    """``(torch, jax, jax.numpy)``, ``jax.dlpack`` imported too; :func:`skip` when torch
    or JAX does not import."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        skip(f"torch does not import ({e})")
    try:
        import jax
        import jax.dlpack  # noqa: F401
        import jax.numpy as jnp
    except Exception as e:  # noqa: BLE001
        skip(f"jax does not import ({e})")
    return torch, jax, jnp


def why_no_cuda(torch, jax, handoff):
    """Why PyTorch, JAX and handoff cannot all use CUDA here (the first that cannot,
    :data:`NO_TORCH_CUDA` for PyTorch), or ``None`` when they can."""
    if not torch.cuda.is_available():
        return NO_TORCH_CUDA
    try:
        jax.devices("gpu")
    except Exception as e:  # noqa: BLE001
        return f"jax has no GPU backend ({e})"
    if not handoff.cuda_available():
        return "handoff cannot use the CUDA driver"
    return None


# ---- timing ---------------------------------------------------------------------------


def cuda_sleep_cycles_per_ms(torch, stream=None):
    """GPU clock cycles per ms of ``torch.cuda._sleep``, timed on ``stream`` (a new pool
    stream, non-blocking, when ``None``): how the GPU checks queue ~50 ms of work."""
    stream = stream if stream is not None else torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.cuda._sleep(20_000_000)
        e1.record()
    e1.synchronize()
    return 20_000_000 / e0.elapsed_time(e1)


def device_sync(torch, cuda):
    """What waits for PyTorch's queued work: ``torch.cuda.synchronize`` on CUDA, else a
    no-op."""
    return torch.cuda.synchronize if cuda else (lambda: None)


def on_side_stream(torch, fn):
    """Runs ``fn()`` on a side stream ordered after the current one, as
    ``torch.cuda.graph`` asks of a warm-up, then waits for the device; its result."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return result


def graphed_forward(module, x):
    """One call of a module in the ``make_graphed_callables`` checks: ``x`` copied into a
    leaf that needs a gradient, and the module's output on it."""
    x = x.clone().requires_grad_()
    return x, module(x)


def graphed_backward(module, x, out):
    """The backward of :func:`graphed_forward`'s call (loss ``mean(out²)``): the output,
    the input gradient and the parameter gradients, as copies; the gradients are then
    set to ``None``."""
    out.square().mean().backward()
    found = [out.detach().clone(), x.grad.clone(), [p.grad.clone() for p in module.parameters()]]
    module.zero_grad(set_to_none=True)
    return found


def count_right(torch, found, expected):
    """How many of the calls :func:`graphed_backward` gave (``found``) match
    ``expected``'s, in outputs, input gradients and parameter gradients (rtol 1e-4,
    atol 1e-5)."""
    close = lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-5)  # noqa: E731
    right = {"outputs": 0, "input_grads": 0, "param_grads": 0}
    for f, e in zip(found, expected):
        right["outputs"] += close(f[0], e[0])
        right["input_grads"] += close(f[1], e[1])
        right["param_grads"] += all(close(a, b) for a, b in zip(f[2], e[2]))
    return right


def median_ms(step, n, reps=1, warmup=0, sync=None):
    """Median ms per call of ``step()``: ``warmup`` calls, ``sync()``, then ``reps``
    blocks of ``n`` calls, each timed (``time.perf_counter``) up to its ``sync()``.
    ``sync`` waits for the device (:func:`device_sync`; for JAX, a ``step`` that keeps
    its last result and ``jax.block_until_ready`` of it); ``None``: nothing to wait for."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    per = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        per.append((time.perf_counter() - t0) * 1e3 / n)
    return statistics.median(per)


# ---- arguments ------------------------------------------------------------------------


def parser(doc=None):
    """An ``argparse.ArgumentParser`` described by ``doc``'s first paragraph (a script's
    ``__doc__``); none with ``doc`` None."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)


def layer_args(ap, steps):
    """The MLP layer scripts' arguments (``profile_step.py``, ``dispatch_cost.py``):
    ``--device`` (cuda), ``--dtype`` (f32|bf16), ``--size`` (BATCHxDIM, 64x256) and
    ``--steps`` (default ``steps``)."""
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    ap.add_argument("--size", default="64x256")
    ap.add_argument("--steps", type=int, default=steps)


def layer_setup(torch, args):
    """For :func:`layer_args`' arguments: ``(torch dtype, batch, dim)``; ``SKIPPED: no
    CUDA device`` (exit 0) for ``--device cuda`` without one."""
    if args.device == "cuda" and not torch.cuda.is_available():
        skip("no CUDA device", honour_require_gpu=False)
    tdt = torch.float32 if args.dtype == "f32" else torch.bfloat16
    batch, dim = (int(v) for v in args.size.split("x"))
    return tdt, batch, dim
