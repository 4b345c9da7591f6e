#!/usr/bin/env python3
"""handoff for Python on a CUDA GPU, with the machine's own PyTorch and JAX.

Run by ``gpu-bundle/run.sh`` (the bundled wheel on ``PYTHONPATH``); not collected by
pytest. Prints one JSON line per figure and a last ``{"figure": "result", ...}`` line;
exits 1 when a check fails. Without a usable GPU it prints ``SKIPPED: <reason>`` and
exits 0, or 1 when ``HANDOFF_REQUIRE_GPU=1``. A watchdog ends the process (exit 1,
with every thread's traceback) after ``HANDOFF_GPU_TIMEOUT`` seconds (default 480).

Figures:

- ``routes``: ``handoff.routes()`` (the route each crossing takes here, and why); ``null``
  with a wheel before native crossings, whose ``to_torch``/``to_jax`` are the public
  route. Each route is tested below: ``native`` through ``handoff._handoff._set_route("auto")``
  where ``routes()`` says native, ``public`` through ``_set_route("public")``.
  ``HANDOFF_REQUIRE_NATIVE=1`` fails the run where a direction is not native.
- ``drop_hazard``: the stale-read scenario, 20 trials per direction and variant, 16,777,216-element
  f32 arrays. JAX -> PyTorch: JAX's producer ~50 ms of work; PyTorch's read (on a
  pool stream, non-blocking) queued behind ~50 ms of PyTorch work; both owners deleted;
  JAX then allocates and overwrites same-size arrays. Through ``handoff.ordered``
  (``handoff_right``) and ``handoff.to_torch`` on each route (``route_right``) every
  trial must be right; the plain ``torch.from_dlpack(jax_out)`` control, in the same
  run, must corrupt at least one (else the scenario proves nothing). PyTorch -> JAX the
  same way (PyTorch's producer behind ~50 ms, JAX's read behind ~50 ms of JAX work,
  PyTorch reallocating the tensor's memory and writing -1 on its stream), through
  ``handoff.ordered`` and ``handoff.to_jax`` on each route; plain
  ``jax.dlpack.from_dlpack(t)`` reported as it comes (PJRT calls PyTorch's deleter only
  after the queued execution: 0 wrong on the H200 so far), and the control that must
  corrupt (``unowned_wrong``): the same call on a capsule that does not keep the tensor
  alive (PyTorch's own stream wait, a deleter that frees only the capsule's struct),
  i.e. the release not ordered after JAX's work.
- ``ordering``: per direction and route, 20 trials with ~50 ms queued before the
  producer's write (JAX -> PyTorch: JAX's busy program writes the array, PyTorch reads
  it on a pool stream right after ``handoff.to_torch``; PyTorch -> JAX: the write queued
  behind ~50 ms on a pool stream, JAX reads it right after ``handoff.to_jax``): every
  read right, every call under 10 ms, a PyTorch event recorded on the pool stream after
  the call still pending (the wait is on the GPU), 0 host syncs. The control of each
  direction leaves the wait out and must read stale data at least once, else the test
  proves nothing: JAX ordering another, idle PyTorch stream instead of the reader's
  (``torch.from_dlpack`` of the array with the stream replaced), and PyTorch asked for
  no synchronization (``stream=-1``) under ``jax.dlpack.from_dlpack``.
- ``cuda_array_interface``: an object exposing only ``__cuda_array_interface__`` v3
  (PyTorch memory written on a producer stream): ordered with a GPU wait, kept alive
  until the consumer's work is done (20 trials under churn), ``readonly`` honored.
- ``no_host_sync``: with ~50 ms queued, ``torch.from_dlpack(handoff.ordered(a))`` and
  ``jax.dlpack.from_dlpack(handoff.ordered(t))`` return in well under 10 ms, the GPU
  still busy after, 0 host syncs counted.
- ``host_cost``: median host time of 10,000 calls each, plain and through handoff,
  interleaved in the same run.
"""

import ctypes
import faulthandler
import itertools
import os
import statistics
import sys
import time

