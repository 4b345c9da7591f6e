#!/usr/bin/env python3
"""A long run of the Python exchange on a CUDA GPU: memory flat, nothing leaked, no host sync.

Run by ``bench/soak.sh`` from the GPU bundle (the bundled wheel on ``PYTHONPATH``).
``gpu_soak.py SECONDS`` (default 300) loops, until SECONDS have passed, batches of
exchanges both ways through ``handoff.ordered`` on a pool (non-blocking) PyTorch stream:

- JAX -> PyTorch: a jitted JAX producer writes ``k`` into a 1 Mi-element f32 array,
  ``torch.from_dlpack(handoff.ordered(a))``, PyTorch computes ``2 * y`` and compares it
  with ``2 k`` on the GPU, then drops both owners (the release is deferred behind the
  comparison, which is still queued);
- PyTorch -> JAX: ``torch.full(k)``, ``jax.dlpack.from_dlpack(handoff.ordered(t))``,
  a jitted JAX ``2 * x == 2 k`` count, owners dropped the same way.

A batch enqueues its exchanges with nothing waited for; then the batch's error counts
are read (the checker's own sync, not a hand-off's). Every ``SAMPLE_S`` seconds one
JSON line gives the time, the resident memory, PyTorch's allocated and reserved bytes,
JAX's bytes in use and handoff's counters. At the end, after ``handoff.flush()``:
every value right, 0 releases pending, 0 leaked, 0 host syncs, and memory flat: each
figure's last sample at most ``max(2 %, 32 MiB)`` above its first sample after the
warm-up (the first fifth of the run). Exit 1 on a failed check; ``SKIPPED: <reason>``
without a GPU (exit 1 under ``HANDOFF_REQUIRE_GPU=1``).
"""

import os
import sys
import time

import harness  # beside this script, in bench/ and in the GPU bundle
from harness import emit

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

N = 1 << 20
BATCH = 200
SAMPLE_S = 10.0
MIB = 1 << 20


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    torch, jax, jnp = harness.import_frameworks()
    import handoff

    why = harness.why_no_cuda(torch, jax, handoff)
    if why:
        harness.skip(why)
    gpu = jax.devices("gpu")[0]
    harness.env(torch=torch, jax=jax, handoff=handoff, gpu=torch.cuda.get_device_name(0), seconds=seconds,
                batch=BATCH, elements=N)

    produce = jax.jit(lambda k: jnp.full((N,), k, jnp.float32))
    count_wrong = jax.jit(lambda x, k: jnp.sum(x * 2.0 != 2.0 * k).astype(jnp.int32))
    side = torch.cuda.Stream()  # a pool stream: non-blocking, unlike the legacy default

    def sample(t0):
        stats = handoff.stats()
        return {
            "t_s": round(time.perf_counter() - t0, 1),
            "rss": resident_bytes(),
            "torch_allocated": torch.cuda.memory_allocated(),
            "torch_reserved": torch.cuda.memory_reserved(),
            "jax_in_use": (gpu.memory_stats() or {}).get("bytes_in_use", 0),
            "pending": stats["pending"],
            "releases_deferred": stats["releases_deferred"],
            "releases_leaked": stats["releases_leaked"],
            "host_syncs": stats["host_syncs"],
        }

    start = handoff.stats()
    t0 = time.perf_counter()
    samples, next_sample = [], 0.0
    exchanges, wrong, k = 0, 0, 0
    while time.perf_counter() - t0 < seconds:
        jax_wrong = []
        with torch.cuda.stream(side):
            torch_wrong = torch.zeros((), dtype=torch.int64, device="cuda")
            for _ in range(BATCH):
                k += 1
                v = float(k % 4093)
                a = produce(jnp.float32(v))
                y = torch.from_dlpack(handoff.ordered(a))  # JAX -> PyTorch
                torch_wrong += (y * 2 != 2 * v).sum()
                del a, y  # both owners let go; the comparison is still queued
                t = torch.full((N,), v, device="cuda")
                x = jax.dlpack.from_dlpack(handoff.ordered(t))  # PyTorch -> JAX
                jax_wrong.append(count_wrong(x, jnp.float32(v)))
                del t, x
        side.synchronize()  # the checker's own wait, before reading the counts
        exchanges += 2 * BATCH
        wrong += int(torch_wrong.item()) + int(sum(int(w) for w in jax_wrong))
        if time.perf_counter() - t0 >= next_sample:
            s = sample(t0)
            samples.append(s)
            emit(figure="sample", exchanges=exchanges, wrong=wrong, **s)
            next_sample += SAMPLE_S

    side.synchronize()
    handoff.flush()
    end = handoff.stats()
    delta = {key: end[key] - start.get(key, 0) for key in end if key != "pending"}
    failures = []
    if wrong:
        failures.append(f"{wrong} wrong elements")
    if end["pending"]:
        failures.append(f"{end['pending']} releases pending after flush")
    if delta["releases_leaked"]:
        failures.append(f"{delta['releases_leaked']} releases leaked")
    if delta["host_syncs"]:
        failures.append(f"{delta['host_syncs']} host syncs")
    if delta["releases_deferred"] == 0:
        failures.append("no release was deferred: the soak did not exercise the reaper")
    warm = [s for s in samples if s["t_s"] >= seconds / 5] or samples[-1:]
    growth = {}
    for key in ("rss", "torch_allocated", "torch_reserved", "jax_in_use"):
        first, last = warm[0][key], warm[-1][key]
        growth[key] = last - first
        if last - first > max(0.02 * first, 32 * MIB):
            failures.append(f"{key} grew from {first / MIB:.1f} to {last / MIB:.1f} MiB after the warm-up")
    emit(figure="soak", seconds=round(time.perf_counter() - t0, 1), exchanges=exchanges, wrong=wrong,
         pending_after_flush=end["pending"], growth_mib={k: round(v / MIB, 2) for k, v in growth.items()},
         stats=delta, failures=failures)
    print("result: " + ("correct" if not failures else "WRONG: " + "; ".join(failures)), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
