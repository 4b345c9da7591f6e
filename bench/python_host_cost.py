#!/usr/bin/env python3
"""Host cost of a PyTorch <-> JAX hand-off from Python: handoff's routes beside the
frameworks' own calls, both directions, in one process.

::

    python bench/python_host_cost.py                  # CUDA when usable, else the CPU
    python bench/python_host_cost.py --device cpu --n 2000 --rounds 1

Variants, each on the same ``--size``² f32 tensor (256² by default):

- ``plain``: ``jax.dlpack.from_dlpack(t)`` / ``torch.from_dlpack(a)``
- ``ordered``: ``jax.dlpack.from_dlpack(handoff.ordered(t))`` /
  ``torch.from_dlpack(handoff.ordered(a))``
- ``native``: ``handoff.to_jax(t)`` / ``handoff.to_torch(a)``, route native
- ``public``: ``handoff.to_jax(t)`` / ``handoff.to_torch(a)``, route forced public
- ``framework``: the frameworks' own entry points, the floor:
  ``_jax.dlpack_managed_tensor_to_buffer(t.__dlpack__(stream=s), dev, s, None, dl_type)`` /
  ``torch._C._from_dlpack(_jax.buffer_to_dlpack_managed_tensor(a, stream=s))``

The route is switched with ``handoff._handoff._set_route("auto" | "public")`` before each
call of the two route variants, outside the clock. ``_set_route`` is a test seam: only a
wheel built with the cargo feature ``test-hooks`` has it (the one ``cargo xtask
gpu-bundle`` runs this script with). A wheel without it (as users get it) has its
process's route only, the one ``routes()`` names: that variant is measured and the
other is ``null`` (``HANDOFF_ROUTE=public`` makes it the public one). A wheel without
``handoff.routes()`` has one route, the public one: ``native`` is then ``null`` and
``public`` is its ``handoff.to_jax``/``to_torch`` (so the script also runs with older
wheels, for A/B). ``native`` is ``null`` too where ``routes()`` says a direction is not
native here (its ``reasons`` are printed) or ``HANDOFF_ROUTE=public`` is set. The env
line's ``set_route`` says whether this wheel has the seam.

Stream values as the frameworks pass them: ``s`` is the JAX device's
``get_stream_for_external_ready_events()`` (torch -> JAX) or PyTorch's current stream
(``1`` for the legacy default; JAX -> torch) on CUDA, ``None`` on the CPU.

Each round takes, per direction, ``--n`` turns of all the variants (the first one of a
turn changes from turn to turn, so drift hits all alike), twice: ``call`` (the call alone;
its result is kept in a list, released outside the clock every ``--batch`` turns) and
``cycle`` (the call and ``del`` of its result, which runs the release, inside the
clock). Medians, after ``--warmup`` turns.

Prints JSON lines: ``{"figure": "env", ...}`` (versions, routes and their reasons),
``{"figure": "host_cost", ...}`` per direction and round (``<variant>_us`` and
``<variant>_cycle_us``, ``null`` for a variant this wheel lacks; ``added_us``: ordered
minus plain; ``native_ratio``: native / plain; ``native_over_framework_us``: what the
native route adds to the frameworks' floor), one ``{"figure": "host_cost_target", ...}``
per target with ``met`` (the worst round against the limit; ``null`` when the variant is
missing), ``{"figure": "stats", ...}`` and a last ``{"figure": "result", ...}``.

Targets (reported, not checks): torch -> JAX native <= 0.25 x plain and <= 12 µs; JAX ->
torch native <= 0.35 x plain and <= 4 µs; ``ordered`` adds <= 3 µs to plain both ways.
The µs targets are the GPU machine's; on the CPU they are printed the same way.

Exits 1 (``CHECK FAILED: ...``) when a variant gives wrong values or not a view of the
source, a host sync is counted during the timed loops (``handoff.stats()["host_syncs"]``),
a release leaked, or releases are pending after ``handoff.flush()``. ``--device cuda``
without a usable GPU prints ``SKIPPED: <reason>`` and exits 0 (1 when
``HANDOFF_REQUIRE_GPU=1``, as ``gpu-bundle/run.sh`` sets; there ``auto`` requires it too).
"""

import os
import statistics
import time

import harness  # beside this script, in bench/ and in the GPU bundle
from harness import check, emit, skip

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

VARIANTS = ("plain", "ordered", "native", "public", "framework")

