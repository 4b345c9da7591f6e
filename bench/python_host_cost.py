#!/usr/bin/env python3
"""Host cost of ``handoff.ordered`` (issue 32): how much a hand-off through
``handoff.ordered`` adds to a plain ``from_dlpack``, both directions, in one process.

::

    python bench/python_host_cost.py                 # CUDA (the GPU machine); skips without one
    python bench/python_host_cost.py --device cpu    # the same measurement on the CPU

For each direction (``jax->torch``: ``torch.from_dlpack(x)``, ``torch->jax``:
``jax.dlpack.from_dlpack(t)``) and each round, ``--calls`` calls of the plain exchange, as
many through ``handoff.ordered``, and as many through ``handoff.ordered`` after
``handoff._handoff._take_returns()`` (``added_taking_returns_us``: what consumers let go
of on their own threads dropped by this thread at its next hand-off, instead of by the
reaper's thread; a diagnostic, in a second loop beside plain again), and, ``torch->jax``
only, as many through ``handoff.ordered`` with ``handoff._handoff._set_deleters_on_main_thread(False)``
(``added_releasing_thread_us``: PyTorch's deleter run on the thread that releases the
hand-off, with the GIL taken there, instead of queued as a pending call for the main
thread; ``added_releasing_thread_nogil_us``: the same without taking the GIL, as the plain
call has JAX call it; each in a loop of its own beside plain, the switch set back after;
never for ``jax->torch``, whose producer's deleter must run on the main thread), in turns
(which goes first changes from turn to turn), on a ``--size``² f32 tensor, after 300
warm-up turns. Each call is timed
with ``time.perf_counter_ns`` twice: ``call`` (the exchange alone; the result is dropped
after the clock stops, as ``gpu_h200.py``'s host cost does) and ``cycle`` (the exchange
and dropping its result, which runs the release). Medians.

Prints JSON lines: ``{"figure": "host_cost", ...}`` per direction and round (plain,
ordered and added µs, call and cycle; ``pending_calls``, ``pending_jobs`` and
``pending_call_us_per_job``: the pending calls that ran producers' deleters on the main
thread during the plain/ordered loop, the deleters they ran, and the µs spent inside them
per deleter, CPython's scheduling of them not included), ``{"figure": "host_cost_breakdown", ...}`` per
direction (the wrapper's steps timed alone, each beside the plain step it replaces), one
``{"figure": "host_cost_summary", ...}`` per direction with ``met``: the largest added
``call`` µs of the rounds <= ``--target`` (3 µs), and a last ``{"figure": "result", ...}``.
Exits 1 when a check fails: the results must be right, and no host sync may be counted
(``handoff.stats()["host_syncs"]`` unchanged until the final ``flush``, nothing pending
after it, nothing leaked). Missing the target is reported, not a failure.

Without a usable GPU (``--device cuda``) it prints ``SKIPPED: <reason>`` and exits 0
(1 when ``HANDOFF_REQUIRE_GPU=1``).
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

failures = []


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


def paired(variants, calls, warmup=300):
    """Median µs of ``calls`` calls of each variant (a dict of name: function), taken in
    turns (the first one changes from turn to turn): name -> (call, cycle)."""
    pc = time.perf_counter_ns
    times = {name: ([], []) for name in variants}
    order = list(variants.items())
    for _ in range(warmup):
        for _name, f in order:
            r = f()
            del r
    for i in range(calls):
        turn = order[i % len(order):] + order[:i % len(order)]
        for name, f in turn:
            t0 = pc()
            r = f()
            t1 = pc()
            del r
            t2 = pc()
            times[name][0].append(t1 - t0)
            times[name][1].append(t2 - t0)
    return {name: (statistics.median(c) / 1e3, statistics.median(y) / 1e3) for name, (c, y) in times.items()}


def median_us(f, calls, warmup=300):
    pc = time.perf_counter_ns
    for _ in range(warmup):
        r = f()
        del r
    s = []
    for _ in range(calls):
        t0 = pc()
        r = f()
        s.append(pc() - t0)
        del r
    return statistics.median(s) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--target", type=float, default=3.0, help="µs added at most (default 3)")
    args = ap.parse_args()

    try:
        import torch
    except Exception as e:  # noqa: BLE001
        skip(f"torch does not import ({e})")
    if args.device == "cuda" and not torch.cuda.is_available():
        skip("torch sees no CUDA device")
    try:
        import jax
        import jax.dlpack
        import jax.numpy as jnp
    except Exception as e:  # noqa: BLE001
        skip(f"jax does not import ({e})")
    try:
        jdev = jax.devices("gpu" if args.device == "cuda" else "cpu")[0]
    except Exception as e:  # noqa: BLE001
        skip(f"jax has no {args.device} backend ({e})")
    import handoff

    if args.device == "cuda" and not handoff.cuda_available():
        skip("handoff cannot use the CUDA driver")

    n = args.size
    t = torch.arange(n * n, dtype=torch.float32, device=args.device).reshape(n, n)
    x = jax.device_put(jnp.arange(n * n, dtype=jnp.float32).reshape(n, n), jdev)
    x.block_until_ready()
    if args.device == "cuda":
        torch.cuda.synchronize()

    emit(
        figure="env",
        device=args.device,
        torch=torch.__version__,
        jax=jax.__version__,
        handoff=handoff.__version__,
        python=sys.version.split()[0],
        gpu=torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        jax_device=str(jdev),
        shape=[n, n],
        calls=args.calls,
        rounds=args.rounds,
    )

    # Right values both ways, through handoff (and the hand-off really is a view).
    y = torch.from_dlpack(handoff.ordered(x))
    check(bool(torch.equal(y.cpu(), torch.arange(n * n, dtype=torch.float32).reshape(n, n))), "jax->torch: wrong values")
    z = jax.dlpack.from_dlpack(handoff.ordered(t))
    check(bool(jnp.array_equal(z, jnp.arange(n * n, dtype=jnp.float32).reshape(n, n))), "torch->jax: wrong values")
    check(z.unsafe_buffer_pointer() == t.data_ptr(), "torch->jax: not a view of the tensor")
    del y, z
    handoff.flush()
    start = handoff.stats()

    # A third variant drops what came home to this thread first (handoff._take_returns):
    # JAX lets go of a view on PJRT's thread, which posts the hand-off back to this,
    # the making thread; this thread never releases one itself in this loop, so without
    # it they wait reaper::STALE for the reaper's thread, which then also queues each
    # producer's deleter as a pending call for the main thread. Diagnostic (issue 32).
    from handoff import _handoff

    _take_returns = getattr(_handoff, "_take_returns", None)  # absent in wheels before it

    def taking(f):
        def g():
            _take_returns()
            return f()
        return g

    # A fourth (torch->jax only): PyTorch's deleter run by whichever thread releases the
    # hand-off, instead of as a pending call on the main thread (benchmarks only; JAX's
    # deleter must run on the main thread, so never for jax->torch). Diagnostic (issue 32).
    _set_deleters = getattr(_handoff, "_set_deleters_on_main_thread", None)  # absent before it
    _pending_counts = getattr(_handoff, "_pending_call_counts", None)

    def on_releasing_thread(plain, ordered, gil):
        if _set_deleters is None:
            return (None, None)
        _set_deleters(False, gil=gil)
        try:
            mr = paired({"plain": plain, "releasing": ordered}, args.calls)
        finally:
            _set_deleters(True)
        (rpc, rpy), (rc, ry) = mr["plain"], mr["releasing"]
        return (round(rc - rpc, 2), round(ry - rpy, 2))

    directions = (
        ("jax->torch", "torch.from_dlpack", lambda: torch.from_dlpack(x), lambda: torch.from_dlpack(handoff.ordered(x))),
        ("torch->jax", "jax.dlpack.from_dlpack", lambda: jax.dlpack.from_dlpack(t),
         lambda: jax.dlpack.from_dlpack(handoff.ordered(t))),
    )
    added = {d: [] for d, *_ in directions}
    for rnd in range(1, args.rounds + 1):
        for direction, call, plain, ordered in directions:
            before = handoff.stats()
            counts_before = _pending_counts() if _pending_counts is not None else None
            m = paired({"plain": plain, "ordered": ordered}, args.calls)
            counts_after = _pending_counts() if _pending_counts is not None else None
            after = handoff.stats()
            pending = {"pending_calls": None, "pending_jobs": None, "pending_call_us_per_job": None}
            if counts_before is not None:
                calls_, jobs_, ns_ = (a - b for a, b in zip(counts_after, counts_before))
                pending = {"pending_calls": calls_, "pending_jobs": jobs_,
                           "pending_call_us_per_job": round(ns_ / jobs_ / 1e3, 3) if jobs_ else None}
            (pc_, py_), (oc, oy) = m["plain"], m["ordered"]
            added[direction].append(oc - pc_)
            # The variant in a loop of its own (beside plain again): in the same turns it
            # would also take what came home from the other variant's hand-offs.
            taking_added = (None, None)
            if _take_returns is not None:
                mt = paired({"plain": plain, "taking": taking(ordered)}, args.calls)
                (tpc, tpy), (tc, ty) = mt["plain"], mt["taking"]
                taking_added = (round(tc - tpc, 2), round(ty - tpy, 2))
            releasing_added = releasing_nogil_added = (None, None)
            if direction == "torch->jax":
                releasing_added = on_releasing_thread(plain, ordered, gil=True)
                releasing_nogil_added = on_releasing_thread(plain, ordered, gil=False)
            # Where the releases went: deferred behind an event (the reaper's) or at
            # once, and how many were still queued when the loop ended.
            emit(figure="host_cost", direction=direction, call=call, round=rnd, calls=args.calls,
                 plain_us=round(pc_, 2), ordered_us=round(oc, 2), added_us=round(oc - pc_, 2),
                 plain_cycle_us=round(py_, 2), ordered_cycle_us=round(oy, 2), added_cycle_us=round(oy - py_, 2),
                 added_taking_returns_us=taking_added[0], added_taking_returns_cycle_us=taking_added[1],
                 added_releasing_thread_us=releasing_added[0], added_releasing_thread_cycle_us=releasing_added[1],
                 added_releasing_thread_nogil_us=releasing_nogil_added[0],
                 added_releasing_thread_nogil_cycle_us=releasing_nogil_added[1],
                 **pending,
                 releases_deferred=after["releases_deferred"] - before["releases_deferred"],
                 releases_immediate=after["releases_immediate"] - before["releases_immediate"],
                 pending_after_loop=after["pending"])

    # Where the added time goes: each step of the wrapper timed alone (warm), beside
    # the plain step it replaces. The producer's __dlpack__ is asked with the stream
    # value the consumer would pass; its capsule is dropped unconsumed (for handoff's
    # capsule that runs the release).
    if args.device == "cuda":
        torch_stream = torch.cuda.current_stream().cuda_stream or 1
        try:
            jax_stream = jdev.get_stream_for_external_ready_events()
        except Exception:  # noqa: BLE001
            jax_stream = None
    else:
        torch_stream = jax_stream = None
    wt, wx = handoff.ordered(t), handoff.ordered(x)
    k = args.calls
    torch_kw = {"max_version": (1, 0)} if torch_stream is None else {"max_version": (1, 0), "stream": torch_stream}
    emit(figure="host_cost_breakdown", direction="torch->jax", calls=k, jax_stream=jax_stream,
         producer_dlpack_device_us=round(median_us(lambda: t.__dlpack_device__(), k), 2),
         ordered_us=round(median_us(lambda: handoff.ordered(t), k), 2),
         producer_dlpack_us=round(median_us(lambda: t.__dlpack__(stream=jax_stream), k), 2),
         wrapper_dlpack_us=round(median_us(lambda: wt.__dlpack__(stream=jax_stream), k), 2),
         plain_with_premade_wrapper_us=round(median_us(lambda: jax.dlpack.from_dlpack(wt), k), 2),
         plain_us=round(median_us(lambda: jax.dlpack.from_dlpack(t), k), 2))
    emit(figure="host_cost_breakdown", direction="jax->torch", calls=k, torch_stream=torch_stream,
         producer_dlpack_device_us=round(median_us(lambda: x.__dlpack_device__(), k), 2),
         ordered_us=round(median_us(lambda: handoff.ordered(x), k), 2),
         producer_dlpack_us=round(median_us(lambda: x.__dlpack__(**torch_kw), k), 2),
         wrapper_dlpack_us=round(median_us(lambda: wx.__dlpack__(**torch_kw), k), 2),
         plain_with_premade_wrapper_us=round(median_us(lambda: torch.from_dlpack(wx), k), 2),
         plain_us=round(median_us(lambda: torch.from_dlpack(x), k), 2))
    del wt, wx

    for direction, values in added.items():
        worst = max(values)
        emit(figure="host_cost_summary", direction=direction, added_us=[round(v, 2) for v in values],
             max_added_us=round(worst, 2), target_us=args.target, met=worst <= args.target)

    end = handoff.stats()
    check(end["host_syncs"] == start["host_syncs"], "host syncs were counted during the measurement")
    handoff.flush()
    final = handoff.stats()
    emit(figure="stats", **{key: final[key] - start.get(key, 0) for key in final if key != "pending"},
         pending_after_flush=final["pending"])
    check(final["pending"] == 0, "releases pending after flush")
    check(final["releases_leaked"] == start["releases_leaked"], "releases leaked")


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        failures.append(f"exception: {e!r}")
    emit(figure="result", ok=not failures, failures=failures)
    sys.stdout.flush()
    sys.exit(1 if failures else 0)
