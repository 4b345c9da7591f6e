"""The JAX side of ``handoff.torch_function``'s operators.

A :class:`Program` is what one operator key names: a JAX function with its static
arguments, the structure and dtypes of its tensor arguments, which of them need a
gradient, the device and JAX's configuration. It is traced once per input shapes into a
:class:`Traced`: one ``jax.make_jaxpr`` of the function (of its ``jax.vjp`` when a
gradient is needed) gives the output shapes, the residuals the backward needs and which
of them are inputs or outputs, which inputs each output reaches, and the programs that
run (``jax.jit`` of that jaxpr, so the function itself is traced once). The same trace
with symbolic sizes gives the shapes ``torch.compile`` and ``torch.export`` ask for,
without running anything.

Values cross as PyTorch tensors on both sides of each operator (``_handoff``'s
``_to_jax_many`` / ``_to_torch_many``: no copy, GPU waits, stream-ordered release).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _jax_config, _tree
from ._handoff import _to_jax_many, _to_torch_many
from ._shapes import _aval, _torch_dtype, is_float, symbolic_avals, torch_shape
from ._views import Views

#: Where a value the operator hands out comes from: ``("new", k)`` the k-th array the
#: jitted program returns; ``("in", i)`` the i-th input; ``("out", j)`` the j-th output;
#: ``("res", m)`` the m-th new residual.
Source = Tuple[str, int]


class Program:
    """One operator key: see the module's docs. ``call(leaves)`` calls the JAX function
    on JAX arrays (the tensor leaves in order, the static arguments put back);
    ``owner`` counts traces and bounds the number of traced shapes."""

    def __init__(self, owner: Any, key: str, call: Callable[[Sequence[Any]], Any], diff: Sequence[bool],
                 dtypes: Sequence[Any], ranks: Sequence[int], device: Any, context: Any,
                 policy: Any) -> None:
        self.owner = owner
        self.key = key
        self.call = call
        self.diff = tuple(diff)
        #: Whether a gradient is needed, and which of the VJP's residuals the forward hands
        #: out: all (``None``), or what this ``jax.checkpoint`` policy saves (the backward
        #: recomputes the rest).
        self.vjp = any(self.diff)
        self.policy = policy
        self.diff_idx = tuple(i for i, d in enumerate(self.diff) if d)
        self.dtypes = tuple(dtypes)
        self.ranks = tuple(ranks)
        self.device = device
        self.context = context
        #: The output structure (``_tree`` description) and count, known after a trace.
        self.out_desc: Any = None
        self.n_out: int = 0
        self._traced: Dict[Tuple[Any, ...], "Traced"] = {}
        self._symbolic: Dict[str, "Traced"] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"handoff.torch_function({self.owner.__name__})"

    # ---- tracing ---------------------------------------------------------------------

    def traced(self, shapes: Tuple[Tuple[int, ...], ...]) -> "Traced":
        """The trace for these concrete input shapes (made once, kept by the owner's
        bounded cache)."""
        found = self._traced.get(shapes)
        if found is not None:
            self.owner._touch(self, shapes)
            return found
        with self._lock:
            found = self._traced.get(shapes)
            if found is None:
                with _jax_config.configured(self.context):  # x64 mode decides the dtypes
                    found = Traced(self, [_aval(s, d) for s, d in zip(shapes, self.dtypes)])
                self._traced[shapes] = found
                self.owner._remember(self, shapes)
        return found

    def forget(self, shapes: Tuple[Tuple[int, ...], ...]) -> None:
        self._traced.pop(shapes, None)

    def for_tensors(self, tensors: Sequence[Any]) -> "Traced":
        """The trace for these (real or fake) tensors' shapes (:meth:`for_shapes`)."""
        return self.for_shapes(tuple(tuple(t.shape) for t in tensors))

    def for_shapes(self, shapes: Tuple[Tuple[Any, ...], ...]) -> "Traced":
        """The trace for these shapes: concrete, or symbolic where a size is a
        ``torch.SymInt`` (``torch.compile``'s dynamic shapes)."""
        if all(type(d) is int for s in shapes for d in s):
            return self.traced(shapes)
        return self.symbolic(shapes)

    def symbolic(self, shapes: Sequence[Sequence[Any]]) -> "Traced":
        """The trace for shapes holding ``torch.SymInt`` sizes, each a JAX symbolic
        dimension (one per distinct size); nothing runs."""
        with _jax_config.configured(self.context):
            avals, env = symbolic_avals(shapes, self.dtypes)
        tag = repr(avals)
        found = self._symbolic.get(tag)
        if found is None:
            try:
                found = Traced(self, avals)
            except Exception as e:  # noqa: BLE001 - re-raised with what to do
                raise TypeError(
                    f"{self.name}: its output shapes cannot be computed with symbolic sizes "
                    f"(input shapes {[tuple(map(str, s)) for s in shapes]}), as torch.compile's "
                    "dynamic shapes or torch.export's dynamic_shapes ask: "
                    f"{type(e).__name__}: {e}. Compile with dynamic=False, mark the size static "
                    "(torch._dynamo.mark_static), or export without dynamic_shapes for it"
                ) from e
            self._symbolic[tag] = found
        found.env = env
        return found

    def adopt(self, traced: "Traced") -> None:
        """Records the output structure of the first trace; every later trace must agree."""
        if self.out_desc is None:
            self.out_desc, self.n_out = traced.out_desc, len(traced.out_avals)
        elif self.out_desc != traced.out_desc:
            raise TypeError(
                f"{self.name}: the output structure changed with the input shapes "
                f"({traced.out_desc} after {self.out_desc}); it must depend only on the "
                "arguments' structure and static arguments"
            )

    # ---- what the operators run ------------------------------------------------------

    def forward(self, tensors: Sequence[Any]) -> List[Any]:
        """The outputs, then (with a gradient) the new residuals, as PyTorch tensors."""
        traced = self.traced(tuple(tuple(t.shape) for t in tensors))
        captured = self.device.type == "cuda" and _capturing()
        with _jax_config.configured(self.context):
            # Inside a capture every tensor crosses, onto the capture's client where
            # capture clients are on (handoff._capture); else parameters' views are kept.
            xs = _to_jax_many(tensors) if captured else traced.views.arrays(tensors)
            arrays = traced.fwd(captured)(*xs)
        crossed = _to_torch_many(arrays)
        # The JAX arrays of residuals and inputs, for a backward that reads them without
        # crossing back; not those of a capture, whose client the backward may not share
        # (capture clients, handoff._capture).
        if not captured:
            if getattr(_HERE, "keep", False):  # the eager autograd formula asks for them
                _HERE.kept = {i: (tensors[i], xs[i]) for i in traced.saved_in}
            for k in range(traced.n_new_out, len(crossed)):  # residuals, never the user's outputs
                crossed[k]._handoff_jax = arrays[k]
        self.owner._count_execution()
        outs: List[Any] = []
        for kind, i in traced.out_src:  # an input or an output returned again: a copy
            outs.append(crossed[i] if kind == "new" else (tensors if kind == "in" else outs)[i].clone())
        return _distinct(outs + crossed[traced.n_new_out:], tensors)

    def fake_forward(self, tensors: Sequence[Any]) -> List[Any]:
        """What :meth:`forward` returns, as tensors of the same shapes, dtypes and device
        (``torch.compile``'s and ``torch.export``'s fake tensors); nothing runs."""
        import torch

        traced = self.for_tensors(tensors)
        avals = traced.out_avals + traced.res_avals
        return [torch.empty(traced.torch_shape(s), dtype=_torch_dtype(d), device=self.device)
                for s, d in avals]

    def saved(self, tensors: Sequence[Any], outputs: Sequence[Any], traced: Optional["Traced"] = None) -> List[Any]:
        """What the backward reads: the inputs and outputs that are residuals, then the
        new residuals (``outputs`` is what :meth:`forward` returned; ``traced``, where
        known, the trace of ``tensors``)."""
        traced = traced or self.for_tensors(tensors)
        return ([tensors[i] for i in traced.saved_in] + [outputs[j] for j in traced.saved_out]
                + list(outputs[self.n_out:]))

    def backward(self, shapes: Sequence[int], saved: Sequence[Any], cts: Sequence[Any]) -> List[Any]:
        """The gradients of the inputs that a present cotangent reaches, in order."""
        return self.traced(_split(shapes, self.ranks)).backward(saved, cts)

    def fake_backward(self, shapes: Sequence[Any], cts: Sequence[Any]) -> List[Any]:
        """What :meth:`backward` returns, as fake tensors; nothing runs."""
        import torch

        split = _split(shapes, self.ranks)
        return [torch.empty(split[i], dtype=self.dtypes[i], device=self.device)
                for i in self.reached(shapes, cts)]

    def reached(self, shapes: Sequence[Any], cts: Sequence[Any]) -> List[int]:
        """The inputs (by position) whose gradients :meth:`backward` returns: those
        needing one that an output with a cotangent (``cts``, ``None`` where absent)
        reaches."""
        traced = self.for_shapes(_split(shapes, self.ranks))
        return traced.reached(tuple(ct is None for ct in cts))


