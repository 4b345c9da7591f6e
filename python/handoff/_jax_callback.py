"""The JAX side and the PyTorch side of ``handoff.jax_function``.

A :class:`Signature` is one input signature of a :class:`~handoff.JaxFunction` (the
arguments' pytree structure, shapes and dtypes, JAX's configuration). Made once, it
holds the output structure, whether the function draws random numbers, and a
``jax.custom_vjp`` function whose forward and backward are ``buffer_callback`` calls.
Both callbacks run the PyTorch function on zero-copy views of XLA's buffers, on XLA's
stream on CUDA (``torch.cuda.ExternalStream(ctx.stream)``); the forward copies each
result into XLA's output buffer (one stream-ordered copy per output, counted in
``handoff.stats()``); the backward runs the forward again under ``torch.func.vjp``.

The signature's first trace runs the function once under PyTorch's ``FakeTensorMode``
(no kernel runs): it gives the output shapes where ``out_shapes`` is not given, checks
them where it is, refuses in-place changes of the inputs before anything ran, and sees
whether the function draws random numbers (an operator tagged
``nondeterministic_seeded``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._handoff import _count_copy
from ._random import draws, random_on_cuda, replay, rng_bytes, rng_state
from ._jax_function import _argument, _jax_dtype, _output, _paths, _struct, _torch_dtype, ours, torch

#: DLPack device types read as CUDA devices by PyTorch (kDLCUDA, kDLROCM).
_CUDA_DLPACK = (2, 10)

#: Whether the PyTorch function runs on XLA's stream (the order and the lifetime of its
#: memory both rest on it). Switched off only by the GPU check's control, to show it is
#: needed (``bench/jax_function_checks.py``): the function then runs on PyTorch's
#: current stream, unordered.
ON_XLA_STREAM = True


class Signature:
    """One input signature of ``owner`` (a JaxFunction): see the module's docs.
    ``call(*leaves)`` returns the output leaves (JAX arrays) in order."""

    def __init__(self, owner: Any, in_tree: Any, in_avals: Sequence[Any], device: Any) -> None:
        import jax
        import numpy as np

        from . import _jax_config

        self.owner, self.name, self.device = owner, owner._name, torch().device(device)
        self.in_tree, self.in_avals = in_tree, list(in_avals)
        self.where = [_argument(p) for p in _paths(in_tree)]
        self.x64 = _jax_config.x64()
        self.floating = [jax.numpy.issubdtype(a.dtype, jax.numpy.floating) for a in self.in_avals]
        traced, error = self._fake(device)
        spec = owner.out_shapes
        if callable(spec):
            spec = spec(*in_tree.unflatten([jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.in_avals]))
        elif spec is None:
            if error is not None:
                raise ours(TypeError(
                    f"{self.name}: out_shapes was not given and PyTorch's FakeTensorMode could not "
                    f"compute the output shapes ({type(error).__name__}: {error}); pass out_shapes "
                    "(a pytree of jax.ShapeDtypeStruct, or a function of the arguments' shapes)"))
            spec = traced[0]
        leaves, self.out_tree = jax.tree_util.tree_flatten(spec)
        self.out_where = [_output(p) for p in _paths(self.out_tree)]
        for w, x in zip(self.out_where, leaves):
            if not (hasattr(x, "shape") and hasattr(x, "dtype")):
                raise ours(TypeError(
                    f"{self.name}: {w} of out_shapes is a {type(x).__name__} ({x!r:.60}): give a "
                    "jax.ShapeDtypeStruct (or anything with shape and dtype)"))
        self.declared = [_torch_dtype(self, w, x.dtype) for w, x in zip(self.out_where, leaves)]
        self.out_avals = []
        for w, x, dt in zip(self.out_where, leaves, self.declared):
            shape = tuple(x.shape)
            if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
                raise ours(ValueError(
                    f"{self.name}: {w} in out_shapes has shape {shape}: sizes must be ints >= 0"))
            jdt = _jax_dtype(dt)
            if jdt == np.float64 and not self.x64:
                raise ours(TypeError(
                    f"{self.name}: {w} is float64 but JAX's x64 mode is off (JAX would hold it as "
                    "float32): jax.config.update('jax_enable_x64', True), or return float32"))
            if owner.out and jax.dtypes.canonicalize_dtype(jdt) != jdt:
                raise ours(TypeError(
                    f"{self.name}: {w} is {jdt} and JAX's x64 mode is off: out=True cannot write it "
                    "into JAX's 32-bit buffer; return a 32-bit dtype or turn x64 mode on"))
            self.out_avals.append(jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(jdt)))
        self.out_floating = [jax.numpy.issubdtype(a.dtype, jax.numpy.floating) for a in self.out_avals]
        if traced is not None and owner.out_shapes is not None:
            self.check_tree(jax.tree_util.tree_structure(traced[0]), fake=True)
            self.check(traced[1], self.device, fake=True)
        self.random = owner.random if owner.random is not None else (traced is None or traced[2])
        self.call = self._custom_vjp()

    # ---- the trace -------------------------------------------------------------------

    def _fake(self, device: Any) -> Tuple[Optional[Tuple[Any, List[Any], bool]], Optional[Exception]]:
        """Runs the function on fake tensors: ``((spec, results, random), None)``, or
        ``(None, error)`` where FakeTensorMode cannot run it. An in-place change of an
        input is raised."""
        import jax
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._python_dispatch import TorchDispatchMode

        t = torch()
        seeded = t.Tag.nondeterministic_seeded

        class Watch(TorchDispatchMode):
            random = False

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if seeded in func.tags and draws(func, args, kwargs or {}):
                    Watch.random = True
                return func(*args, **(kwargs or {}))

        try:
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            with mode:
                xs = [t.empty(a.shape, dtype=_torch_dtype(self, w, a.dtype), device=device)
                      for w, a in zip(self.where, self.in_avals)]
            versions = [x._version for x in xs]
            with mode, Watch(), t.no_grad():
                result = self.owner.fn(*self.in_tree.unflatten(xs))
            self.check_versions(xs, versions)
            results, _ = jax.tree_util.tree_flatten(result)
            spec = jax.tree_util.tree_map(lambda r: _struct(self, r), result)
        except Exception as e:  # noqa: BLE001 - handoff's own errors are raised, others reported
            if getattr(e, "_handoff", False):
                raise
            return None, e
        return (spec, results, Watch.random), None

    # ---- checks ----------------------------------------------------------------------

    def check_tree(self, tree: Any, fake: bool = False) -> None:
        if tree != self.out_tree:
            raise ours(TypeError(
                f"{self.name}: the function returned {tree}, out_shapes says {self.out_tree}{_when(fake)}"))

    def check(self, results: Sequence[Any], device: Any, fake: bool = False) -> None:
        """Raises where a result is not the tensor ``out_shapes`` declares."""
        t = torch()
        when = _when(fake)
        for k, r in enumerate(results):
            w = self.out_where[k]
            if not isinstance(r, t.Tensor):
                raise ours(TypeError(
                    f"{self.name}: {w} is a {type(r).__name__} ({r!r:.60}), not a torch.Tensor"))
            want = self.out_avals[k]
            if tuple(r.shape) != want.shape:
                raise ours(ValueError(
                    f"{self.name}: {w} has shape {tuple(r.shape)}, out_shapes says {want.shape}{when}"))
            if r.dtype != self.declared[k]:
                raise ours(TypeError(
                    f"{self.name}: {w} is {r.dtype}, out_shapes says {self.declared[k]}{when}"))
            if not fake and r.device != device:
                raise ours(ValueError(
                    f"{self.name}: {w} is on {r.device} but the call runs on {device}: return it there "
                    "(a copy across devices would wait on the host)"))

    def check_versions(self, xs: Sequence[Any], versions: Sequence[int]) -> None:
        for x, v, w in zip(xs, versions, self.where):
            if x._version != v:
                raise ours(ValueError(
                    f"{self.name}: the PyTorch function modified {w} in place; its tensor is a view of "
                    "XLA's buffer, which JAX may read again: compute into a new tensor (x = x + 1, "
                    "not x += 1 or x.add_(1))"))

    def flat(self, xs: Sequence[Any]) -> List[Any]:
        """The function on input leaves: the output leaves, checked."""
        import jax

        result = self.owner.fn(*self.in_tree.unflatten(xs))
        leaves, tree = jax.tree_util.tree_flatten(result)
        self.check_tree(tree)
        self.check(leaves, xs[0].device if xs else leaves[0].device)
        return leaves

    # ---- JAX -------------------------------------------------------------------------

    def _custom_vjp(self) -> Callable[..., Any]:
        import jax
        from jax.custom_derivatives import SymbolicZero
        from jax.experimental.buffer_callback import buffer_callback

        vmap = {"torch": "expand_dims", "sequential": "sequential", None: None}[self.owner.vmap_method]
        # Command buffers (command_buffer_compatible=True) need the PyTorch work's memory to
        # outlive XLA's traces of them: not done yet, so XLA launches the callback itself.
        options = dict(vmap_method=vmap, command_buffer_compatible=False)
        outs = tuple(self.out_avals)
        primal = buffer_callback(self._forward, outs, **options)
        rng = jax.ShapeDtypeStruct((rng_bytes(),), jax.numpy.uint8)
        with_rng = buffer_callback(self._forward, outs + (rng,), **options) if self.random else primal
        backwards: Dict[Any, Callable[..., Any]] = {}
        n = len(self.in_avals)

        @jax.custom_vjp
        def call(*leaves):
            return tuple(primal(*leaves))

        def fwd(*primals):
            leaves = [p.value for p in primals]
            got = tuple(with_rng(*leaves))
            state = got[-1] if self.random else None
            perturbed = tuple(p.perturbed for p in primals)
            return got[: len(outs)], _residuals()(tuple(leaves), state, perturbed)

        def bwd(res, cts):
            if self.random and self.device.type == "cuda" and self.owner.host_syncs == "error":
                raise random_on_cuda(self)  # at trace time (the callback checks again)
            grad_idx = tuple(i for i in range(n) if res.perturbed[i] and self.floating[i])
            ct_idx = tuple(j for j, c in enumerate(cts)
                           if self.out_floating[j] and not isinstance(c, SymbolicZero))
            if not grad_idx or not ct_idx:
                return (None,) * n
            key = (grad_idx, ct_idx)
            if key not in backwards:
                def backward(ctx, out, *ins, key=key):
                    self._backward(key, ctx, out, *ins)
                backwards[key] = buffer_callback(
                    backward, tuple(jax.ShapeDtypeStruct(self.in_avals[i].shape, self.in_avals[i].dtype)
                                    for i in grad_idx), **options)
            state = () if res.state is None else (res.state,)
            grads = backwards[key](*res.leaves, *state, *(cts[j] for j in ct_idx))
            full: List[Any] = [None] * n
            for i, g in zip(grad_idx, grads):
                full[i] = g
            return tuple(full)

        call.defvjp(fwd, bwd, symbolic_zeros=True)
        return call

    # ---- the callbacks (PyTorch) -----------------------------------------------------

    def _forward(self, ctx: Any, out: Sequence[Any], *ins: Any) -> None:
        t = torch()
        with _Session(self, ctx, ins or out) as s:
            xs, ys = [s.tensor(b) for b in ins], [s.tensor(b) for b in out]
            extra = s.batch_dims(self, xs, ys)
            if len(ys) > len(self.out_avals):  # the random state, for the backward
                state, into = rng_state(s.device), ys[-1]
                into = into[..., : state.numel()]
                into.copy_(state, non_blocking=True)
                _count_copy(into.numel())
                ys = ys[:-1]
            versions = [x._version for x in xs]
            with t.no_grad():
                if self.owner.out and not extra:
                    args, outs = self.in_tree.unflatten(xs), self.out_tree.unflatten(ys)
                    got = s.run(lambda: self.owner.fn(*args, out=outs))
                    self._check_out(got, ys)
                    results: List[Any] = []
                else:
                    results = s.run(lambda: _batched(lambda *a: tuple(self.flat(a)), xs, extra))
            self.check_versions(xs, versions)
            for y, r in zip(ys, results):
                y.copy_(r)
                _count_copy(y.numel() * y.element_size())

    def _backward(self, key: Tuple[Tuple[int, ...], Tuple[int, ...]], ctx: Any, out: Sequence[Any],
                  *ins: Any) -> None:
        t = torch()
        grad_idx, ct_idx = key
        n = len(self.in_avals)
        with _Session(self, ctx, ins) as s:
            bufs = [s.tensor(b) for b in ins]
            xs = bufs[:n]
            state = bufs[n] if self.random else None
            cts = bufs[n + (1 if self.random else 0):]
            gs = [s.tensor(b) for b in out]
            extra = s.batch_dims(self, xs, [])

            def vjp(*a):
                x, ct = list(a[:n]), a[n:]

                def f(*diff):
                    for i, d in zip(grad_idx, diff):
                        x[i] = d
                    got = self.flat(x)
                    return tuple(got[j] for j in ct_idx)

                _, pullback = t.func.vjp(f, *(x[i] for i in grad_idx))
                return pullback(tuple(ct))

            versions = [x._version for x in xs]
            with replay(self, s, state), t.enable_grad():
                grads = s.run(lambda: _batched(vjp, xs + cts, extra))
            self.check_versions(xs, versions)
            for g, r in zip(gs, grads):
                g.copy_(r)
                _count_copy(g.numel() * g.element_size())

    def _check_out(self, got: Any, ys: Sequence[Any]) -> None:
        """With ``out=True`` the function returns ``None`` or the ``out`` tensors."""
        import jax

        mine = {(y.data_ptr(), tuple(y.shape)) for y in ys}
        for r in jax.tree_util.tree_leaves(got):
            if not isinstance(r, torch().Tensor) or (r.data_ptr(), tuple(r.shape)) not in mine:
                raise ours(ValueError(
                    f"{self.name}: with out=True the function must write its results into the "
                    "tensors passed as out= and return None or those tensors; it returned another "
                    f"{type(r).__name__}"))


def _when(fake: bool) -> str:
    return " (found while tracing, on fake tensors)" if fake else ""


class _Session:
    """The PyTorch side of one callback: the inputs' device, XLA's stream as PyTorch's
    current stream on CUDA, PyTorch's sync debug mode, the errors."""

    _streams: Dict[Tuple[int, int], Any] = {}

    def __init__(self, sig: Signature, ctx: Any, buffers: Sequence[Any]) -> None:
        self.sig, self.ctx = sig, ctx
        kind, ordinal = buffers[0].__dlpack_device__() if buffers else (1, 0)
        self.cuda = kind in _CUDA_DLPACK
        self.device = torch().device("cuda", ordinal) if self.cuda else torch().device("cpu")
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> "_Session":
        t = torch()
        try:
            if self.cuda:
                self.stack.enter_context(t.cuda.device(self.device))
            if self.cuda and ON_XLA_STREAM:
                key = (self.ctx.stream, self.device.index)
                stream = self._streams.get(key)
                if stream is None:
                    stream = self._streams[key] = t.cuda.ExternalStream(key[0], device=self.device)
                self.stack.enter_context(t.cuda.stream(stream))
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, kind, e, tb) -> bool:
        self.stack.close()
        if e is not None and isinstance(e, Exception):
            self.sig.owner.last_error = e
            if not getattr(e, "_handoff", False):
                raise RuntimeError(f"{self.sig.name}: {type(e).__name__}: {e}") from e
        return False

    def tensor(self, buffer: Any) -> Any:
        return torch().from_dlpack(buffer)

    def batch_dims(self, sig: Signature, xs: Sequence[Any], ys: Sequence[Any]) -> int:
        """How many leading dimensions ``jax.vmap`` added (``vmap_method="torch"``)."""
        if xs:
            return xs[0].dim() - len(sig.in_avals[0].shape)
        return ys[0].dim() - len(sig.out_avals[0].shape) if ys else 0

    def run(self, body: Callable[[], Any]) -> Any:
        """Runs the PyTorch function's work: host syncs are refused (``host_syncs``) on
        CUDA, and what it raises is reported as its own."""
        policy = self.sig.owner.host_syncs
        watched = self.cuda and policy != "allow"
        if watched:
            _SYNC_DEBUG.enter(policy)
        try:
            return body()
        except Exception as e:  # noqa: BLE001 - re-raised with what happened
            if getattr(e, "_handoff", False):
                raise
            if self.cuda and "synchroniz" in str(e):
                raise ours(RuntimeError(
                    f"{self.sig.name}: the PyTorch function synchronized the host with the GPU "
                    f"({type(e).__name__}: {e}). Inside a jitted JAX program that stalls XLA's "
                    "stream: remove the sync (.item(), .cpu(), .tolist(), torch.nonzero, printing a "
                    "CUDA tensor, torch.cuda.synchronize), or pass host_syncs='warn' or 'allow'")) from e
            raise ours(RuntimeError(
                f"{self.sig.name}: the PyTorch function raised {type(e).__name__}: {e}")) from e
        finally:
            if watched:
                _SYNC_DEBUG.exit()


