"""Every validation refusal of the Rust runtime, reached from Python with a producer
built with ctypes; the producer's deleter is called exactly once on every path.

Not reachable from Python: a null managed-tensor pointer (``PyCapsule_New`` refuses
NULL, so no capsule can carry one)."""

import gc

import numpy as np
import pytest

import handoff
from dlpack_ctypes import IS_SUBBYTE_TYPE_PADDED, READ_ONLY, Producer, capsule_name

F32 = (2, 32, 1)

CASES = {
    "major version": (dict(version=(2, 0)), "version.major is 2"),
    "unknown flags": (dict(flags=1 << 40), "flags 0x10000000000 has bits DLPack does not define"),
    "unsupported device": (dict(device=(7, 0), dlpack_device=(1, 0)), r"device \(device_type 7, device_id 0\)"),
    "negative device id": (dict(device=(2, -1), dlpack_device=(1, 0)), r"device_type 2, device_id -1\)"),
    "vector dtype": (dict(dtype=(2, 32, 4)), r"dtype \(code 2, bits 32, lanes 4\)"),
    "bad bit width": (dict(dtype=(2, 24, 1)), r"dtype \(code 2, bits 24, lanes 1\)"),
    "negative ndim": (dict(ndim=-1), "ndim is -1"),
    "too many dims": (dict(ndim=1_000_000), "ndim is 1000000: handoff takes at most 64"),
    "null shape": (dict(null_shape=True), "shape is null but ndim is 1"),
    "negative dimension": (dict(shape=[2, -3], strides=[1, 1]), r"shape\[1\] is -3"),
    "shape overflow": (dict(shape=[2**63 - 1, 4], strides=[4, 1]), "more elements than fit in isize"),
    "strides required": (dict(version=(1, 2), null_strides=True), "strides is null but DLPack 1.2 requires"),
    "extent overflow": (dict(shape=[2, 2], strides=[2**62 - 1, 1]), "spans more than isize::MAX bytes"),
    "byte offset overflow": (dict(byte_offset=2**64 - 4), "overflows the address space"),
    "null data": (dict(data=0), "data is null but the tensor has 8 elements"),
    "null data with offset": (dict(data=0, shape=[0], strides=[1], byte_offset=8), "data is null but byte_offset is 8"),
    "outside address space": (dict(data=16, shape=[4], strides=[-100]), "leaves the address space"),
    "padded sub-byte": (dict(dtype=(17, 4, 1), flags=IS_SUBBYTE_TYPE_PADDED), "IS_SUBBYTE_TYPE_PADDED"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refusal_calls_the_deleter_once(case):
    fields, message = CASES[case]
    p = Producer(**fields)
    with pytest.raises(handoff.InvalidTensorError, match=message) as info:
        handoff.ordered(p).__dlpack__(max_version=(1, 0))
    assert str(info.value).startswith("invalid DLPack tensor: ")
    assert isinstance(info.value, BufferError)
    assert capsule_name(p.capsule) == "used_dltensor_versioned", "taken, then refused"
    del info
    gc.collect()
    assert p.deleted == 1


LEGACY_CASES = {
    "negative ndim": (dict(ndim=-1), "ndim is -1"),
    "null data": (dict(data=0), "data is null"),
    "unsupported device": (dict(device=(4, 0), dlpack_device=(1, 0)), r"device \(device_type 4"),
}


@pytest.mark.parametrize("case", list(LEGACY_CASES))
def test_legacy_refusal_calls_the_deleter_once(case):
    fields, message = LEGACY_CASES[case]
    p = Producer(versioned=False, **fields)
    with pytest.raises(handoff.InvalidTensorError, match=message):
        handoff.ordered(p).__dlpack__()
    assert capsule_name(p.capsule) == "used_dltensor"
    assert p.deleted == 1


def test_write_refusals():
    p = Producer(flags=READ_ONLY)
    with pytest.raises(handoff.InvalidTensorError, match="READ_ONLY"):
        handoff.ordered(p, writable=True).__dlpack__(max_version=(1, 0))
    assert p.deleted == 1
    q = Producer(shape=[4], strides=[0])
    with pytest.raises(handoff.InvalidTensorError, match="two indices"):
        handoff.ordered(q, writable=True).__dlpack__(max_version=(1, 0))
    assert q.deleted == 1
    # Read-only imports of the same tensors are fine.
    r = Producer(shape=[4], strides=[0])
    b = np.from_dlpack(handoff.ordered(r))
    assert list(b) == [0.0] * 4
    del b
    assert r.deleted == 1


def test_a_device_other_than_the_one_announced_is_refused():
    p = Producer(device=(2, 0), dlpack_device=(1, 0))
    with pytest.raises(BufferError, match="on cuda:0, but it said host"):
        handoff.ordered(p).__dlpack__(max_version=(1, 0))
    assert p.deleted == 1


@pytest.mark.parametrize("versioned", [True, False])
def test_success_calls_the_deleter_once_when_the_consumer_lets_go(versioned):
    a = np.arange(8, dtype=np.float32) * 3
    p = Producer(a, versioned=versioned)
    b = np.from_dlpack(handoff.ordered(p))
    np.testing.assert_array_equal(b, a)
    assert p.deleted == 0, "the consumer holds it"
    del b
    gc.collect()
    assert p.deleted == 1
    handoff.flush()
    assert p.deleted == 1


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_a_capsule_nobody_takes_calls_the_deleter_once(max_version):
    p = Producer()
    cap = handoff.ordered(p).__dlpack__(max_version=max_version)
    assert p.deleted == 0
    del cap
    gc.collect()
    assert p.deleted == 1


def test_legacy_producer_gives_a_legacy_capsule_even_to_a_versioned_consumer():
    p = Producer(versioned=False)
    cap = handoff.ordered(p).__dlpack__(max_version=(1, 0))
    assert capsule_name(cap) == "dltensor"
    del cap
    assert p.deleted == 1


def test_versioned_producer_to_a_legacy_consumer_gives_a_legacy_capsule():
    a = np.arange(8, dtype=np.float32)
    p = Producer(a)  # always versioned, whatever it is asked
    cap = handoff.ordered(p).__dlpack__()
    assert capsule_name(cap) == "dltensor"
    from dlpack_ctypes import Holder

    b = np.from_dlpack(Holder(cap))
    np.testing.assert_array_equal(a, b)
    del b, cap
    gc.collect()
    assert p.deleted == 1


def test_a_producer_without_max_version_is_asked_again_without_it():
    p = Producer(versioned=False, legacy_only=True)
    cap = handoff.ordered(p).__dlpack__(max_version=(1, 0))
    assert capsule_name(cap) == "dltensor"
    assert p.calls == [{"stream": None, "max_version": None, "dl_device": None, "copy": None}]
    del cap
    assert p.deleted == 1


class Returns:
    def __init__(self, value):
        self.value = value

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **_):
        return self.value


def test_a_producer_returning_no_capsule_is_refused():
    with pytest.raises(TypeError, match="not a DLPack capsule"):
        handoff.ordered(Returns(b"nope")).__dlpack__()


def test_a_consumed_capsule_is_refused_and_left_alone():
    p = Producer()
    cap = handoff.ordered(p).__dlpack__(max_version=(1, 0))
    np.from_dlpack(Returns(cap))  # consumed: now "used_dltensor_versioned"
    with pytest.raises(BufferError, match="used_dltensor_versioned"):
        handoff.ordered(Returns(cap)).__dlpack__(max_version=(1, 0))
    assert capsule_name(cap) == "used_dltensor_versioned"
    gc.collect()
    assert p.deleted == 1


def test_producer_errors_propagate():
    class Fails:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **_):
            raise BufferError("cannot export")

    with pytest.raises(BufferError, match="cannot export"):
        handoff.ordered(Fails()).__dlpack__(max_version=(1, 0))


def test_bad_dlpack_device_is_refused_at_wrap_time():
    class BadDevice:
        def __dlpack_device__(self):
            return "cpu"

        def __dlpack__(self, **_):
            raise AssertionError("not reached")

    with pytest.raises(TypeError, match="__dlpack_device__"):
        handoff.ordered(BadDevice())
