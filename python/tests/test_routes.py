"""``handoff.to_jax`` / ``handoff.to_torch``: the native route (PyTorch's C exchange API,
jaxlib's buffer functions) and the public one (``from_dlpack(handoff.ordered(x))``)
give the same results, result by result: dtype, shape, strides, values, device, and the
same error type and message where the producer refuses. On the CPU (JAX and PyTorch's
CPU builds); the GPU script (``bench/gpu_exchange_checks.py``) proves the ordering of each route.

Each comparison runs on each route (``seams.ROUTES``): the process's own, native here,
on any wheel, against the public route spelled out; and the public route forced with
``_set_route`` (a test seam, marked ``hooks``) against the same spelling.
"""

import gc
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest

import handoff

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

try:
    import torch
except Exception as e:  # noqa: BLE001 - torch without its CUDA libraries raises ValueError
    pytest.skip(f"torch does not import: {e}", allow_module_level=True)

from seams import ROUTES, hooks, set_route  # noqa: E402


@pytest.fixture(autouse=True)
def _auto_after():
    yield
    set_route("auto")


def outcome(f, x):
    """``f(x)``, or the exception it raised."""
    try:
        return f(x)
    except Exception as e:  # noqa: BLE001 - compared by the caller
        return e


def both(route, to, x, writable=False):
    """``handoff.to_jax(x)`` (``to="jax"``) or ``handoff.to_torch(x, writable=...)`` by
    ``route``, and the public route spelled out, ``jax.dlpack.from_dlpack(handoff.ordered(x))``
    or ``torch.from_dlpack(handoff.ordered(x, writable=...))`` (what the public route
    calls): each result, or the exception it raised."""
    if to == "jax":
        cross, public = handoff.to_jax, lambda x: jax.dlpack.from_dlpack(handoff.ordered(x))
    else:
        cross = lambda x: handoff.to_torch(x, writable=writable)  # noqa: E731
        public = lambda x: torch.from_dlpack(handoff.ordered(x, writable=writable))  # noqa: E731
    set_route(route)
    try:
        crossed = outcome(cross, x)
    finally:
        set_route("auto")
    return crossed, outcome(public, x)


def same_error(native, public):
    assert isinstance(native, Exception) and isinstance(public, Exception), (native, public)
    assert type(native) is type(public)
    assert str(native) == str(public)


def test_both_routes_are_native_here():
    r = handoff.routes()
    assert r["torch_to_jax"] == "native", r
    assert r["jax_to_torch"] == "native", r
    assert "C exchange API" in r["reasons"]["torch"]
    assert "dlpack_managed_tensor_to_buffer" in r["reasons"]["jax"]
    assert r["reasons"]["forced"] == "no"


@hooks
def test_the_public_route_can_be_forced_in_process():
    set_route("public")
    r = handoff.routes()
    assert (r["torch_to_jax"], r["jax_to_torch"]) == ("public", "public")
    assert r["reasons"]["forced"] != "no"


def run_python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_environment_forces_the_public_route():
    code = "import handoff, torch, jax; r = handoff.routes(); print(r['torch_to_jax'], r['jax_to_torch'])"
    r = run_python(code, HANDOFF_ROUTE="public")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["public", "public"]
    r = run_python(code, HANDOFF_ROUTE="auto")
    assert r.stdout.split() == ["native", "native"], r.stderr


def test_a_misspelt_route_is_refused_at_import():
    r = run_python("import handoff", HANDOFF_ROUTE="fast")
    assert r.returncode != 0
    assert 'HANDOFF_ROUTE="fast"' in r.stderr and '"public"' in r.stderr


