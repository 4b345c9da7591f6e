"""``handoff.ordered`` is invisible to the consumer: for PyTorch, NumPy and JAX as
producer and as consumer, ``from_dlpack(handoff.ordered(x))`` gives what
``from_dlpack(x)`` gives — shape, strides (size-1 and size-0 dimensions' included),
dtype, device, values, and the error type where the consumer refuses."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import handoff

jax = pytest.importorskip("jax")
import jax.dlpack  # noqa: E402
import jax.numpy as jnp  # noqa: E402

try:
    import torch
except Exception as e:  # noqa: BLE001 - torch without its CUDA libraries raises ValueError
    pytest.skip(f"torch does not import: {e}", allow_module_level=True)

from seams import ROUTES, set_route  # noqa: E402


def facts(y):
    """What a consumer's result says, framework by framework."""
    if isinstance(y, torch.Tensor):
        return ("torch", y.dtype, tuple(y.shape), y.stride(), y.device, y.tolist())
    if isinstance(y, np.ndarray):
        return ("numpy", y.dtype, y.shape, y.strides, y.tolist())
    return ("jax", y.dtype, y.shape, str(y.devices()), np.asarray(y).tolist())


CONSUMERS = {
    "torch": torch.from_dlpack,
    "numpy": np.from_dlpack,
    "jax": jax.dlpack.from_dlpack,
}


def outcome(consume, x):
    try:
        return facts(consume(x))
    except Exception as e:  # noqa: BLE001 - compared by type
        return ("error", type(e))


def check(x):
    for name, consume in CONSUMERS.items():
        plain, wrapped = outcome(consume, x), outcome(consume, handoff.ordered(x))
        assert wrapped == plain, (name, plain, wrapped)


# Shapes and strides (in elements) of views of one buffer.
STRIDED = [
    ((1,), (3,)),
    ((2, 1), (1, 7)),
    ((1, 3), (9, 1)),
    ((0,), (5,)),
    ((2, 0, 3), (3, 3, 1)),
    ((3, 1, 2), (2, 5, 1)),
    ((2, 3), (1, 2)),  # column-major
    ((4,), (2,)),  # stepped
    ((1, 1), (0, 0)),
]


@pytest.mark.parametrize("shape,strides", STRIDED, ids=str)
def test_torch_views_keep_their_strides(shape, strides):
    check(torch.as_strided(torch.arange(64.0), shape, strides))


@pytest.mark.parametrize("shape,strides", STRIDED, ids=str)
def test_numpy_views_keep_their_strides(shape, strides):
    base = np.arange(64.0, dtype=np.float32)
    check(np.lib.stride_tricks.as_strided(base, shape, [s * 4 for s in strides]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: jnp.arange(6.0).reshape(2, 3),
        lambda: jnp.ones((1, 4)),
        lambda: jnp.zeros((0, 3)),
        lambda: jnp.arange(4, dtype=jnp.int32),
    ],
)
def test_jax_arrays(make):
    check(make())


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint16, np.int64, np.bool_, np.complex64])
def test_numpy_dtypes(dtype):
    check(np.ones((2, 3), dtype=dtype))


def test_packed_4_bit_floats():
    """PyTorch's ``float4_e2m1fn_x2`` (two 4-bit floats a byte, exported as two lanes):
    the wrapper needs the element size, not the meaning."""
    check(torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))


def test_a_read_only_numpy_array():
    a = np.arange(6.0).reshape(2, 3)
    a.flags.writeable = False
    check(a)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    data=st.data(),
)
def test_any_torch_view_keeps_its_strides(shape, data):
    strides = [data.draw(st.integers(0, 6)) for _ in shape]
    extent = 1 + sum((d - 1) * s for d, s in zip(shape, strides) if d > 0)
    base = torch.arange(float(max(extent, 1)))
    check(torch.as_strided(base, shape, strides))


def misaligned(dtype, count, offset):
    """``count`` elements of ``dtype`` at ``offset`` bytes past a 64-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.zeros(count * itemsize + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    a = raw[start : start + max(count, 1) * itemsize].view(dtype)[:count]
    a[...] = np.arange(count)
    return a


@pytest.mark.parametrize(
    "dtype,count,offset",
    [(np.float64, 5, 4), (np.float64, 0, 3), (np.float32, 6, 2), (np.int64, 3, 1), (np.complex64, 2, 4)],
    ids=str,
)
def test_misaligned_host_data_is_passed_on(dtype, count, offset):
    """NumPy data not aligned for its dtype: each consumer copies or refuses it as it
    would without the wrapper (handoff does not read it)."""
    a = misaligned(dtype, count, offset)
    assert a.ctypes.data % min(np.dtype(dtype).itemsize, 8) != 0  # handoff's rule
    check(a)
    check(torch.from_numpy(a))


def test_misaligned_host_data_refused_where_the_consumer_refuses_a_copy():
    a = misaligned(np.float64, 4, 4)
    plain = outcome(lambda x: jax.dlpack.from_dlpack(x, copy=False), a)
    wrapped = outcome(lambda x: jax.dlpack.from_dlpack(x, copy=False), handoff.ordered(a))
    assert plain == wrapped == ("error", ValueError)


def copies():
    s = handoff.stats()
    return s["copies"], s["bytes_copied"]


@pytest.mark.parametrize("route", ROUTES)
def test_to_jax_counts_the_copy_jax_makes_of_host_memory(route):
    """JAX copies host memory it cannot view (not 64-byte aligned, on the CPU): the
    copy happens inside jaxlib, and handoff counts it by comparing addresses."""
    set_route(route)
    try:
        base = torch.arange(64, dtype=torch.float32)
        aligned = base[: 16 * 3] if base.data_ptr() % 64 == 0 else None
        before = copies()
        view = handoff.to_jax(base[1:9])  # 4 bytes past an aligned start: JAX copies
        assert np.asarray(view).tolist() == list(range(1, 9))
        assert copies() == (before[0] + 1, before[1] + 32)
        if aligned is not None:
            before = copies()
            handoff.to_jax(aligned)
            assert copies() == before, "a view is no copy"
        before = copies()
        numpy_view = misaligned(np.float32, 8, 4)
        assert np.asarray(handoff.to_jax(numpy_view)).tolist() == list(range(8))
        assert copies() == (before[0] + 1, before[1] + 32)
    finally:
        set_route("auto")