import harness  # beside this script, in bench/ and in the GPU bundle
from harness import check, emit, skip

# dlpack_ctypes (its DLPack structs): beside this script in the GPU bundle, in
# python/tests/ (pytest's helper) in the repository.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python", "tests"))

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
faulthandler.dump_traceback_later(float(os.environ.get("HANDOFF_GPU_TIMEOUT", "480")), exit=True)

N = 16_777_216
TRIALS = int(os.environ.get("HANDOFF_GPU_TRIALS", "20"))
HOST_COST_CALLS = int(os.environ.get("HANDOFF_GPU_CALLS", "10000"))
QUEUED_MS = 50.0
CHURN = 6
MATRIX = 8192  # bf16 matmuls of MATRIX x MATRIX keep JAX busy


def main():
    torch, jax, jnp = harness.import_frameworks()
    import handoff

    why = harness.why_no_cuda(torch, jax, handoff)
    if why:
        skip(why)
    harness.env(
        torch=torch,
        jax=jax,
        handoff=handoff,
        gpu=torch.cuda.get_device_name(0),
        jax_device=str(jax.devices("gpu")[0]),
        python=harness.PYTHON,
    )
    start_stats = handoff.stats()

    # ---- calibration: ~50 ms of queued work on each side --------------------------
    side = torch.cuda.Stream()  # a pool stream: non-blocking, unlike the legacy default
    cycles_per_ms = harness.cuda_sleep_cycles_per_ms(torch, side)
    sleep_cycles = int(cycles_per_ms * QUEUED_MS)

    # JAX's busy work: a chain of matmuls unrolled in one program (all enqueued at once;
    # a while loop's condition would be read back by XLA's host thread every pass).
    # The chain multiplies by the identity, which XLA cannot know: the result, read
    # back as a 0.0 flag, makes the final write depend on the whole chain.
    eye = jnp.eye(MATRIX, dtype=jnp.bfloat16)

    def chain_flag(w, reps):
        m = w
        for _ in range(reps):
            m = m @ w
        return jnp.where(m[0, 0] == 3.0, 1.0, 0.0).astype(jnp.float32)

    def programs(reps):
        @jax.jit
        def produce(k, w):
            """~reps matmuls, then every element is k."""
            return jnp.full((N,), k, jnp.float32) + chain_flag(w, reps)

        @jax.jit
        def consume(x, w):
            """Reads x only after ~reps matmuls: returns 2 * x."""
            return x * (2.0 + chain_flag(w, reps))

        return produce, consume

    probe_reps = 8
    produce, _ = programs(probe_reps)
    produce(jnp.float32(1), eye).block_until_ready()
    t0 = time.perf_counter()
    produce(jnp.float32(1), eye).block_until_ready()
    per_matmul_ms = (time.perf_counter() - t0) * 1e3 / probe_reps
    reps = max(1, min(4000, round(QUEUED_MS / per_matmul_ms)))
    produce, consume = programs(reps)
    fill = jax.jit(lambda v: jnp.full((N,), v, jnp.float32))
    produce(jnp.float32(1), eye).block_until_ready()
    consume(jnp.ones((N,), jnp.float32), eye).block_until_ready()
    fill(jnp.float32(0)).block_until_ready()
    t0 = time.perf_counter()
    produce(jnp.float32(1), eye).block_until_ready()
    jax_busy_ms = (time.perf_counter() - t0) * 1e3
    emit(
        figure="calibration",
        torch_sleep_cycles=sleep_cycles,
        cycles_per_ms=round(cycles_per_ms),
        jax_matmuls=reps,
        matrix=MATRIX,
        jax_busy_ms=round(jax_busy_ms, 1),
    )
    busy = eye

    # ---- routes ------------------------------------------------------------------------
    routes, route_names, use_route = route_setup(handoff)
    emit(figure="routes", routes=routes, tested=route_names, route_env=os.environ.get("HANDOFF_ROUTE"))
    if os.environ.get("HANDOFF_REQUIRE_NATIVE") == "1":
        for direction, names in route_names.items():
            check("native" in names, f"{direction}: no native route here (HANDOFF_REQUIRE_NATIVE=1): {routes}")
    # First use of each route (imports, lookups) outside the timed calls, values checked.
    with torch.cuda.stream(side):
        for r in route_names["jax->torch"]:
            use_route(r)
            y = handoff.to_torch(jnp.arange(4, dtype=jnp.float32))
            check(y.tolist() == [0.0, 1.0, 2.0, 3.0], f"jax->torch {r}: warm-up values")
        for r in route_names["torch->jax"]:
            use_route(r)
            x = handoff.to_jax(torch.arange(4, dtype=torch.float32, device="cuda"))
            check(x.tolist() == [0.0, 1.0, 2.0, 3.0], f"torch->jax {r}: warm-up values")
    side.synchronize()
    del y, x
    use_route(None)
    keys = itertools.count(3)  # a value no earlier trial wrote: a stale read cannot look right

    # ---- the drop hazard ----------------------------------------------------------------
    def jax_to_torch(k, view):
        with torch.cuda.stream(side):
            jax_out = produce(jnp.float32(k), busy)  # JAX: ~50 ms queued
            y = view(jax_out)  # side waits for JAX on the GPU
            torch.cuda._sleep(sleep_cycles)  # the read queued behind ~50 ms of torch work
            z = y * 2
            del y, jax_out  # both owners let go
            churn = [fill(jnp.float32(-1.0)) for _ in range(CHURN)]  # JAX reuses memory
        side.synchronize()
        for c in churn:
            c.block_until_ready()
        return int((z != 2 * k).sum().item())

    def torch_to_jax(k, view):
        with torch.cuda.stream(side):
            torch.cuda._sleep(sleep_cycles)  # torch: ~50 ms queued before the write
            t = torch.full((N,), float(k), device="cuda")
            x = view(t)  # JAX's stream waits for side on the GPU
            w = consume(x, busy)  # JAX reads x behind ~50 ms of JAX work
            del x, t  # both owners let go
            churn = [torch.full((N,), -1.0, device="cuda") for _ in range(CHURN)]  # torch reuses
        w.block_until_ready()
        side.synchronize()
        del churn
        return int(jnp.sum(w != 2 * k))

    hazards = (
        ("jax->torch", jax_to_torch, [
            ("ordered", None, lambda a: torch.from_dlpack(handoff.ordered(a))),
            *[(r, r, handoff.to_torch) for r in route_names["jax->torch"]],
            ("plain", None, torch.from_dlpack),
        ]),
        ("torch->jax", torch_to_jax, [
            ("ordered", None, lambda t: jax.dlpack.from_dlpack(handoff.ordered(t))),
            *[(r, r, handoff.to_jax) for r in route_names["torch->jax"]],
            ("plain", None, jax.dlpack.from_dlpack),
            ("unowned", None, lambda t: jax.dlpack.from_dlpack(Unowned(t))),
        ]),
    )
    for direction, trial, variants in hazards:
        wrong = {name: [] for name, _, _ in variants}
        t0 = time.perf_counter()
        for _ in range(TRIALS):
            for name, r, view in variants:
                if r is not None:
                    use_route(r)
                wrong[name].append(trial(float(next(keys)), view))
        use_route(None)

        def right(name):
            return TRIALS - sum(1 for w in wrong[name] if w) if name in wrong else None

        bad_plain = sum(1 for w in wrong["plain"] if w)
        fields = {}
        if "unowned" in wrong:
            fields = {"unowned_wrong": TRIALS - right("unowned"), "unowned_wrong_elements_max": max(wrong["unowned"])}
        emit(
            figure="drop_hazard",
            direction=direction,
            consumer="torch pool stream" if direction == "jax->torch" else "jax",
            elements=N,
            trials=TRIALS,
            handoff_right=right("ordered"),
            route_right={r: right(r) for r in ("native", "public")},
            plain_wrong=bad_plain,
            plain_wrong_elements_max=max(wrong["plain"]),
            **fields,
            seconds=round(time.perf_counter() - t0, 1),
        )
        check(right("ordered") == TRIALS,
              f"{direction}: handoff.ordered wrong in {TRIALS - right('ordered')} of {TRIALS} trials")
        for r in route_names[direction]:
            check(right(r) == TRIALS, f"{direction}: the {r} route wrong in {TRIALS - right(r)} of {TRIALS} trials")
        if direction == "jax->torch":
            check(bad_plain > 0, f"{direction}: the plain control never corrupted: the scenario proves nothing")
        else:
            check(right("unowned") < TRIALS,
                  f"{direction}: the unowned control never corrupted: the scenario proves nothing")

    # ---- ordering per route: ~50 ms queued before the producer's write -------------------
    double = jax.jit(lambda v: v * 2.0)
    double(jnp.ones((N,), jnp.float32)).block_until_ready()
    decoy = torch.cuda.Stream()  # idle; nobody reads on it

    def ready_jax_to_torch(k, view):
        """JAX writes the array at the end of ~50 ms of JAX work; PyTorch reads it on
        `side` right after the call."""
        a = produce(jnp.float32(k), busy)
        with torch.cuda.stream(side):
            t0 = time.perf_counter()
            y = view(a)
            dt = time.perf_counter() - t0
            after = torch.cuda.Event()
            after.record(side)  # behind the GPU wait for JAX's write, where there is one
            gpu_busy = not after.query()
            z = y * 2
        side.synchronize()
        a.block_until_ready()
        return int((z != 2 * k).sum().item()), dt, gpu_busy

    def ready_torch_to_jax(k, view):
        """PyTorch writes the tensor behind ~50 ms of work on `side`; JAX reads it right
        after the call."""
        with torch.cuda.stream(side):
            torch.cuda._sleep(sleep_cycles)
            t = torch.full((N,), float(k), device="cuda")
            t0 = time.perf_counter()
            x = view(t)
            dt = time.perf_counter() - t0
            after = torch.cuda.Event()
            after.record(side)  # behind the ~50 ms: pending unless the call waited for it
            gpu_busy = not after.query()
        w = double(x)
        wrong = int(jnp.sum(w != 2 * k))
        side.synchronize()
        return wrong, dt, gpu_busy

    orderings = (
        ("jax->torch", ready_jax_to_torch, [
            *[(r, "handoff.to_torch(jax_array)", r, handoff.to_torch) for r in route_names["jax->torch"]],
            ("control", "torch.from_dlpack(jax_array), JAX ordering an idle stream, not the reader's", None,
             lambda a: torch.from_dlpack(Relay(a, decoy.cuda_stream))),
        ]),
        ("torch->jax", ready_torch_to_jax, [
            *[(r, "handoff.to_jax(torch_tensor)", r, handoff.to_jax) for r in route_names["torch->jax"]],
            ("control", "jax.dlpack.from_dlpack(torch_tensor), PyTorch asked for no sync (stream=-1)", None,
             lambda t: jax.dlpack.from_dlpack(Relay(t, -1))),
        ]),
    )
    for direction, trial, variants in orderings:
        res = {name: {"stale": 0, "max_call_s": 0.0, "gpu_busy": 0, "host_syncs": 0} for name, *_ in variants}
        for _ in range(TRIALS):
            for name, _call, r, view in variants:
                if r is not None:
                    use_route(r)
                syncs = handoff.stats()["host_syncs"]
                wrong, dt, gpu_busy = trial(float(next(keys)), view)
                got = res[name]
                got["host_syncs"] += handoff.stats()["host_syncs"] - syncs
                got["stale"] += int(wrong > 0)
                got["max_call_s"] = max(got["max_call_s"], dt)
                got["gpu_busy"] += int(gpu_busy)
        use_route(None)
        for name, call, r, _view in variants:
            got = res[name]
            emit(figure="ordering", direction=direction, call=call, route=r, queued_ms=QUEUED_MS, elements=N,
                 trials=TRIALS, right=TRIALS - got["stale"], stale=got["stale"],
                 max_call_ms=round(got["max_call_s"] * 1e3, 3), gpu_busy_after=got["gpu_busy"],
                 host_syncs=got["host_syncs"])
            if r is None:
                check(got["stale"] > 0, f"{direction}: the control never read stale data: the scenario proves nothing")
                continue
            what = f"{direction} {r} route"
            check(got["stale"] == 0, f"{what}: stale in {got['stale']} of {TRIALS} trials")
            check(got["max_call_s"] * 1e3 < QUEUED_MS / 5, f"{what}: a call took {got['max_call_s'] * 1e3:.1f} ms")
            check(got["gpu_busy"] == TRIALS, f"{what}: the GPU was idle after {TRIALS - got['gpu_busy']} calls")
            check(got["host_syncs"] == 0, f"{what}: {got['host_syncs']} host syncs counted")

    # ---- __cuda_array_interface__ only ------------------------------------------------
    class CudaArray:
        """Exposes only __cuda_array_interface__ v3 of a torch tensor written on `stream`."""

        def __init__(self, t, stream, readonly=False):
            self._t = t
            self.__cuda_array_interface__ = {
                "shape": tuple(t.shape),
                "typestr": "<f4",
                "data": (t.data_ptr(), readonly),
                "strides": None,
                "version": 3,
                "stream": stream.cuda_stream or 1,
            }

    producer_stream, consumer_stream = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(consumer_stream):  # warm-up (first use of the pointer query)
        warm = torch.from_dlpack(handoff.ordered(CudaArray(torch.ones(4, device="cuda"), producer_stream)))
        check(warm.tolist() == [1.0] * 4, "__cuda_array_interface__: warm-up values")
        del warm
    bad, slow, waits = 0, 0.0, 0
    for i in range(TRIALS):
        k = float(i + 3)
        with torch.cuda.stream(producer_stream):
            torch.cuda._sleep(sleep_cycles)
            t = torch.full((N,), k, device="cuda")
        cai = CudaArray(t, producer_stream)
        del t
        before = handoff.stats()["waits_enqueued"]
        with torch.cuda.stream(consumer_stream):
            t0 = time.perf_counter()
            y = torch.from_dlpack(handoff.ordered(cai))
            slow = max(slow, time.perf_counter() - t0)
            torch.cuda._sleep(sleep_cycles)
            z = y * 2
            del y, cai  # handoff keeps the producer object until consumer_stream is done
        waits += handoff.stats()["waits_enqueued"] - before
        with torch.cuda.stream(producer_stream):
            churn = [torch.full((N,), -1.0, device="cuda") for _ in range(CHURN)]
        consumer_stream.synchronize()
        producer_stream.synchronize()
        del churn
        bad += int(bool((z != 2 * k).any().item()))
    readonly = CudaArray(torch.ones(4, device="cuda"), torch.cuda.current_stream(), readonly=True)
    try:
        handoff.ordered(readonly, writable=True).__dlpack__(stream=1, max_version=(1, 0))
        refused = False
    except handoff.InvalidTensorError:
        refused = True
    cap = handoff.ordered(readonly).__dlpack__(stream=1, max_version=(1, 0))
    ro_flag = bool(_capsule_flags(cap) & 1)
    del cap
    emit(
        figure="cuda_array_interface",
        trials=TRIALS,
        right=TRIALS - bad,
        max_call_ms=round(slow * 1e3, 3),
        waits_enqueued=waits,
        readonly_flag=ro_flag,
        writable_import_refused=refused,
    )
    check(bad == 0, f"__cuda_array_interface__: wrong in {bad} of {TRIALS} trials")
    check(slow * 1e3 < QUEUED_MS / 5, f"__cuda_array_interface__: a call took {slow * 1e3:.1f} ms")
    check(waits == TRIALS, f"__cuda_array_interface__: {waits} GPU waits for {TRIALS} hand-offs")
    check(ro_flag and refused, "__cuda_array_interface__: readonly not honored")

    # ---- no host sync ------------------------------------------------------------------
    base = handoff.stats()["host_syncs"]
    with torch.cuda.stream(side):
        a = produce(jnp.float32(5), busy)
        torch.cuda._sleep(sleep_cycles)
        t0 = time.perf_counter()
        y = torch.from_dlpack(handoff.ordered(a))
        dt = time.perf_counter() - t0
        ev = torch.cuda.Event()
        ev.record(side)
        gpu_busy = not ev.query()
        z = y + 1
    syncs = handoff.stats()["host_syncs"] - base
    emit(figure="no_host_sync", call="torch.from_dlpack(handoff.ordered(jax_array))", queued_ms=QUEUED_MS,
         call_ms=round(dt * 1e3, 3), gpu_busy_after=gpu_busy, host_syncs=syncs)
    check(dt * 1e3 < QUEUED_MS / 5 and gpu_busy and syncs == 0, "jax->torch: the hand-off waited on the host")
    side.synchronize()
    check(bool((z == 6).all().item()), "jax->torch no-sync: wrong values")
    del y, z, a

    with torch.cuda.stream(side):
        torch.cuda._sleep(sleep_cycles)
        t = torch.full((N,), 5.0, device="cuda")
        t0 = time.perf_counter()
        x = jax.dlpack.from_dlpack(handoff.ordered(t))
        dt = time.perf_counter() - t0
        ev = torch.cuda.Event()
        ev.record(side)
        gpu_busy = not ev.query()
    syncs = handoff.stats()["host_syncs"] - base
    emit(figure="no_host_sync", call="jax.dlpack.from_dlpack(handoff.ordered(torch_tensor))", queued_ms=QUEUED_MS,
         call_ms=round(dt * 1e3, 3), gpu_busy_after=gpu_busy, host_syncs=syncs)
    check(dt * 1e3 < QUEUED_MS / 5 and gpu_busy and syncs == 0, "torch->jax: the hand-off waited on the host")
    check(bool(jnp.all(x + 1 == 6.0)), "torch->jax no-sync: wrong values")
    del x, t
    side.synchronize()

    # ---- host cost per exchange ----------------------------------------------------------
    def medians(plain, ordered, n):
        p, o = [], []
        for _ in range(200):
            plain()
            ordered()
        for _ in range(n):
            t0 = time.perf_counter_ns()
            r = plain()
            p.append(time.perf_counter_ns() - t0)
            del r
            t0 = time.perf_counter_ns()
            r = ordered()
            o.append(time.perf_counter_ns() - t0)
            del r
        return statistics.median(p) / 1e3, statistics.median(o) / 1e3

    small_jax = jnp.ones((1024,), jnp.float32)
    small_jax.block_until_ready()
    small_torch = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()
    for call, plain, ordered in (
        ("torch.from_dlpack(jax_array)", lambda: torch.from_dlpack(small_jax),
         lambda: torch.from_dlpack(handoff.ordered(small_jax))),
        ("jax.dlpack.from_dlpack(torch_tensor)", lambda: jax.dlpack.from_dlpack(small_torch),
         lambda: jax.dlpack.from_dlpack(handoff.ordered(small_torch))),
    ):
        p_us, o_us = medians(plain, ordered, HOST_COST_CALLS)
        emit(figure="host_cost", call=call, calls=HOST_COST_CALLS, plain_us=round(p_us, 2),
             handoff_us=round(o_us, 2), added_us=round(o_us - p_us, 2))

    end_stats = handoff.stats()
    check(end_stats["host_syncs"] == start_stats["host_syncs"], "host syncs were counted before the final flush")
    handoff.flush()
    final = handoff.stats()
    emit(figure="stats", **{k: final[k] - start_stats.get(k, 0) for k in final if k not in ("pending",)},
         pending_after_flush=final["pending"])
    check(final["pending"] == 0, "releases pending after flush")
    check(final["releases_leaked"] == start_stats["releases_leaked"], "releases leaked")


