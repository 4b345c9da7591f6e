"""The PyTorch operators behind ``handoff.torch_function`` (``torch.library``).

- ``handoff::call(str key, Tensor[] args) -> Tensor[]``: the forward. It returns the
  JAX function's outputs (flattened) and, when a gradient is needed, then the VJP's
  residuals that are neither inputs nor outputs. Its autograd formula saves what the
  backward reads and calls:
- ``handoff::call_bwd(str key, SymInt[] shapes, Tensor[] saved, Tensor?[] cts) ->
  Tensor[]``: the gradients of the inputs that a present cotangent reaches.

``key`` names a :class:`~handoff._program.Program` of this process (the function, its
static arguments, the tensors' structure and dtypes, which need a gradient, the device,
JAX's configuration), or, for a program made by ``torch.export``, holds the JAX function
itself as a serialized ``jax.export`` artifact (``handoff._artifact``), so a saved
program runs in another process. Both operators have fake implementations computed from
JAX's abstract evaluation: ``torch.compile`` and ``torch.export`` trace them without
running anything. They are tagged ``cudagraph_unsafe``: a CUDA graph tree of
``torch.compile(mode="reduce-overhead")`` is split around them (the memory XLA writes
during a replay is not yet the graph's own).

Importing this module registers them (``import handoff`` does when PyTorch is already
imported, and the first ``torch_function`` call does).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch

from . import _artifact
from ._program import _HERE

#: Every operator key of this process and what it names.
PROGRAMS: Dict[str, Any] = {}


def program(key: str) -> Any:
    """What ``key`` names: a registered program, or a ``jax.export`` artifact loaded from
    the key itself."""
    found = PROGRAMS.get(key)
    if found is None:
        if not key.startswith(_artifact.PREFIX):
            raise RuntimeError(
                f"handoff: no JAX function is registered under the operator key {key!r} in this "
                "process: a graph made by torch.compile runs only in the process that compiled "
                "it; a program saved with torch.export holds its JAX function itself"
            )
        found = PROGRAMS.setdefault(key, _artifact.Artifact.load(key))
    return found


_LIB = torch.library.Library("handoff", "FRAGMENT")
_TAGS = (torch.Tag.cudagraph_unsafe,)
_LIB.define("call(str key, Tensor[] args) -> Tensor[]", tags=_TAGS)
_LIB.define("call_bwd(str key, SymInt[] shapes, Tensor[] saved, Tensor?[] cts) -> Tensor[]", tags=_TAGS)


def _call(key: str, args: List[torch.Tensor]) -> List[torch.Tensor]:
    return program(key).forward(args)


def _call_bwd(key: str, shapes: List[int], saved: List[torch.Tensor], cts: List[Any]) -> List[torch.Tensor]:
    return program(key).backward(shapes, saved, cts)


for _device in ("CPU", "CUDA"):
    _LIB.impl("call", _call, _device)
    _LIB.impl("call_bwd", _call_bwd, _device)
# The backward is not differentiable (a double backward is refused before it is called).
_LIB.impl("call_bwd", torch.library.fallthrough_kernel, "Autograd")


@torch.library.register_fake("handoff::call")
def _call_fake(key: str, args: List[torch.Tensor]) -> List[torch.Tensor]:
    return program(key).fake_forward(args)


@torch.library.register_fake("handoff::call_bwd")
def _call_bwd_fake(key: str, shapes: List[Any], saved: List[torch.Tensor], cts: List[Any]) -> List[torch.Tensor]:
    return program(key).fake_backward(shapes, cts)


def _setup_context(ctx: Any, inputs: Sequence[Any], output: Sequence[torch.Tensor]) -> None:
    key, args = inputs
    prog = program(key)
    ctx.key = key
    ctx.shapes = [d for a in args for d in a.shape]
    ctx.n_out = prog.n_out
    ctx.traced = traced = prog.for_tensors(args)
    if prog.vjp:
        ctx.save_for_backward(*prog.saved(args, output, traced))
    nondiff = [o for o, fl in zip(output, traced.out_float) if not fl] + list(output[prog.n_out:])
    if nondiff:
        ctx.mark_non_differentiable(*nondiff)
    # An output the loss does not use gets None, not zeros: the backward tells which
    # inputs no used output reaches (they get None, as in PyTorch).
    ctx.set_materialize_grads(False)


def _backward(ctx: Any, grads: Sequence[Any]) -> List[Any]:
    prog = program(ctx.key)
    if not prog.vjp:
        raise RuntimeError(
            f"{prog.name}: no gradient through this call: it was made without one (a program "
            "from torch.export runs the forward only)"
        )
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{prog.name}: double backward (create_graph=True through a JAX function) is not supported"
        )
    saved = list(ctx.saved_tensors)  # raises if one was modified in place since the forward
    cts = list(grads[: ctx.n_out])
    _HERE.known = getattr(ctx, "known", None)  # taken by the kernel below, on this thread
    try:
        if _unobserved(saved) and _unobserved(ct for ct in cts if ct is not None):
            got = ctx.traced.backward(saved, cts)
        else:
            got = torch.ops.handoff.call_bwd(ctx.key, ctx.shapes, saved, cts)
    finally:
        _HERE.known = None
    result: List[Any] = [None] * len(prog.diff)
    for i, g in zip(ctx.traced.reached(tuple(ct is None for ct in cts)), got):
        result[i] = g
    return result


class _Call(torch.autograd.Function):
    """``handoff::call``'s autograd formula. (``torch.library.register_autograd`` would do
    the same through a generic wrapper that walks the tensor lists with PyTorch's pytree
    on every call: about a third of an identity layer's host time.)"""

    @staticmethod
    def forward(ctx: Any, key: str, *args: torch.Tensor) -> Any:
        _HERE.keep = True  # the JAX arrays of the inputs the backward reads, for ctx
        try:
            if _unobserved(args):
                outs = program(key).forward(args)
            else:  # grad mode is off here: below autograd
                outs = torch.ops.handoff.call(key, list(args))
        finally:
            _HERE.keep = False
        kept, _HERE.kept = getattr(_HERE, "kept", None), None
        ctx.known = {id(t): (t, a) for t, a in kept.values()} if kept else None
        _setup_context(ctx, (key, args), outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        return (None, *_backward(ctx, grads))


#: ``_Call.apply`` without ``Function.apply``'s Python wrapper, for plain tensors with no
#: functorch transform active (where the wrapper does nothing else).
_APPLY = super(torch.autograd.Function, _Call).apply


def _needs_grad(args: Sequence[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(a.requires_grad for a in args)


def _call_autograd(key: str, args: List[torch.Tensor]) -> List[torch.Tensor]:
    if _needs_grad(args):
        return list(_Call.apply(key, *args))
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.handoff.call(key, args)


_LIB.impl("call", _call_autograd, "Autograd")


def call(key: str, args: List[torch.Tensor]) -> List[torch.Tensor]:
    """``handoff::call`` as the layer calls it. Where nothing could see the operator call
    (no ``torch.compile`` tracing, no dispatch or function mode such as selective
    checkpointing's, no functorch transform, plain tensors) the dispatcher is skipped:
    the autograd formula and the kernels run as the operator would run them, a Python
    dispatch hop fewer each (about a fifth of an identity layer's host time)."""
    if torch.compiler.is_compiling() or not _unobserved(args):
        return torch.ops.handoff.call(key, args)
    if _needs_grad(args):
        return list(_APPLY(key, *args))
    return program(key).forward(args)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _unobserved(tensors: Any) -> bool:
    """Whether a call on these tensors would reach the kernels with nothing in between:
    no dispatch or function mode, no functorch transform, no tensor subclass."""
    return (
        not torch._C._len_torch_dispatch_stack()
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
        and all(type(t) in _PLAIN for t in tensors)
    )