class Traced:
    """One trace of a :class:`Program` at given input avals (concrete or symbolic)."""

    def __init__(self, program: Program, avals: Sequence[Any]) -> None:
        import jax
        from jax.extend.core import Literal, jaxpr_as_fun

        self.program = program
        self.env: Dict[str, Any] = {}
        #: The JAX views of parameters kept across calls (``handoff._views``).
        self.views = Views(len(avals))
        diff_idx, call = program.diff_idx, program.call

        def fn(*leaves):
            if not program.vjp:
                return call(leaves), None

            def g(*d):
                full = list(leaves)
                for i, x in zip(diff_idx, d):
                    full[i] = x
                return call(full)

            if program.policy is not None:
                g = jax.checkpoint(g, policy=program.policy)
            return jax.vjp(g, *[leaves[i] for i in diff_idx])

        with _jax_config.configured(program.context):
            closed, (out_shape, vjp_shape) = jax.make_jaxpr(fn, return_shape=True)(*avals)
        out_leaves, self.out_treedef = jax.tree_util.tree_flatten(out_shape)
        self.out_desc = _describe(jax, self.out_treedef, len(out_leaves), program.name)
        self.out_avals = [(tuple(a.shape), a.dtype) for a in out_leaves]
        self.out_float = tuple(is_float(d) for _, d in self.out_avals)
        res_leaves, self.vjp_treedef = jax.tree_util.tree_flatten(vjp_shape)
        program.adopt(self)

        # Which returned values are new arrays, and which are inputs or outputs again.
        jaxpr = closed.jaxpr
        n_out = len(out_leaves)
        where: Dict[Any, Source] = {v: ("in", i) for i, v in enumerate(jaxpr.invars)}
        new: List[int] = []
        self.out_src: List[Source] = []
        for j, v in enumerate(jaxpr.outvars[:n_out]):
            if not isinstance(v, Literal) and v in where:
                self.out_src.append(where[v] if where[v][0] == "in" else ("out", where[v][1]))
                continue
            self.out_src.append(("new", len(new)))
            new.append(j)
            if not isinstance(v, Literal):
                where[v] = ("out", j)
        self.n_new_out = len(new)
        res_src: List[Source] = []
        self.res_avals = []
        for r, v in enumerate(jaxpr.outvars[n_out:]):
            if not isinstance(v, Literal) and v in where:
                res_src.append(where[v])
                continue
            res_src.append(("res", len(self.res_avals)))
            self.res_avals.append((tuple(res_leaves[r].shape), res_leaves[r].dtype))
            new.append(n_out + r)
            if not isinstance(v, Literal):
                where[v] = ("res", len(self.res_avals) - 1)
        # The backward's saved list: residual inputs, residual outputs, new residuals.
        self.saved_in = sorted({i for k, i in res_src if k == "in"})
        self.saved_out = sorted({j for k, j in res_src if k == "out"})
        base = {"in": 0, "out": len(self.saved_in), "res": len(self.saved_in) + len(self.saved_out)}
        index = {"in": {i: p for p, i in enumerate(self.saved_in)},
                 "out": {j: p for p, j in enumerate(self.saved_out)}}
        self.res_pick = [base[k] + (index[k][i] if k in index else i) for k, i in res_src]

        self._closed = closed
        evaluate = jaxpr_as_fun(closed)
        keep = frozenset(new)
        self._run_fn = lambda *xs: [o for k, o in enumerate(evaluate(*xs)) if k in keep]
        #: The jitted forward (by whether it is compiled for a capture) and backwards (by
        #: the pattern of absent cotangents too), each compiled on first use.
        self._fwds: Dict[bool, Any] = {False: jax.jit(self._run_fn)}
        self._bwds: Dict[Tuple[Tuple[bool, ...], bool], Any] = {}
        self._reach: Optional[List[frozenset]] = None

    def torch_shape(self, shape: Sequence[Any]) -> Tuple[Any, ...]:
        """A JAX shape (ints and symbolic dimensions) in PyTorch's sizes."""
        return torch_shape(shape, self.env)

    def reached(self, missing: Tuple[bool, ...]) -> List[int]:
        """The inputs needing a gradient that an output with a cotangent reaches."""
        if not any(missing):
            return list(self.program.diff_idx)
        used = frozenset().union(*(r for r, m in zip(self.reaches(), missing) if not m))
        return [i for i in self.program.diff_idx if i in used]

    def reaches(self) -> List[frozenset]:
        """For each output, the inputs it depends on, read from the trace: every
        equation's outputs depend on all its inputs (an over-approximation inside control
        flow, never an under-one)."""
        if self._reach is None:
            jaxpr = self._closed.jaxpr
            self._reach = _dependencies(jaxpr)[: len(self.out_avals)]
        return self._reach

    def backward(self, saved: Sequence[Any], cts: Sequence[Any]) -> List[Any]:
        """:meth:`Program.backward` at this trace's shapes."""
        program = self.program
        missing = tuple(ct is None for ct in cts)
        present = [ct for ct, fl, m in zip(cts, self.out_float, missing) if fl and not m]
        captured = program.device.type == "cuda" and _capturing()
        with _jax_config.configured(program.context):
            bwd = self.bwd(missing, captured)
            arrays = _as_jax(list(saved) + present, captured, self._kept_view)
            grads = bwd(arrays[: len(saved)], arrays[len(saved):])
        program.owner._count_execution()
        return _to_torch_many(grads)

    def _kept_view(self, p: int, t: Any) -> Any:
        """The kept parameter view of ``t``, the backward's saved tensor at position
        ``p``, where that is an input whose view still holds (else ``None``): what a
        compiled backward, which gets no arrays from its forward, reads in place of
        handing the parameter to JAX again."""
        return self.views.get(self.saved_in[p], t) if p < len(self.saved_in) else None

    def fwd(self, captured: bool = False) -> Any:
        """The jitted forward: takes the inputs' arrays, returns the new outputs and
        residuals. ``captured``: compiled for a CUDA graph capture (:data:`CAPTURABLE`)."""
        found = self._fwds.get(captured)
        if found is None:
            import jax

            found = self._fwds[captured] = jax.jit(self._run_fn, compiler_options=CAPTURABLE)
        return found

    def bwd(self, missing: Tuple[bool, ...], captured: bool = False) -> Any:
        """The jitted backward for this pattern of absent cotangents: takes the saved
        arrays and the present floating-point cotangents; returns the reached gradients
        (zeros stand in for absent cotangents, ``float0`` for integer outputs).
        ``captured``: compiled for a CUDA graph capture (:data:`CAPTURABLE`)."""
        found = self._bwds.get((missing, captured))
        if found is not None:
            return found
        import jax
        import numpy as np

        treedef, vjp_treedef, pick = self.out_treedef, self.vjp_treedef, self.res_pick
        meta, is_float = self.out_avals, self.out_float
        keep = [self.program.diff_idx.index(i) for i in self.reached(missing)]

        def bwd(saved, cts):
            vjp = jax.tree_util.tree_unflatten(vjp_treedef, [saved[p] for p in pick])
            it = iter(cts)
            full = [
                (jax.numpy.zeros(s, d) if m else next(it)) if fl else np.zeros(s, jax.dtypes.float0)
                for (s, d), fl, m in zip(meta, is_float, missing)
            ]
            grads = vjp(jax.tree_util.tree_unflatten(treedef, full))
            return [grads[k] for k in keep]

        options = {"compiler_options": CAPTURABLE} if captured else {}
        return self._bwds.setdefault((missing, captured), jax.jit(bwd, **options))


