"""``torch.export`` of a module with a ``handoff.torch_function`` layer: the JAX function
travels inside the exported program.

While PyTorch exports, the layer's operator key is not a name of this process but the
function itself: ``PREFIX`` followed by a serialized ``jax.export`` artifact (base64),
with the traced sizes symbolic where PyTorch's are. ``torch.export.save`` writes the key
with the graph; in another process, where only PyTorch, JAX and handoff are installed,
``handoff::call`` deserializes it on first use and calls it. An exported program runs the
forward only: ``jax.export`` fixes the function's platform (the device it was exported
on) and PyTorch's exported programs are for inference.
"""

from __future__ import annotations

import base64
import threading
from typing import Any, Dict, List, Sequence

from . import _jax_config
from ._handoff import _to_jax_many, _to_torch_many
from ._program import _distinct
from ._shapes import _torch_dtype, is_float, symbolic_avals, torch_shape

#: What every artifact key starts with (the format's version included).
PREFIX = "handoff.jax_export.v1:"

_LOCK = threading.Lock()


def key_for(program: Any, tensors: Sequence[Any]) -> str:
    """The artifact key of ``program`` at these (fake) tensors' shapes: exported by
    ``jax.export`` for the tensors' platform, symbolic where their sizes are; nothing
    runs. The artifact is registered in this process under its key."""
    import jax

    from . import _torch_ops

    program.for_tensors(tensors)  # the output structure, for the layer's caller
    shapes = [tuple(t.shape) for t in tensors]
    avals, _ = symbolic_avals(shapes, program.dtypes)
    call = program.call
    platform = "cuda" if program.device.type == "cuda" else "cpu"
    with _jax_config.configured(program.context):
        exported = jax.export.export(
            jax.jit(lambda *xs: jax.tree_util.tree_leaves(call(xs))), platforms=[platform]
        )(*avals)
    try:
        data = exported.serialize()
    except ImportError as e:
        raise ImportError(
            f"{program.name}: torch.export of a JAX layer ships it as a jax.export artifact, "
            f"whose serialization needs the flatbuffers package (pip install flatbuffers): {e}"
        ) from e
    key = PREFIX + base64.b64encode(data).decode("ascii")
    with _LOCK:
        if key not in _torch_ops.PROGRAMS:
            _torch_ops.PROGRAMS[key] = Artifact(exported, program.name)
    return key


class Artifact:
    """A ``jax.export`` artifact as ``handoff::call`` runs it (forward only)."""

    vjp = False
    diff: tuple = ()

    def __init__(self, exported: Any, name: str) -> None:
        self.exported = exported
        self.name = name
        self.n_out = len(exported.out_avals)
        #: Which outputs are differentiable, as a program's trace says (one for all shapes).
        self.out_float = tuple(is_float(a.dtype) for a in exported.out_avals)
        self._run: Any = None

    @classmethod
    def load(cls, key: str) -> "Artifact":
        import jax

        try:
            exported = jax.export.deserialize(bytearray(base64.b64decode(key[len(PREFIX):])))
        except Exception as e:  # noqa: BLE001 - re-raised naming what it is
            raise RuntimeError(f"handoff: the operator key is not a readable jax.export artifact: {e}") from e
        return cls(exported, f"handoff.torch_function({exported.fun_name})")

    def forward(self, tensors: Sequence[Any]) -> List[Any]:
        import jax

        if self._run is None:
            self._run = jax.jit(self.exported.call)
        outs = jax.tree_util.tree_leaves(self._run(*_to_jax_many(tensors)))
        return _distinct(_to_torch_many(outs), tensors)

    def fake_forward(self, tensors: Sequence[Any]) -> List[Any]:
        import torch

        env: Dict[str, Any] = {}
        for aval, t in zip(self.exported.in_avals, tensors):
            for d, size in zip(aval.shape, t.shape):
                if type(d) is not int:
                    env[str(d)] = size
        device = tensors[0].device
        return [
            torch.empty(torch_shape(a.shape, env), dtype=_torch_dtype(a.dtype), device=device)
            for a in self.exported.out_avals
        ]

    def for_tensors(self, tensors: Sequence[Any]) -> "Artifact":
        """The artifact is its own trace at every shape (``out_float``)."""
        return self
