"""handoff.ordered with NumPy on the host: round trips, capsule kinds and naming,
read-only tensors, stream values, stats and flush."""

import gc
import sys
import threading

import numpy as np
import pytest

import handoff
from dlpack_ctypes import Holder, Producer, capsule_name


class Spy:
    """Forwards the DLPack protocol to ``x`` and remembers what it was asked and gave."""

    def __init__(self, x):
        self.x = x
        self.kwargs = None
        self.capsule = None

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.kwargs = kwargs
        self.capsule = self.x.__dlpack__(**kwargs)
        return self.capsule


def address(a):
    return a.__array_interface__["data"][0]


def test_round_trip_is_zero_copy_and_versioned():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    spy = Spy(handoff.ordered(a))
    b = np.from_dlpack(spy)
    np.testing.assert_array_equal(a, b)
    assert address(b) == address(a), "no copy"
    assert capsule_name(spy.capsule) == "used_dltensor_versioned", "NumPy took our versioned capsule"
    b[0, 0] = 42.0
    assert a[0, 0] == 42.0, "the same memory"


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64, np.float16,
              np.float32, np.float64, np.complex64, np.complex128]
)
def test_every_numpy_dtype(dtype):
    a = (np.arange(6) % 2).astype(dtype).reshape(2, 3)
    b = np.from_dlpack(handoff.ordered(a))
    assert b.dtype == a.dtype
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2],
        lambda: np.arange(24, dtype=np.float64).reshape(4, 6).T,
        lambda: np.arange(24, dtype=np.int32).reshape(2, 3, 4)[::-1],
        lambda: np.full((), 3.5, dtype=np.float32),
        lambda: np.zeros((0, 3), dtype=np.float32),
    ],
    ids=["strided", "transposed", "negative-strides", "0-d", "empty"],
)
def test_layouts(make):
    a = make()
    b = np.from_dlpack(handoff.ordered(a))
    assert b.shape == a.shape
    np.testing.assert_array_equal(a, b)


def test_device_is_the_producers_and_wrapping_twice_unwraps():
    a = np.ones(3)
    o = handoff.ordered(a)
    assert o.__dlpack_device__() == (1, 0)
    assert o.obj is a
    assert handoff.ordered(o).obj is a
    assert "handoff.ordered(array(" in repr(o)


def test_objects_without_dlpack_are_refused():
    with pytest.raises(TypeError, match="__dlpack__"):
        handoff.ordered(5)


def test_legacy_consumer_gets_a_legacy_capsule():
    a = np.arange(4, dtype=np.float32)
    cap = handoff.ordered(a).__dlpack__()
    assert capsule_name(cap) == "dltensor"
    b = np.from_dlpack(Holder(cap))
    np.testing.assert_array_equal(a, b)
    assert capsule_name(cap) == "used_dltensor", "NumPy consumed it and renamed it"


def test_versioned_consumer_gets_a_versioned_capsule_and_consumes_it():
    a = np.arange(4, dtype=np.float32)
    cap = handoff.ordered(a).__dlpack__(max_version=(1, 0))
    assert capsule_name(cap) == "dltensor_versioned"
    b = np.from_dlpack(Holder(cap))
    assert capsule_name(cap) == "used_dltensor_versioned"
    np.testing.assert_array_equal(a, b)


def test_the_producers_capsule_is_renamed_used():
    a = np.arange(4, dtype=np.float32)
    spy = Spy(a)
    cap = handoff.ordered(spy).__dlpack__(max_version=(1, 0))
    assert capsule_name(spy.capsule) == "used_dltensor_versioned"
    del cap


def test_arguments_are_forwarded_to_the_producer():
    p = Producer()
    handoff.ordered(p).__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert p.calls == [{"stream": None, "max_version": (1, 0), "dl_device": (1, 0), "copy": False}]
    q = Producer()
    handoff.ordered(q).__dlpack__()
    assert q.calls == [{"stream": None, "max_version": None, "dl_device": None, "copy": None}]


def test_copy_is_the_producers():
    a = np.arange(4, dtype=np.float32)
    b = np.from_dlpack(handoff.ordered(a), copy=True)
    np.testing.assert_array_equal(a, b)
    assert address(a) != address(b)