# (direction, JSON field of the host_cost figure, what, limit)
TARGETS = (
    ("torch->jax", "native_ratio", "handoff.to_jax(t) native / jax.dlpack.from_dlpack(t)", 0.25),
    ("torch->jax", "native_us", "handoff.to_jax(t) native, µs", 12.0),
    ("torch->jax", "added_us", "jax.dlpack.from_dlpack(handoff.ordered(t)) minus plain, µs", 3.0),
    ("jax->torch", "native_ratio", "handoff.to_torch(a) native / torch.from_dlpack(a)", 0.35),
    ("jax->torch", "native_us", "handoff.to_torch(a) native, µs", 4.0),
    ("jax->torch", "added_us", "torch.from_dlpack(handoff.ordered(a)) minus plain, µs", 3.0),
)

def measure(variants, n, batch, warmup):
    """Median µs of ``n`` calls of each variant, taken in turns: name -> (call, cycle).

    ``variants``: ``[(name, prepare, call)]``; ``prepare`` (or ``None``) runs before each
    call, outside the clock (the route switch)."""
    pc = time.perf_counter_ns
    k = len(variants)

    def turn(i):
        return variants[i % k:] + variants[:i % k]

    for i in range(warmup):
        for _name, prepare, f in turn(i):
            if prepare is not None:
                prepare()
            r = f()
            del r

    def timed(release_inside):
        """Each variant's ns per call; its result released inside the clock, or kept
        and released every ``batch`` turns outside it."""
        times = {name: [] for name, _, _ in variants}
        kept = []
        for i in range(n):
            for name, prepare, f in turn(i):
                if prepare is not None:
                    prepare()
                t0 = pc()
                r = f()
                if release_inside:
                    del r
                t1 = pc()
                if not release_inside:
                    kept.append(r)
                    del r
                times[name].append(t1 - t0)
            if (i + 1) % batch == 0:
                kept.clear()  # the releases, outside the clock
        kept.clear()
        return times

    call, cycle = timed(False), timed(True)
    return {name: (statistics.median(call[name]) / 1e3, statistics.median(cycle[name]) / 1e3) for name in call}


def rnd(v, digits=2):
    return None if v is None else round(v, digits)


