#!/usr/bin/env python3
"""handoff for Python on a CUDA GPU, with the machine's own PyTorch and JAX.

Run by ``gpu-bundle/run.sh`` (the bundled wheel on ``PYTHONPATH``); not collected by
pytest. Prints one JSON line per figure and a last ``{"figure": "result", ...}`` line;
exits 1 when a check fails. Without a usable GPU it prints ``SKIPPED: <reason>`` and
exits 0, or 1 when ``HANDOFF_REQUIRE_GPU=1``. A watchdog ends the process (exit 1,
with every thread's traceback) after ``HANDOFF_GPU_TIMEOUT`` seconds (default 480).

Figures:

- ``drop_hazard``: the issue's scenario, 20 trials per direction, 16,777,216-element
  f32 arrays. JAX -> PyTorch: JAX's producer ~50 ms of work; PyTorch's read (on a
  pool stream, non-blocking) queued behind ~50 ms of PyTorch work; both owners deleted;
  JAX then allocates and overwrites same-size arrays. With ``handoff.ordered`` every
  trial must be right; the plain ``torch.from_dlpack(jax_out)`` control, in the same
  run, must corrupt at least one (else the scenario proves nothing). PyTorch -> JAX
  the same way (PyTorch's producer behind ~50 ms, JAX's read behind ~50 ms of JAX work,
  PyTorch reallocating), its control reported as it comes.
- ``cuda_array_interface``: an object exposing only ``__cuda_array_interface__`` v3
  (PyTorch memory written on a producer stream): ordered with a GPU wait, kept alive
  until the consumer's work is done (20 trials under churn), ``readonly`` honored.
- ``no_host_sync``: with ~50 ms queued, ``torch.from_dlpack(handoff.ordered(a))`` and
  ``jax.dlpack.from_dlpack(handoff.ordered(t))`` return in well under 10 ms, the GPU
  still busy after, 0 host syncs counted.
- ``host_cost``: median host time of 10,000 calls each, plain and through handoff,
  interleaved in the same run.
"""

import faulthandler
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
faulthandler.dump_traceback_later(float(os.environ.get("HANDOFF_GPU_TIMEOUT", "480")), exit=True)

N = 16_777_216
TRIALS = int(os.environ.get("HANDOFF_GPU_TRIALS", "20"))
HOST_COST_CALLS = int(os.environ.get("HANDOFF_GPU_CALLS", "10000"))
QUEUED_MS = 50.0
CHURN = 6
MATRIX = 8192  # bf16 matmuls of MATRIX x MATRIX keep JAX busy

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


def main():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        skip(f"torch does not import ({e})")
    if not torch.cuda.is_available():
        skip("torch sees no CUDA device")
    try:
        import jax
        import jax.dlpack
        import jax.numpy as jnp
        from jax import lax
    except Exception as e:  # noqa: BLE001
        skip(f"jax does not import ({e})")
    try:
        gpus = jax.devices("gpu")
    except Exception as e:  # noqa: BLE001
        skip(f"jax has no GPU backend ({e})")
    import handoff

    if not handoff.cuda_available():
        skip("handoff cannot use the CUDA driver")

    emit(
        figure="env",
        torch=torch.__version__,
        jax=jax.__version__,
        handoff=handoff.__version__,
        gpu=torch.cuda.get_device_name(0),
        jax_device=str(gpus[0]),
        python=sys.version.split()[0],
    )
    start_stats = handoff.stats()

    # ---- calibration: ~50 ms of queued work on each side --------------------------
    side = torch.cuda.Stream()  # a pool stream: non-blocking, unlike the legacy default
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.cuda._sleep(20_000_000)
        e1.record()
    e1.synchronize()
    cycles_per_ms = 20_000_000 / e0.elapsed_time(e1)
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

    # ---- the drop hazard, JAX -> PyTorch --------------------------------------------
    def jax_to_torch(k, ordered):
        with torch.cuda.stream(side):
            jax_out = produce(jnp.float32(k), busy)  # JAX: ~50 ms queued
            src = handoff.ordered(jax_out) if ordered else jax_out
            y = torch.from_dlpack(src)  # side waits for JAX on the GPU
            torch.cuda._sleep(sleep_cycles)  # the read queued behind ~50 ms of torch work
            z = y * 2
            del y, jax_out, src  # both owners let go
            churn = [fill(jnp.float32(-1.0)) for _ in range(CHURN)]  # JAX reuses memory
        side.synchronize()
        for c in churn:
            c.block_until_ready()
        return int((z != 2 * k).sum().item())

    def torch_to_jax(k, ordered):
        with torch.cuda.stream(side):
            torch.cuda._sleep(sleep_cycles)  # torch: ~50 ms queued before the write
            t = torch.full((N,), float(k), device="cuda")
            src = handoff.ordered(t) if ordered else t
            x = jax.dlpack.from_dlpack(src)  # JAX's stream waits for side on the GPU
            w = consume(x, busy)  # JAX reads x behind ~50 ms of JAX work
            del x, t, src  # both owners let go
            churn = [torch.full((N,), -1.0, device="cuda") for _ in range(CHURN)]  # torch reuses
        w.block_until_ready()
        side.synchronize()
        del churn
        return int(jnp.sum(w != 2 * k))

    for direction, trial in (("jax->torch", jax_to_torch), ("torch->jax", torch_to_jax)):
        wrong = {True: [], False: []}
        t0 = time.perf_counter()
        for i in range(TRIALS):
            for ordered in (True, False):
                wrong[ordered].append(trial(float(i + 3), ordered))
        bad_ordered = sum(1 for w in wrong[True] if w)
        bad_plain = sum(1 for w in wrong[False] if w)
        emit(
            figure="drop_hazard",
            direction=direction,
            consumer="torch pool stream" if direction == "jax->torch" else "jax",
            elements=N,
            trials=TRIALS,
            handoff_right=TRIALS - bad_ordered,
            plain_wrong=bad_plain,
            plain_wrong_elements_max=max(wrong[False]),
            seconds=round(time.perf_counter() - t0, 1),
        )
        check(bad_ordered == 0, f"{direction}: handoff.ordered wrong in {bad_ordered} of {TRIALS} trials")
        if direction == "jax->torch":
            check(bad_plain > 0, f"{direction}: the plain control never corrupted: the scenario proves nothing")

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


def _capsule_flags(capsule):
    """The flags of the DLManagedTensorVersioned in an unconsumed capsule."""
    import ctypes

    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ptr = api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    # version (8 bytes), manager_ctx (8), deleter (8), then flags (u64).
    return ctypes.c_uint64.from_address(ptr + 24).value


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