#: Between the eager autograd formula (``handoff._torch_ops``) and the kernels it calls on
#: this thread: ``keep`` asks the forward to keep the JAX arrays of the inputs the
#: backward reads, ``kept`` holds them (input position -> (tensor, array)), and ``known``
#: offers them to the backward (tensor id -> (tensor, array)). A compiled graph calls the
#: kernels without it; its backward reads the parameters' kept views (``handoff._views``)
#: and hands the other inputs to JAX again.
_HERE = threading.local()


#: XLA's compile options for what runs inside a CUDA graph capture: XLA's own CUDA
#: graphs (command buffers) off, for this executable alone (a command buffer cannot be
#: launched into another capture; ``XLA_FLAGS`` stays the user's).
CAPTURABLE = {"xla_gpu_enable_command_buffer": ""}


def _capturing() -> bool:
    """Whether PyTorch's current CUDA stream is capturing a graph."""
    import torch

    return torch.cuda.is_current_stream_capturing()


def _as_jax(tensors: Sequence[Any], captured: bool = False,
            kept_view: Optional[Callable[[int, Any], Any]] = None) -> List[Any]:
    """JAX arrays of these tensors: the array a tensor was made from where the forward
    kept it (with a residual, or offered on this thread), a parameter's kept view
    (``kept_view(position, tensor)``), the others handed to JAX (in one call). Inside a
    capture (``captured``) every tensor crosses: onto the capture's client where capture
    clients are on (``handoff._capture``), which the forward's arrays may not be on."""
    known = getattr(_HERE, "known", None) or {}
    _HERE.known = None
    if captured:
        return list(_to_jax_many(tensors))
    arrays = []
    for p, t in enumerate(tensors):
        a = getattr(t, "_handoff_jax", None)
        if a is None:
            k = known.get(id(t))
            if k is not None and k[0] is t:
                a = k[1]
            elif kept_view is not None:
                a = kept_view(p, t)
        arrays.append(a)
    missing = [t for t, a in zip(tensors, arrays) if a is None]
    if missing:
        crossed = iter(_to_jax_many(missing))
        arrays = [next(crossed) if a is None else a for a in arrays]
    return arrays


