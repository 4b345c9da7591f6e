"""The random numbers a PyTorch function draws inside ``handoff.jax_function``: whether
a call draws any, the generator state the forward keeps for the backward, and the
backward run under that state, so that it draws what the forward drew (a dropout's mask).

On CUDA the state lives on the GPU and setting it needs it on the host: a host sync,
which ``host_syncs`` governs.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Sequence

from ._handoff import _host_sync
from ._jax_function import ours, torch


@contextlib.contextmanager
def replay(sig: Any, s: Any, state: Any):
    """Sets the generator of ``s``'s device to the forward's ``state`` for the body,
    and back after. On CUDA the state is read back to the host: a host sync."""
    if state is None:
        yield
        return
    t = torch()
    state = state.reshape(-1, state.shape[-1])[0]
    if not s.cuda:
        saved = t.get_rng_state()
        t.set_rng_state(state[: saved.numel()].clone())
        try:
            yield
        finally:
            t.set_rng_state(saved)
        return
    policy = sig.owner.host_syncs
    if policy == "error":
        raise random_on_cuda(sig)
    if policy == "warn":
        warnings.warn(f"{sig.name}: reading the forward's random state back to the host (a host sync)",
                      UserWarning, stacklevel=2)
    saved = t.cuda.get_rng_state(s.device)
    host = _host_sync(lambda: state[: saved.numel()].cpu())
    t.cuda.set_rng_state(host, s.device)
    try:
        yield
    finally:
        t.cuda.set_rng_state(saved, s.device)


def draws(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> bool:
    """Whether a call of the operator ``func``, tagged ``nondeterministic_seeded``, draws
    random numbers: not where its own arguments switch the randomness off (attention with
    ``dropout_p=0``, a dropout with ``p=0`` or ``train=False``, a recurrent layer with
    ``dropout=0`` or ``train=False``), which a module such as
    ``scaled_dot_product_attention`` without dropout does on every call."""
    names = [a.name for a in func._schema.arguments]
    given = dict(zip(names, args), **kwargs)
    if given.get("train", True) is False or given.get("training", True) is False:
        return False
    if given.get("dropout_p") == 0 or given.get("dropout") == 0:
        return False
    if "dropout" in func._schema.name and given.get("p") == 0:
        return False
    return True


def random_on_cuda(sig: Any) -> BaseException:
    return ours(RuntimeError(
        f"{sig.name}: the function draws random numbers, and on CUDA its backward needs the "
        "forward's generator state on the host, which lives on the GPU: reading it back is a "
        "host sync. Pass random=False if the backward may draw other random numbers, or "
        "host_syncs='warn' or 'allow' to accept one host sync per backward"))


def rng_state(device: Any) -> Any:
    """The device's generator state; on CUDA in pinned memory, so that its copy to the
    GPU is asynchronous (one from pageable memory may wait for the stream)."""
    t = torch()
    return t.cuda.get_rng_state(device).pin_memory() if device.type == "cuda" else t.get_rng_state()


_RNG_BYTES = None


def rng_bytes() -> int:
    """The size of the random-state residual: room for the CPU generator's state (the
    larger one; a CUDA generator's is 16 bytes, written at the start)."""
    global _RNG_BYTES
    if _RNG_BYTES is None:
        _RNG_BYTES = int(torch().get_rng_state().numel())
    return _RNG_BYTES
