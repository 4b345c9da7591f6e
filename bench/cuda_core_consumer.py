"""``handoff.ordered`` objects consumed by NVIDIA cuda.core's ``StridedMemoryView``,
which reads a producer's DLPack C exchange API (``__dlpack_c_exchange_api__``) where the
type has one. GPU machine only (cuda.core, torch, JAX on CUDA). JSON lines; exit 1 on a
wrong value."""

import sys

import harness  # beside this script, in bench/ and in the GPU bundle
from harness import emit


def main():
    try:
        import torch
        from cuda.core.utils import StridedMemoryView
    except Exception as e:  # noqa: BLE001
        harness.skip(e, honour_require_gpu=False)
    if not torch.cuda.is_available():
        harness.skip("no CUDA device", honour_require_gpu=False)
    import cuda.core
    import jax.numpy as jnp

    import handoff

    ok = True
    api = type(handoff.ordered(torch.ones(1))).__dlpack_c_exchange_api__
    harness.env(cuda_core=cuda.core, capsule=repr(api).split(" at ")[0])
    s = torch.cuda.Stream()
    for name, make, ptr_of in (
        ("torch", lambda: torch.arange(12.0, device="cuda").reshape(3, 4), lambda x: x.data_ptr()),
        ("jax", lambda: jnp.arange(12.0).reshape(3, 4), lambda x: x.unsafe_buffer_pointer()),
    ):
        x = make()
        before = handoff.stats()
        with torch.cuda.stream(s):
            v = StridedMemoryView.from_dlpack(handoff.ordered(x), stream_ptr=s.cuda_stream)
        right = v.ptr == ptr_of(x) and tuple(v.shape) == (3, 4)
        mid = handoff.stats()
        del v
        handoff.flush()
        after = handoff.stats()
        # flush() itself counts a host sync per stream it waits for: judged before it.
        ok &= right and after["pending"] == 0 and mid["host_syncs"] == before["host_syncs"]
        emit(figure="strided_memory_view", producer=name, view_of_source=right,
             imports=mid["imports"] - before["imports"],
             released=after["released"] + after["releases_immediate"] - before["released"] - before["releases_immediate"],
             host_syncs=mid["host_syncs"] - before["host_syncs"], pending_after_flush=after["pending"])
    emit(figure="result", ok=bool(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