TORCH_TENSORS = {
    "f32": lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "f16": lambda: torch.arange(6, dtype=torch.float16),
    "bf16": lambda: torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
    "f64": lambda: torch.arange(6, dtype=torch.float64) / 3,
    "i64": lambda: torch.arange(-3, 3, dtype=torch.int64),
    "i32": lambda: torch.arange(5, dtype=torch.int32),
    "u8": lambda: torch.arange(7, dtype=torch.uint8),
    "bool": lambda: torch.tensor([True, False, True]),
    "c64": lambda: torch.arange(4.0).to(torch.complex64) * (1 + 2j),
    "scalar": lambda: torch.tensor(3.5),
    "empty": lambda: torch.zeros(0, 3),
    "size_one": lambda: torch.arange(3.0).reshape(1, 3),
    "transposed": lambda: torch.arange(12.0).reshape(3, 4).T,
    "stepped": lambda: torch.arange(20.0)[::3],
    "offset": lambda: torch.arange(20.0)[5:],
    "unaligned": lambda: torch.arange(21.0)[1:].reshape(4, 5),
    "expanded": lambda: torch.arange(3.0).expand(4, 3),
    "parameter": lambda: torch.nn.Parameter(torch.ones(2, 2), requires_grad=False),
}


def jax_facts(a):
    return a.dtype, a.shape, np.asarray(a).tolist(), a.devices(), a.weak_type


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("name", list(TORCH_TENSORS))
def test_torch_to_jax_routes_agree(name, x64, route):
    with jax.enable_x64(x64):
        t = TORCH_TENSORS[name]()
        crossed, public = both(route, "jax", t)
        try:
            plain = jax.dlpack.from_dlpack(t)
        except Exception as e:  # noqa: BLE001 - JAX refuses broadcast or stepped strides
            plain = e
        if isinstance(plain, Exception):
            same_error(crossed, public)
            same_error(crossed, plain)
            return
        assert type(crossed) is type(public)
        assert jax_facts(crossed) == jax_facts(public) == jax_facts(plain)