def route_setup(handoff):
    """The routes to test per direction and a switch between them: ``(routes, {direction:
    [route, ...]}, use)``; ``use(route)`` makes ``handoff.to_torch``/``to_jax`` take
    ``route``, ``use(None)`` goes back to the process's own setting. A wheel without
    ``routes()`` has the public route only (its ``to_torch``/``to_jax`` are
    ``from_dlpack(handoff.ordered(x))``)."""
    from handoff import _handoff

    set_route = getattr(_handoff, "_set_route", None)
    routes_fn = getattr(handoff, "routes", None)
    if set_route is None or routes_fn is None:
        return None, {"jax->torch": ["public"], "torch->jax": ["public"]}, lambda route: None
    initial = "public" if os.environ.get("HANDOFF_ROUTE") == "public" else "auto"
    set_route(initial)
    routes = routes_fn()
    names = {
        "jax->torch": (["native"] if routes.get("jax_to_torch") == "native" else []) + ["public"],
        "torch->jax": (["native"] if routes.get("torch_to_jax") == "native" else []) + ["public"],
    }

    def use(route):
        set_route({None: initial, "native": "auto", "public": "public"}[route])

    return routes, names, use


class Relay:
    """``obj``'s DLPack export with the consumer's stream replaced by ``stream`` (a
    control: the producer orders that stream, or none for ``-1``, not the one the
    consumer reads on)."""

    def __init__(self, obj, stream):
        self._obj, self._stream = obj, stream

    def __dlpack_device__(self):
        return self._obj.__dlpack_device__()

    def __dlpack__(self, stream=None, **kwargs):
        return self._obj.__dlpack__(stream=self._stream, **kwargs)


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_FREE = ctypes.cast(_libc.free, ctypes.c_void_p).value
# Its own prototype: ctypes.pythonapi's functions are shared with dlpack_ctypes, whose
# argument types differ.
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