class _SyncDebug:
    """PyTorch's sync debug mode (process-wide) while any callback runs the function:
    set by the first to enter, put back by the last to leave (callbacks of several
    devices run on several threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.saved: Any = None

    def enter(self, policy: str) -> None:
        with self.lock:
            if self.inside == 0:
                self.saved = torch().cuda.get_sync_debug_mode()
                torch().cuda.set_sync_debug_mode(policy)
            self.inside += 1

    def exit(self) -> None:
        with self.lock:
            self.inside -= 1
            if self.inside == 0:
                torch().cuda.set_sync_debug_mode(self.saved)


_SYNC_DEBUG = _SyncDebug()


def _batched(f: Callable[..., Any], xs: Sequence[Any], extra: int) -> Any:
    """``f(*xs)``, or under ``jax.vmap`` (``extra`` leading dimensions that JAX added, of
    size 1 where an input is not batched) one ``torch.func.vmap`` per dimension."""
    if extra == 0:
        return f(*xs)
    t = torch()
    sizes = [max(x.shape[k] for x in xs) for k in range(extra)]
    batched = [[x.shape[k] == sizes[k] for k in range(extra)] for x in xs]
    xs = [x.reshape([x.shape[k] for k in range(extra) if b[k]] + list(x.shape[extra:]))
          for x, b in zip(xs, batched)]
    g = f
    for k in reversed(range(extra)):
        g = t.func.vmap(g, in_dims=tuple(0 if b[k] else None for b in batched), randomness="different")
    return g(*xs)


_RESIDUALS = None


def _residuals():
    """What the forward keeps for the backward: the input leaves, the generator's
    state (or ``None``) and, static, which inputs JAX differentiates."""
    global _RESIDUALS
    if _RESIDUALS is None:
        import jax

        class Residuals:
            def __init__(self, leaves, state, perturbed):
                self.leaves, self.state, self.perturbed = leaves, state, perturbed

        jax.tree_util.register_pytree_node(
            Residuals, lambda r: ((r.leaves, r.state), r.perturbed),
            lambda perturbed, kids: Residuals(kids[0], kids[1], perturbed))
        _RESIDUALS = Residuals
    return _RESIDUALS