def main():
    ap = harness.parser(__doc__)
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="auto: CUDA when torch, JAX and handoff can use it, else the CPU")
    ap.add_argument("--n", "--calls", dest="n", type=int, default=10_000, help="timed turns per loop")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=100, help="turns between releases of the kept results")
    ap.add_argument("--warmup", type=int, default=300)
    args = ap.parse_args()

    torch, jax, jnp = harness.import_frameworks()
    import numpy as np

    import handoff
    from handoff import _handoff

    device, why_not_cuda = args.device, None
    if device in ("auto", "cuda"):
        why_not_cuda = harness.why_no_cuda(torch, jax, handoff)
        if why_not_cuda is None:
            device = "cuda"
        elif device == "cuda" or harness.gpu_required():
            skip(why_not_cuda)
        else:
            device = "cpu"
    cuda = device == "cuda"
    jdev = jax.devices("gpu" if cuda else "cpu")[0]

    # The private framework calls (checked here, as handoff checks them at import).
    try:
        from jax._src.lib import _jax, jaxlib_extension_version
    except Exception:  # noqa: BLE001
        _jax, jaxlib_extension_version = None, None
    to_buffer = getattr(_jax, "dlpack_managed_tensor_to_buffer", None)
    to_capsule = getattr(_jax, "buffer_to_dlpack_managed_tensor", None)
    torch_from_capsule = getattr(torch._C, "_from_dlpack", None)

    # Routes: native where this wheel has it and says so; public where this wheel can
    # switch to it (the test seam _set_route), where routes() says it is the process's
    # route, or where the wheel has no routes() (an older wheel: its only route).
    set_route = getattr(_handoff, "_set_route", None)
    routes_fn = getattr(handoff, "routes", None)
    initial_route = "public" if os.environ.get("HANDOFF_ROUTE") == "public" else "auto"
    if routes_fn is None:
        set_route = None
    elif set_route is not None:
        set_route(initial_route)
    routes = routes_fn() if routes_fn is not None else None
    native = {
        "torch->jax": routes is not None and routes.get("torch_to_jax") == "native",
        "jax->torch": routes is not None and routes.get("jax_to_torch") == "native",
    }
    public = {d: set_route is not None or not native[d] for d in native}

    n = args.size
    t = torch.arange(n * n, dtype=torch.float32, device=device).reshape(n, n)
    x = jax.device_put(jnp.arange(n * n, dtype=jnp.float32).reshape(n, n), jdev)
    x.block_until_ready()
    if cuda:
        torch.cuda.synchronize()
        jax_stream = jdev.get_stream_for_external_ready_events()
        torch_stream = torch.cuda.current_stream().cuda_stream or 1
    else:
        jax_stream = torch_stream = None  # the CPU device raises UNIMPLEMENTED for a stream
    dl_type = int(t.__dlpack_device__()[0])

    harness.env(
        device=device,
        why_not_cuda=why_not_cuda,
        torch=torch,
        jax=jax,
        jaxlib_extension_version=jaxlib_extension_version,
        handoff=handoff,
        python=harness.PYTHON,
        gpu=torch.cuda.get_device_name(0) if cuda else None,
        jax_device=str(jdev),
        jax_stream=jax_stream,
        torch_stream=torch_stream,
        shape=[n, n],
        n=args.n,
        rounds=args.rounds,
        batch=args.batch,
        routes=routes,
        route_env=os.environ.get("HANDOFF_ROUTE"),
        set_route=set_route is not None,
    )

    # ---- the variants ------------------------------------------------------------------
    jax_from_dlpack, torch_from_dlpack = jax.dlpack.from_dlpack, torch.from_dlpack
    ordered, to_jax, to_torch = handoff.ordered, handoff.to_jax, handoff.to_torch

    def route(name):
        if set_route is None:
            return None
        return lambda: set_route(name)

    if to_buffer is None:
        jax_framework = None
    elif jaxlib_extension_version is not None and jaxlib_extension_version >= 467:
        def jax_framework():
            return to_buffer(t.__dlpack__(stream=jax_stream), jdev, jax_stream, None, dl_type)
    else:
        def jax_framework():
            return to_buffer(t.__dlpack__(stream=jax_stream), jdev, jax_stream, None)

    # jax.dlpack.to_dlpack passes the array's single shard; the array itself is taken
    # too (jaxlib 0.10.2): try it, else pass the shard made once, outside the loop.
    x_buffer = x
    if to_capsule is not None and torch_from_capsule is not None:
        try:
            torch_from_capsule(to_capsule(x_buffer, stream=torch_stream))
        except Exception:  # noqa: BLE001
            x_buffer = x.addressable_data(0)

    def torch_framework():
        return torch_from_capsule(to_capsule(x_buffer, stream=torch_stream))

    directions = {
        "torch->jax": {
            "plain": (None, lambda: jax_from_dlpack(t)),
            "ordered": (None, lambda: jax_from_dlpack(ordered(t))),
            "native": (route("auto"), lambda: to_jax(t)) if native["torch->jax"] else None,
            "public": (route("public"), lambda: to_jax(t)) if public["torch->jax"] else None,
            "framework": (None, jax_framework) if jax_framework is not None else None,
        },
        "jax->torch": {
            "plain": (None, lambda: torch_from_dlpack(x)),
            "ordered": (None, lambda: torch_from_dlpack(ordered(x))),
            "native": (route("auto"), lambda: to_torch(x)) if native["jax->torch"] else None,
            "public": (route("public"), lambda: to_torch(x)) if public["jax->torch"] else None,
            "framework": (None, torch_framework) if to_capsule is not None and torch_from_capsule else None,
        },
    }

    # Right values, and a view of the source (no copy), for every variant.
    want = np.arange(n * n, dtype=np.float32).reshape(n, n)
    for direction, variants in directions.items():
        for name, v in variants.items():
            if v is None:
                continue
            prepare, f = v
            if prepare is not None:
                prepare()
            r = f()
            if direction == "torch->jax":
                got, same = np.asarray(r), r.unsafe_buffer_pointer() == t.data_ptr()
            else:
                got, same = r.cpu().numpy(), r.data_ptr() == x.unsafe_buffer_pointer()
            check(got.shape == want.shape and bool(np.array_equal(got, want)), f"{direction} {name}: wrong values")
            check(same, f"{direction} {name}: not a view of the source")
            del r, got
    if set_route is not None:
        set_route(initial_route)
    handoff.flush()
    start = handoff.stats()

    # ---- the timed loops ---------------------------------------------------------------
    rows = {d: [] for d in directions}
    for rnd_i in range(1, args.rounds + 1):
        for direction, variants in directions.items():
            present = [(name, v[0], v[1]) for name, v in variants.items() if v is not None]
            before = handoff.stats()
            m = measure(present, args.n, args.batch, args.warmup)
            after = handoff.stats()
            if set_route is not None:
                set_route(initial_route)
            call = {name: m[name][0] if name in m else None for name in VARIANTS}
            cycle = {name: m[name][1] if name in m else None for name in VARIANTS}

            def diff(a, b):
                return None if a is None or b is None else a - b

            def ratio(a, b):
                return None if a is None or b is None else a / b

            row = {
                **{f"{name}_us": rnd(call[name]) for name in VARIANTS},
                **{f"{name}_cycle_us": rnd(cycle[name]) for name in VARIANTS},
                "added_us": rnd(diff(call["ordered"], call["plain"])),
                "added_cycle_us": rnd(diff(cycle["ordered"], cycle["plain"])),
                "public_added_us": rnd(diff(call["public"], call["plain"])),
                "native_ratio": rnd(ratio(call["native"], call["plain"]), 3),
                "native_cycle_ratio": rnd(ratio(cycle["native"], cycle["plain"]), 3),
                "native_over_framework_us": rnd(diff(call["native"], call["framework"])),
                "native_over_framework_cycle_us": rnd(diff(cycle["native"], cycle["framework"])),
            }
            rows[direction].append(row)
            emit(figure="host_cost", direction=direction, round=rnd_i, n=args.n, **row,
                 releases_deferred=after["releases_deferred"] - before["releases_deferred"],
                 releases_immediate=after["releases_immediate"] - before["releases_immediate"],
                 host_syncs=after["host_syncs"] - before["host_syncs"],
                 pending_after_loop=after["pending"])

    # ---- the floor: the frameworks' own pieces, each timed alone ------------------------
    # A native crossing calls one piece of each framework; what handoff adds is the rest.
    def alone(make, call):
        """Median µs of ``call(x)`` over ``args.n`` inputs made beforehand by ``make``."""
        times, kept = [], []
        for _ in range(args.n // args.batch):
            inputs = [make() for _ in range(args.batch)]
            for x_ in inputs:
                t0 = time.perf_counter_ns()
                r = call(x_)
                times.append(time.perf_counter_ns() - t0)
                kept.append(r)
            del inputs
            kept.clear()
        return rnd(statistics.median(times) / 1e3)

    if to_buffer is not None and to_capsule is not None and torch_from_capsule is not None:
        extra = (dl_type,) if jaxlib_extension_version is not None and jaxlib_extension_version >= 467 else ()
        emit(
            figure="parts",
            n=args.n,
            torch_dlpack_us=alone(lambda: None, lambda _: t.__dlpack__(stream=jax_stream)),
            jax_to_buffer_us=alone(lambda: t.__dlpack__(stream=jax_stream),
                                   lambda c: to_buffer(c, jdev, jax_stream, None, *extra)),
            jax_to_capsule_us=alone(lambda: None, lambda _: to_capsule(x_buffer, stream=torch_stream)),
            torch_from_capsule_us=alone(lambda: to_capsule(x_buffer, stream=torch_stream), torch_from_capsule),
            note="to_jax's floor is jax_to_buffer_us; to_torch's is jax_to_capsule_us + torch_from_capsule_us "
                 "(the C exchange API's import costs about what torch._C._from_dlpack does)",
        )

    end = handoff.stats()
    check(end["host_syncs"] == start["host_syncs"],
          f"{end['host_syncs'] - start['host_syncs']} host syncs counted during the timed loops")

    for direction, field, what, limit in TARGETS:
        values = [row[field] for row in rows[direction]]
        worst = None if not values or None in values else max(values)
        emit(figure="host_cost_target", direction=direction, target=what, field=field, device=device,
             values=values, worst=worst, limit=limit, met=None if worst is None else worst <= limit)

    handoff.flush()
    final = handoff.stats()
    emit(figure="stats", **{key: final[key] - start.get(key, 0) for key in final if key != "pending"},
         pending_after_flush=final["pending"])
    check(final["pending"] == 0, f"{final['pending']} releases pending after flush")
    check(final["releases_leaked"] == 0, f"{final['releases_leaked']} releases leaked")


if __name__ == "__main__":
    harness.run(main)