class Unowned:
    """A CUDA f32 torch tensor's DLPack export that does not keep the tensor alive (the
    lifetime control): PyTorch makes the consumer's stream wait for its current stream as
    in ``t.__dlpack__(stream=...)``, but the capsule's managed tensor is a malloc'd
    struct whose deleter (libc ``free``, no GIL needed) frees only itself. The tensor's
    memory goes back to PyTorch's allocator when the tensor object dies, while the
    consumer's work on it may still be queued."""

    def __init__(self, t):
        self._t = t

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()

    def __dlpack__(self, stream=None, **_kwargs):
        import dlpack_ctypes as dl

        t, self._t = self._t, None
        assert t.dtype.is_floating_point and t.element_size() == 4 and t.is_cuda
        waited = t.__dlpack__(stream=stream)  # PyTorch's wait; dropped unconsumed: no reference kept
        del waited
        nd = t.dim()
        head = ctypes.sizeof(dl.DLManagedTensor)
        p = _libc.malloc(head + 16 * nd)
        dims = (ctypes.c_int64 * (2 * nd)).from_address(p + head)
        dims[:nd] = list(t.shape)
        dims[nd:] = list(t.stride())
        mt = dl.DLManagedTensor.from_address(p)
        mt.dl_tensor = dl.DLTensor(
            t.data_ptr(),
            dl.DLDevice(2, t.device.index or 0),  # kDLCUDA
            nd,
            dl.DLDataType(2, 32, 1),  # float32
            ctypes.cast(p + head, ctypes.POINTER(ctypes.c_int64)),
            ctypes.cast(p + head + 8 * nd, ctypes.POINTER(ctypes.c_int64)),
            0,
        )
        mt.manager_ctx = None
        mt.deleter = dl.LEGACY_DELETER(_FREE)  # JAX calls it when its view dies (a NULL deleter aborts jaxlib)
        return dl.make_capsule(p, versioned=False, destructor=False)


def _capsule_flags(capsule):
    """The flags of the DLManagedTensorVersioned in an unconsumed capsule."""
    import dlpack_ctypes as dl

    return dl.DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, b"dltensor_versioned")).flags


if __name__ == "__main__":
    harness.run(main)
