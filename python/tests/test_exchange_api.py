"""``handoff.Ordered.__dlpack_c_exchange_api__``: the DLPack 1.3 C exchange API of
``handoff.ordered`` objects, read as a C consumer reads it (a ctypes consumer of the
table: tvm-ffi and cuda.core call the same functions), on the CPU."""

import ctypes as C

import numpy as np
import pytest

import handoff
from dlpack_ctypes import DLManagedTensorVersioned, Producer

_api = C.pythonapi
_api.PyCapsule_GetPointer.restype = C.c_void_p
_api.PyCapsule_GetPointer.argtypes = [C.py_object, C.c_char_p]

FROM_PY = C.PYFUNCTYPE(C.c_int, C.py_object, C.POINTER(C.POINTER(DLManagedTensorVersioned)))
WORK_STREAM = C.PYFUNCTYPE(C.c_int, C.c_int32, C.c_int32, C.POINTER(C.c_void_p))


class Header(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("prev_api", C.c_void_p)]


class Table(C.Structure):
    _fields_ = [
        ("header", Header),
        ("managed_tensor_allocator", C.c_void_p),
        ("managed_tensor_from_py_object_no_sync", C.c_void_p),
        ("managed_tensor_to_py_object_no_sync", C.c_void_p),
        ("dltensor_from_py_object_no_sync", C.c_void_p),
        ("current_work_stream", C.c_void_p),
    ]


def table():
    capsule = type(handoff.ordered(np.ones(1))).__dlpack_c_exchange_api__
    return Table.from_address(_api.PyCapsule_GetPointer(capsule, b"dlpack_exchange_api"))


def take(obj):
    """What a C consumer gets from ``managed_tensor_from_py_object_no_sync``."""
    out = C.POINTER(DLManagedTensorVersioned)()
    rc = FROM_PY(table().managed_tensor_from_py_object_no_sync)(obj, C.byref(out))
    assert rc == 0
    return out


def values(managed, count, ctype=C.c_float):
    t = managed.contents.dl_tensor
    return list((ctype * count).from_address(t.data + t.byte_offset))


def test_the_table_is_on_the_type_and_says_dlpack_1():
    t = table()
    assert (t.header.major, t.header.minor) >= (1, 3)
    assert t.managed_tensor_from_py_object_no_sync and t.current_work_stream
    assert t.dltensor_from_py_object_no_sync is None  # no borrowed views: every tensor is owned


def test_a_c_consumer_takes_the_producers_memory_and_releases_it_once():
    p = Producer(np.arange(6, dtype=np.float32).reshape(2, 3))
    before = handoff.stats()
    managed = take(handoff.ordered(p))
    m = managed.contents
    assert (m.version.major, m.dl_tensor.ndim) == (1, 2)
    assert [m.dl_tensor.shape[i] for i in range(2)] == [2, 3]
    assert m.dl_tensor.data + m.dl_tensor.byte_offset == p.array.ctypes.data  # no copy
    assert values(managed, 6) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert p.deleted == 0
    m.deleter(managed)  # the consumer is done
    handoff.flush()
    assert p.deleted == 1
    after = handoff.stats()
    assert after["imports"] - before["imports"] == 1
    assert after["releases_immediate"] - before["releases_immediate"] == 1


def test_a_refusal_raises_and_gives_nothing():
    p = Producer(np.arange(4, dtype=np.float32), shape=[-4])  # a negative dimension
    out = C.POINTER(DLManagedTensorVersioned)()
    with pytest.raises(handoff.InvalidTensorError):
        FROM_PY(table().managed_tensor_from_py_object_no_sync)(handoff.ordered(p), C.byref(out))
    assert not out  # null
    handoff.flush()
    assert p.deleted == 1


def test_the_cpu_has_no_work_stream():
    stream = C.c_void_p(123)
    assert WORK_STREAM(table().current_work_stream)(1, 0, C.byref(stream)) == 0
    assert stream.value is None


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_framework_tensors_cross_through_the_table(framework):
    if framework == "torch":
        torch = pytest.importorskip("torch")
        x = torch.arange(4.0)
        ptr = x.data_ptr()
    else:
        jnp = pytest.importorskip("jax.numpy")
        x = jnp.arange(4.0)
        ptr = x.unsafe_buffer_pointer()
    managed = take(handoff.ordered(x))
    t = managed.contents.dl_tensor
    assert t.data + t.byte_offset == ptr
    assert values(managed, 4) == [0.0, 1.0, 2.0, 3.0]
    managed.contents.deleter(managed)
    handoff.flush()
    assert handoff.stats()["pending"] == 0