TORCH_REFUSED = {
    "requires_grad": lambda: torch.ones(3, requires_grad=True),
    "conjugate": lambda: (torch.arange(3.0).to(torch.complex64) * 1j).conj(),
    "sparse": lambda: torch.ones(3).to_sparse(),
    "subclass": lambda: torch.ones(2).as_subclass(type("MyTensor", (torch.Tensor,), {})),
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", list(TORCH_REFUSED))
def test_torch_to_jax_routes_refuse_alike(name, route):
    t = TORCH_REFUSED[name]()
    crossed, public = both(route, "jax", t)
    if name == "subclass":  # exported by its own __dlpack__, on both routes
        assert jax_facts(crossed) == jax_facts(public)
    else:
        same_error(crossed, public)
        assert isinstance(crossed, BufferError)


def jax_arrays():
    return {
        "f32": jnp.arange(12, dtype=jnp.float32).reshape(3, 4),
        "bf16": jnp.arange(6, dtype=jnp.bfloat16),
        "f16": jnp.ones((2, 2), jnp.float16),
        "i32": jnp.arange(-2, 3, dtype=jnp.int32),
        "u8": jnp.arange(4, dtype=jnp.uint8),
        "bool": jnp.array([True, False]),
        "scalar": jnp.float32(2.5) + 0,
        "empty": jnp.zeros((0, 2)),
        "size_one": jnp.ones((1, 3)),
        "computed": jnp.arange(12.0).reshape(3, 4).T * 2,
    }


def torch_facts(t):
    return t.dtype, tuple(t.shape), t.stride(), t.tolist(), t.device, t.is_contiguous(), t.requires_grad


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("name", list(jax_arrays()))
def test_jax_to_torch_routes_agree(name, writable, route):
    a = jax_arrays()[name]
    crossed, public = both(route, "torch", a, writable=writable)
    plain = torch.from_dlpack(a)
    assert type(crossed) is type(public) is torch.Tensor
    assert torch_facts(crossed) == torch_facts(public) == torch_facts(plain)


@pytest.mark.parametrize("route", ROUTES)
def test_jax_to_torch_routes_refuse_alike(route):
    a = jnp.ones(3)
    a.delete()
    crossed, public = both(route, "torch", a)
    same_error(crossed, public)
    # Not a JAX array: both take handoff.ordered's route.
    n = np.arange(4.0)
    crossed, public = both(route, "torch", n)
    assert torch_facts(crossed) == torch_facts(public)


class CommandBufferInCapture:
    """A producer failing as JAX does when XLA launches a CUDA graph of its own (a
    command buffer) into a stream that captures PyTorch's graph."""

    MESSAGE = (
        "INTERNAL: CUDA error: Failed to launch CUDA graph: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: "
        "operation not permitted when stream is capturing [executable_name='jit_fwd_vjp']"
    )

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        raise RuntimeError(self.MESSAGE)


def test_xlas_command_buffer_in_a_capture_is_told_with_the_option_that_turns_it_off():
    with pytest.raises(handoff.HandoffError, match="XLA_FLAGS=--xla_gpu_enable_command_buffer=") as e:
        handoff.to_torch(CommandBufferInCapture())
    assert "jax.jit(f, compiler_options={'xla_gpu_enable_command_buffer': ''})" in str(e.value)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert str(e.value.__cause__) == CommandBufferInCapture.MESSAGE
    # Any other error of the producer reaches the caller as it is.
    other = CommandBufferInCapture()
    other.MESSAGE = "INTERNAL: something else"
    with pytest.raises(RuntimeError, match="^INTERNAL: something else$"):
        handoff.to_torch(other)


def released_after(cross, x):
    """Crosses ``x``, drops the result; the counters' change, and the result's address."""
    before = handoff.stats()
    y = cross(x)
    ptr = y.unsafe_buffer_pointer() if hasattr(y, "unsafe_buffer_pointer") else y.data_ptr()
    mid = handoff.stats()
    del y
    handoff.flush()
    after = handoff.stats()
    delta = {k: after[k] - before[k] for k in after}
    delta["imports_before_release"] = mid["imports"] - before["imports"]
    return delta, ptr, after


@pytest.mark.parametrize("direction", ["torch_to_jax", "jax_to_torch"])
def test_native_crossings_view_without_a_copy_and_release_once(direction):
    if direction == "torch_to_jax":
        x = torch.arange(64.0)
        delta, ptr, after = released_after(handoff.to_jax, x)
        assert ptr == x.data_ptr()
    else:
        x = jnp.arange(64.0)
        delta, ptr, after = released_after(handoff.to_torch, x)
        assert ptr == x.unsafe_buffer_pointer()
    assert delta["imports_before_release"] == 1
    assert delta["copies"] == 0 and delta["host_syncs"] == 0
    assert delta["releases_immediate"] == 1  # the CPU: no stream to wait for
    assert after["pending"] == 0 and delta["releases_leaked"] == 0
    assert np.asarray(x).tolist() == list(map(float, range(64)))  # still the producer's


def test_a_torch_tensor_outlives_its_python_object_in_jax():
    t = torch.arange(1000.0)
    a = handoff.to_jax(t)
    del t
    junk = [torch.full((1000,), -1.0) for _ in range(20)]  # reuse freed memory, if any
    assert np.asarray(a).tolist() == list(map(float, range(1000)))
    del junk


@pytest.mark.parametrize("route", ROUTES)
def test_a_view_for_torch_function_keeps_no_autograd_history_alive(route):
    """The JAX view of a tensor with a history (``torch_function``'s inputs) holds a
    detached tensor: the original, its ``grad_fn`` and the graph behind it (down to the
    parameters' AccumulateGrad nodes) go when the caller drops them."""
    set_route(route)
    w = torch.randn(4, 4, requires_grad=True)
    h = torch.tanh(torch.randn(4, 4) @ w)
    expected = h.detach().tolist()
    original = weakref.ref(h)
    (view,) = handoff._handoff._to_jax_many([h])
    del h
    gc.collect()
    assert original() is None, "the JAX view keeps the tensor with its autograd history alive"
    assert np.asarray(view).tolist() == expected


@pytest.mark.parametrize("route", ROUTES)
def test_the_many_forms_detach_and_make_contiguous(route):
    tensors = [torch.ones(2, 3, requires_grad=True), torch.arange(12.0).reshape(3, 4).T, torch.arange(3)]
    set_route(route)
    xs = handoff._handoff._to_jax_many(tensors)
    assert [x.shape for x in xs] == [(2, 3), (4, 3), (3,)]
    assert np.asarray(xs[1]).tolist() == tensors[1].tolist()
    ts = handoff._handoff._to_torch_many(xs)
    assert [t.tolist() for t in ts] == [t.tolist() for t in tensors]
