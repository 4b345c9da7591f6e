"""JAX views of a module's parameters, kept by a ``torch_function`` layer across calls.

Handing a tensor to JAX is mostly jaxlib's import of its DLPack capsule (about 16 µs of
host time on an H100, more on PyTorch's autograd thread), and a layer's parameters cross
at every call although they are the same memory call after call (an optimizer updates
them in place). So the JAX view of an ``nn.Parameter`` is made once and given again
while the parameter still has that memory (same object, address and strides), to the
forward and to a compiled backward that reads the parameter (an eager backward gets the
forward's own arrays); any other tensor crosses at every call as before.

**Order.** A call still hands at least one tensor to JAX the usual way, and that
crossing makes JAX's stream wait for PyTorch's current stream (one wait covers every
tensor): everything PyTorch queued before the call, an optimizer's in-place update of a
parameter among it, is done before JAX reads a kept view. A view is kept only where the
crossing made no copy (a misaligned or non-dense tensor, or an ``int64`` one JAX reads
as ``int32``, is copied: its copy would not see later updates).

**Memory.** A kept view holds its parameter's memory, as the parameter does: while the
layer lives, the parameters of its last call stay alive. A parameter given a new storage
(``p.data = ...``, FSDP's resharding) is seen by its address and crossed again.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from ._handoff import _to_jax_many

#: A kept view: the parameter, its address and strides when the view was made, the view.
Kept = Tuple[Any, int, Tuple[int, ...], Any]

#: Whether a call of kept views only still hands one tensor to JAX for the order (see the
#: module's docs). Switched off only by the GPU check's control, to show the order is
#: needed (``bench/gpu_training_checks.py``).
ORDER = True


class Views:
    """The kept views of one traced signature's inputs, by position."""

    __slots__ = ("_kept",)

    def __init__(self, n: int) -> None:
        self._kept: List[Optional[Kept]] = [None] * n

    def arrays(self, tensors: Sequence[Any]) -> List[Any]:
        """JAX arrays of ``tensors`` (in order): kept views where they still hold, the
        others handed to JAX in one call, at least one of them (for the order)."""
        kept = self._kept
        arrays: List[Any] = [None] * len(tensors)
        fresh: List[int] = []
        for i, t in enumerate(tensors):
            arrays[i] = self.get(i, t)
            if arrays[i] is None:
                fresh.append(i)
        if not fresh and ORDER:
            fresh.append(0)
        if not fresh:
            return arrays
        for i, a in zip(fresh, _to_jax_many([tensors[i] for i in fresh])):
            arrays[i] = a
            kept[i] = _keep(tensors[i], a)
        return arrays

    def get(self, i: int, t: Any) -> Any:
        """The kept view of input ``i`` where it still holds for ``t``, else ``None``; for
        a backward reading the input (its cotangents' crossing keeps the order)."""
        k = self._kept[i]
        if k is not None and k[0] is t and k[1] == t.data_ptr() and k[2] == t.stride():
            return k[3]
        return None


def _keep(t: Any, a: Any) -> Optional[Kept]:
    """What to keep of a fresh crossing: a parameter's view made without a copy."""
    if type(t) is not _parameter():
        return None
    p = t.data_ptr()
    if a.unsafe_buffer_pointer() != p:
        return None
    return (t, p, t.stride(), a)


_PARAMETER = None


def _parameter() -> Any:
    global _PARAMETER
    if _PARAMETER is None:
        import torch

        _PARAMETER = torch.nn.Parameter
    return _PARAMETER