def _distinct(results: List[Any], inputs: Sequence[Any]) -> List[Any]:
    """Custom operators' outputs may not alias their inputs or each other, and PyTorch
    tells by storage object, not by address: two views of one buffer are told apart
    here, by address, and the later one copied."""
    seen = {t.data_ptr() for t in inputs if t.numel()}
    for k, t in enumerate(results):
        if not t.numel():
            continue
        p = t.data_ptr()
        if p in seen:
            results[k] = t.clone()
        else:
            seen.add(p)
    return results


def _describe(jax: Any, treedef: Any, n: int, name: str) -> Any:
    """The ``_tree`` description of JAX's output structure (JAX's leaf order)."""
    order: List[Any] = []
    desc = _tree.flatten(jax.tree_util.tree_unflatten(treedef, list(range(n))), order)
    if order != list(range(n)):
        raise TypeError(
            f"{name}: the function returned {treedef}; outputs must be arrays in tuples, "
            "lists, dicts and namedtuples (other pytree nodes cannot cross to PyTorch)"
        )
    return desc


def _dependencies(jaxpr: Any) -> List[frozenset]:
    """Which of ``jaxpr``'s inputs each of its outputs depends on."""
    deps: Dict[Any, frozenset] = {v: frozenset((i,)) for i, v in enumerate(jaxpr.invars)}
    none: frozenset = frozenset()

    def of(v):
        return none if type(v).__name__ == "Literal" else deps.get(v, none)

    for eqn in jaxpr.eqns:
        d = none.union(*(of(v) for v in eqn.invars))
        for o in eqn.outvars:
            deps[o] = d
    return [of(v) for v in jaxpr.outvars]


def _split(flat: Sequence[Any], ranks: Sequence[int]) -> Tuple[Tuple[Any, ...], ...]:
    out, k = [], 0
    for r in ranks:
        out.append(tuple(flat[k:k + r]))
        k += r
    return tuple(out)