def test_read_only_arrays_stay_read_only():
    a = np.arange(4, dtype=np.float32)
    a.setflags(write=False)
    b = np.from_dlpack(handoff.ordered(a))
    assert not b.flags.writeable
    np.testing.assert_array_equal(a, b)


def test_read_only_cannot_go_to_a_legacy_consumer():
    a = np.arange(4, dtype=np.float32)
    a.setflags(write=False)
    p = Producer(a, flags=1)  # versioned READ_ONLY, handed to a legacy consumer
    with pytest.raises(BufferError, match="read-only"):
        handoff.ordered(p).__dlpack__()
    assert p.deleted == 1


def test_writable_import_of_a_read_only_array_is_refused():
    a = np.arange(4, dtype=np.float32)
    a.setflags(write=False)
    with pytest.raises(handoff.InvalidTensorError, match="READ_ONLY"):
        handoff.ordered(a, writable=True).__dlpack__(max_version=(1, 0))
    b = np.from_dlpack(handoff.ordered(np.ones(2), writable=True))
    assert b.flags.writeable


@pytest.mark.parametrize("value", [0, -2, -100, -(2**63)])
def test_disallowed_stream_values_are_value_errors_naming_the_value(value):
    p = Producer()
    with pytest.raises(ValueError, match=f"stream={value}"):
        handoff.ordered(p).__dlpack__(stream=value)
    assert p.calls == [], "refused before the producer is asked"
    assert p.deleted == 0


@pytest.mark.parametrize("value", ["1", 1.0, True, 2**70])
def test_stream_values_of_other_types_are_refused(value):
    p = Producer()
    with pytest.raises((TypeError, ValueError), match="stream"):
        handoff.ordered(p).__dlpack__(stream=value)
    assert p.calls == []


@pytest.mark.parametrize("value", [None, 1, 2, -1, 0x7F00_0000_1000])
def test_host_tensors_take_every_valid_stream_value(value):
    p = Producer()
    before = handoff.stats()
    b = np.from_dlpack(Holder(handoff.ordered(p).__dlpack__(stream=value, max_version=(1, 0))))
    assert p.calls[0]["stream"] == value, "forwarded as given"
    np.testing.assert_array_equal(b, p.array)
    del b
    gc.collect()
    assert p.deleted == 1, "released at once: the host has no queue"
    after = handoff.stats()
    assert after["releases_immediate"] >= before["releases_immediate"] + 1
    assert after["host_syncs"] == before["host_syncs"]


def test_max_version_must_be_a_pair():
    with pytest.raises(TypeError, match="max_version"):
        handoff.ordered(np.ones(2)).__dlpack__(max_version=1)


def test_stats_and_flush():
    s = handoff.stats()
    for key in ["exports", "imports", "host_syncs", "events_created", "events_recorded", "waits_enqueued",
                "waits_elided", "copies", "bytes_copied", "releases_immediate", "releases_deferred",
                "releases_leaked", "pending", "released"]:
        assert isinstance(s[key], int), key
    a = np.ones(3)
    b = np.from_dlpack(handoff.ordered(a))
    assert handoff.stats()["imports"] == s["imports"] + 1
    del b
    assert handoff.flush() is None
    assert handoff.stats()["pending"] == 0


def test_consumer_dropped_on_another_thread():
    a = np.arange(1000, dtype=np.float64)
    refs = sys.getrefcount(a)
    views = [np.from_dlpack(handoff.ordered(a)) for _ in range(50)]
    assert sys.getrefcount(a) > refs

    def drop():
        while views:
            views.pop()

    t = threading.Thread(target=drop)
    t.start()
    t.join(30)
    assert not t.is_alive()
    handoff.flush()
    assert sys.getrefcount(a) == refs, "every NumPy deleter ran once"


def test_helpers_are_exported():
    assert callable(handoff.to_torch) and callable(handoff.to_jax)
    assert isinstance(handoff.cuda_available(), bool)
    assert handoff.DLPACK_VERSION[0] == 1
    assert issubclass(handoff.InvalidTensorError, BufferError)
    assert issubclass(handoff.HandoffError, RuntimeError)
