"""Hostile callers and producers, as property tests (hypothesis): whatever an object's
``__dlpack__`` / ``__dlpack_device__`` / ``__cuda_array_interface__`` does, and whatever
a consumer passes as ``stream`` / ``max_version`` / ``dl_device`` / ``copy``, handoff
answers with a Python exception of a clear type whose message names what is wrong (or
with a capsule), the producer's deleter runs exactly once for every tensor handoff took,
nothing is left alive (the producer, its tensor, a pending release) and no Rust panic
reaches Python.

Every test is deterministic (``derandomize=True``, no example database) and small
enough for CI on two cores. Malformed DLPack structs come from ``dlpack_ctypes``."""

from __future__ import annotations

import ctypes as C
import functools
import gc
import importlib
import operator
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dlpack_ctypes
import handoff
from dlpack_ctypes import IS_COPIED, IS_SUBBYTE_TYPE_PADDED, READ_ONLY, Holder, Producer, capsule_name
from handoff import _handoff
from seams import needs_hooks

FAST = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

I64 = (-(2**63), 2**63 - 1)

_api = C.pythonapi
_api.PyCapsule_SetName.restype = C.c_int
_api.PyCapsule_SetName.argtypes = [C.py_object, C.c_char_p]

# Capsule names must outlive their capsules: every name given to one is kept here.
_NAMES: dict = {}


def _static_name(name: bytes):
    return _NAMES.setdefault(name, C.c_char_p(name))


def rename(capsule, name: bytes) -> None:
    assert _api.PyCapsule_SetName(capsule, _static_name(name)) == 0


def raw_name(capsule) -> bytes:
    return _api.PyCapsule_GetName(capsule)


def nameless_capsule(address: int):
    return _api.PyCapsule_New(address, None, None)


def attempt(fn):
    """``(result, None)`` or ``(None, (type, message))``; a Rust panic fails the test.
    The exception itself is not kept (its traceback would keep the producer alive)."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - every exception is judged by the caller
        return None, (type(e), str(e))
    except BaseException as e:
        if type(e).__name__ == "PanicException":
            pytest.fail(f"a Rust panic reached Python: {e}")
        raise


def settled(before: dict) -> None:
    """Nothing pending, nothing leaked on purpose since ``before``."""
    after = handoff.stats()
    assert after["pending"] == 0, "a release is still queued"
    assert after["releases_leaked"] == before["releases_leaked"], "a release was leaked"


def forget(p: Producer) -> None:
    """A ctypes tensor handoff rightly left alone (never handed over) is not out."""
    dlpack_ctypes._OUT.discard(p)


# ---------------------------------------------------------------------------------
# The producer's answer to __dlpack__.

EXCEPTIONS = [BufferError, TypeError, ValueError, RuntimeError, KeyError, AttributeError, OverflowError,
              NotImplementedError, MemoryError, handoff.InvalidTensorError, handoff.HandoffError]

WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.tuples(st.integers()),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.just(NotImplemented),
    st.builds(object),
    st.builds(np.ones, st.integers(0, 3)),  # an array, not its capsule
)

RESERVED = {b"dltensor", b"dltensor_versioned"}
WRONG_NAMES = st.one_of(
    st.sampled_from([b"", b"DLTENSOR", b"dltensor ", b" dltensor", b"dltensor_versioned_", b"dltensor_version",
                     b"used_", b"used_dltensor", b"used_dltensor_versioned", b"numpy.core.multiarray._ARRAY_API",
                     "dltensor\u00e9".encode(), b"\xff\xfe"]),
    st.binary(min_size=1, max_size=24).filter(lambda b: b"\0" not in b and b not in RESERVED),
)

ANSWERS = st.one_of(
    st.tuples(st.just("raise"), st.sampled_from(EXCEPTIONS), st.text(max_size=12)),
    st.tuples(st.just("return"), WRONG_VALUES),
    st.tuples(st.just("named"), WRONG_NAMES, st.booleans()),
    st.tuples(st.just("consumed"), st.booleans()),
    st.tuples(st.just("nameless"), st.booleans()),
    st.tuples(st.just("twice"), st.booleans()),
    st.tuples(st.just("valid"), st.booleans()),
)

# What a well-behaved consumer asks (the consumer's own mistakes are tested below).
GOOD_ASKS = st.fixed_dictionaries(
    {},
    optional={
        "stream": st.sampled_from([None, 1, 2, -1, 0x7F00_0000_1000]),
        "max_version": st.sampled_from([None, (1, 0), (1, 3), (0, 8), (2, 0)]),
        "dl_device": st.sampled_from([None, (1, 0)]),
        "copy": st.sampled_from([None, False]),
    },
)


class Hostile:
    """A producer whose ``__dlpack__`` answers as ``answer`` says; its tensors are
    ``dlpack_ctypes`` ones, whose deleters count their calls."""

    def __init__(self, answer: tuple) -> None:
        self.answer = answer
        self.calls = 0
        self.tensor = Producer(versioned=answer[-1]) if isinstance(answer[-1], bool) else None
        self.capsule = None

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls += 1
        kind = self.answer[0]
        if kind == "raise":
            raise self.answer[1](self.answer[2])
        if kind == "return":
            return self.answer[1]
        if kind == "twice" and self.capsule is not None:
            return self.capsule  # the capsule of the first call, which a consumer took
        if kind == "nameless":
            self.capsule = nameless_capsule(C.addressof(self.tensor.managed))
            return self.capsule
        cap = self.tensor.__dlpack__()
        if kind == "named":
            rename(cap, self.answer[1])
        elif kind == "consumed":
            rename(cap, b"used_dltensor_versioned" if self.answer[1] else b"used_dltensor")
        self.capsule = cap
        return cap


def expected_answer(answer: tuple, ask: dict):
    """The error a hostile answer must give: (type, [substrings]) or None."""
    kind = answer[0]
    if kind == "raise":
        return answer[1], [str(answer[1](answer[2]))]
    if kind == "return":
        return TypeError, [f"returned a {type(answer[1]).__name__}", "not a DLPack capsule"]
    if kind == "named":
        name = answer[1]
        needles = ["the producer's capsule is named", 'expected "dltensor_versioned" or "dltensor"']
        if name.isascii() and name.decode().isprintable() and b'"' not in name and b"\\" not in name:
            needles.append(f'"{name.decode()}"')
        return BufferError, needles
    if kind == "consumed":
        used = "used_dltensor_versioned" if answer[1] else "used_dltensor"
        return BufferError, [f'"{used}"', "a consumer took it already"]
    if kind == "nameless":
        return BufferError, ["has no name"]
    return None


def consumer_capsule_name(producer_versioned: bool, ask: dict) -> str:
    mv = ask.get("max_version")
    return "dltensor_versioned" if producer_versioned and mv is not None and mv[0] >= 1 else "dltensor"


def wrap(obj, busy_us):
    """``ordered(obj)``, or (``busy_us`` set) the same with a simulated consumer stream
    with that much work queued per hand-off, released by the reaper in stream order."""
    return handoff.ordered(obj) if busy_us is None else _handoff._mock_ordered(obj, busy_us)


def released(w, busy_us) -> None:
    """The simulated consumer work done, and every release it held up with it."""
    if busy_us is not None:
        w._mock_advance(busy_us + 1)
        handoff.flush()


# The consumer's stream: the one it asks for (``handoff.ordered``), or a simulated one
# with ``busy_us`` of work queued per hand-off (``_mock_ordered``, a test seam).
CONSUMERS = ["ordered", needs_hooks("simulated")]
BUSY = st.sampled_from([0, 500])


def busy(consumer, busy_us):
    """``busy_us`` for the simulated consumer stream, ``None`` (``handoff.ordered``) else."""
    return busy_us if consumer == "simulated" else None


@pytest.mark.parametrize("consumer", CONSUMERS)
@FAST
@given(answer=ANSWERS, ask=GOOD_ASKS, consume=st.booleans(), busy_us=BUSY)
@example(answer=("consumed", True), ask={"max_version": (1, 0)}, consume=False, busy_us=None)
@example(answer=("raise", TypeError, "no max_version"), ask={"max_version": (1, 0)}, consume=False, busy_us=None)
def test_any_answer_of_the_producer(consumer, answer, ask, consume, busy_us):
    busy_us = busy(consumer, busy_us)
    before = handoff.stats()
    h = Hostile(answer)
    alive = weakref.ref(h)
    w = wrap(h, busy_us)
    cap, err = attempt(lambda: w.__dlpack__(**ask))
    expected = expected_answer(answer, ask)
    retried = (answer[0] == "raise" and issubclass(answer[1], TypeError) and ask.get("max_version") is not None
               and ask.get("dl_device") is None and ask.get("copy") is None)
    assert h.calls == (2 if retried else 1), "asked once (twice: again without max_version, after a TypeError)"
    if expected is not None:
        assert err is not None, f"accepted: {cap!r}"
        ty, message = err
        assert ty is expected[0], (ty, message)
        for needle in expected[1]:
            assert needle in message, (needle, message)
    if answer[0] in ("named", "consumed"):
        name = answer[1] if answer[0] == "named" else (b"used_dltensor_versioned" if answer[1] else b"used_dltensor")
        assert raw_name(h.capsule) == name, "a capsule handoff refused is left as it was"
    if answer[0] == "twice":
        # The first call is fine; the second finds the capsule the first one took.
        assert err is None, err
        cap2, err2 = attempt(lambda: w.__dlpack__(**ask))
        assert cap2 is None and err2[0] is BufferError and "used_dltensor" in err2[1], err2
    if answer[0] in ("valid", "twice"):
        assert err is None, err
        assert capsule_name(h.capsule).startswith("used_"), "taken from the producer's capsule"
        assert capsule_name(cap) == consumer_capsule_name(answer[1], ask)
        assert h.tensor.deleted == 0, "the consumer's capsule holds it"
        if consume:
            b = np.from_dlpack(Holder(cap))
            np.testing.assert_array_equal(b, h.tensor.array)
            del b
        del cap
        released(w, busy_us)
        assert h.tensor.deleted == 1, "exactly once, when the consumer lets go"
    elif h.tensor is not None:
        assert h.tensor.deleted == 0, "never taken, so never deleted by handoff"
        forget(h.tensor)
    del w, h
    assert alive() is None, "the producer is not kept alive"
    settled(before)


# ---------------------------------------------------------------------------------
# __dlpack_device__: raises, wrong types, out-of-range values, not a method.

DEVICE_VALUES = st.one_of(
    st.tuples(st.integers(*I64), st.integers(*I64)),
    st.tuples(st.integers(-(2**70), 2**70), st.integers(-(2**70), 2**70)),
    st.tuples(st.integers(-1, 20), st.integers(-3, 3)),
    st.tuples(st.integers(0, 3)),
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.sampled_from([1.0, "1", None, b"\x01"]), st.integers(0, 1)),
    st.lists(st.integers(0, 3), min_size=2, max_size=2),  # a list, not a tuple
    WRONG_VALUES,
)

DEVICE_ANSWERS = st.one_of(
    st.tuples(st.just("raise"), st.sampled_from(EXCEPTIONS), st.text(max_size=12)),
    st.tuples(st.just("return"), DEVICE_VALUES),
    st.tuples(st.just("attribute"), DEVICE_VALUES),  # __dlpack_device__ = value, not a method
)


def make_device_producer(answer):
    kind, value = answer[0], answer[1:]

    class DeviceProducer:
        def __init__(self):
            self.tensor = Producer()

        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            return self.tensor.__dlpack__(stream=stream, max_version=max_version)

    if kind == "raise":
        def __dlpack_device__(self):
            raise value[0](value[1])
    elif kind == "return":
        def __dlpack_device__(self):
            return value[0]
    else:
        __dlpack_device__ = value[0]
    DeviceProducer.__dlpack_device__ = __dlpack_device__
    return DeviceProducer()


def expected_device(value):
    """What handoff must say of a ``__dlpack_device__()`` result: None (a device) or
    (type, substring)."""
    if not isinstance(value, tuple) or len(value) != 2:
        return TypeError, "__dlpack_device__() must be a (device_type, device_id) pair of ints"
    try:
        t, i = (operator.index(v) for v in value)
    except TypeError:
        return TypeError, "__dlpack_device__() must be a (device_type, device_id) pair of ints"
    if not (I64[0] <= t <= I64[1] and I64[0] <= i <= I64[1]):
        return TypeError, "__dlpack_device__() must be a (device_type, device_id) pair of ints"
    if not 0 <= t < 2**32:
        return ValueError, f"device_type {t} is not a DLPack device"
    if not -(2**31) <= i < 2**31:
        return ValueError, f"device_id {i} is out of range"
    return None


@FAST
@given(answer=DEVICE_ANSWERS)
@example(answer=("attribute", (1, 0)))
@example(answer=("return", (7, 0)))
@example(answer=("return", (1, 0)))
def test_any_dlpack_device(answer):
    before = handoff.stats()
    p = make_device_producer(answer)
    tensor = p.tensor
    alive = weakref.ref(p)
    w, err = attempt(lambda: handoff.ordered(p))
    kind = answer[0]
    if kind == "raise":
        assert err == (answer[1], str(answer[1](answer[2]))), "the producer's own exception, as it is"
    elif kind == "attribute":
        assert err is not None and err[0] is TypeError, err
        assert "__dlpack_device__" in err[1] and "not callable" in err[1], err
    else:
        expected = expected_device(answer[1])
        if expected is not None:
            assert err is not None and err[0] is expected[0], (err, expected)
            assert expected[1] in err[1], (err, expected)
    if err is not None:
        assert tensor.calls == [], "refused when wrapped: the producer's __dlpack__ is never asked"
    else:
        t, i = answer[1]
        cap, err = attempt(lambda: w.__dlpack__(max_version=(1, 0)))
        if (t, i) in ((1, 0), (3, 0)) or (t in (1, 3) and i >= 0):
            assert err is None, err
            del cap
            assert tensor.deleted == 1
        elif t == 2 and i >= 0 and not handoff.cuda_available():
            assert err[0] is handoff.HandoffError and "CUDA is not available" in err[1], err
            assert tensor.calls == [], "the stream is resolved before the producer is asked"
        elif t != 2 or i < 0:
            # The tensor is on the host, whatever the producer said: refused, once deleted.
            assert err is not None, f"a host tensor went out as ({t}, {i}): {cap!r}"
            assert err[0] in (BufferError, handoff.InvalidTensorError), err
            assert "but it said" in err[1] or "device" in err[1], err
            assert tensor.deleted == 1
        del w
    del p
    assert alive() is None, "the producer is not kept alive"
    forget(tensor)
    settled(before)


# ---------------------------------------------------------------------------------
# The consumer's arguments: stream, max_version, dl_device, copy.


class Weird:
    """An object whose every conversion raises."""

    def __index__(self):
        raise ZeroDivisionError("no index")

    def __bool__(self):
        raise ZeroDivisionError("no bool")

    def __iter__(self):
        raise ZeroDivisionError("no iter")

    def __repr__(self):
        return "Weird()"


ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(*I64),
    st.floats(),
    st.text(max_size=4),
    st.builds(np.int64, st.integers(*I64)),
    st.builds(np.uint64, st.integers(0, 2**64 - 1)),
    st.just(np.True_),
    st.builds(Weird),
)
PAIRS = st.one_of(
    st.tuples(st.integers(-3, 20), st.integers(-3, 3)),
    st.tuples(st.integers(), st.integers()),
    st.tuples(ANY, ANY),
    st.tuples(ANY),
    st.tuples(ANY, ANY, ANY),
    st.lists(st.integers(0, 3), min_size=2, max_size=2),
    ANY,
)


def expected_stream(s):
    """None for an accepted stream value, else (type, substring)."""
    if s is None:
        return None
    if isinstance(s, bool):
        return TypeError, "stream must be None or an int, not the bool"
    try:
        v = operator.index(s)
    except Exception:
        return TypeError, "stream must be None or an int"
    if not I64[0] <= v <= I64[1]:
        if isinstance(s, int):
            return ValueError, "must fit in 64 bits"
        return TypeError, "stream must be None or an int"
    if v == 0 or v < -1:
        return ValueError, f"stream={v}"
    return None


def pair_of_ints(v):
    if not isinstance(v, tuple) or len(v) != 2:
        return None
    try:
        a, b = (operator.index(x) for x in v)
    except Exception:
        return None
    if not (I64[0] <= a <= I64[1] and I64[0] <= b <= I64[1]):
        return None
    return a, b


def expected_ask(stream, max_version, dl_device):
    """The first refusal (the arguments are read in this order), before the producer
    is asked: (type, substring), or None."""
    e = expected_stream(stream)
    if e is not None:
        return e
    if max_version is not None and pair_of_ints(max_version) is None:
        return TypeError, "max_version must be a (major, minor) pair of ints"
    if dl_device is not None:
        d = pair_of_ints(dl_device)
        if d is None:
            return TypeError, "dl_device must be a (device_type, device_id) pair of ints"
        if not 0 <= d[0] < 2**32:
            return ValueError, f"dl_device: device_type {d[0]} is not a DLPack device"
        if not -(2**31) <= d[1] < 2**31:
            return ValueError, f"dl_device: device_id {d[1]} is out of range"
    return None


@settings(FAST, max_examples=150)
@given(stream=st.one_of(ANY, st.sampled_from([None, 1, 2, -1, 0x7F00_0000_1000])),
       max_version=st.one_of(st.none(), PAIRS), dl_device=st.one_of(st.none(), PAIRS), copy=ANY)
@example(stream=None, max_version=None, dl_device=(7, 0), copy=None)
@example(stream=None, max_version=None, dl_device=(2, -1), copy=None)
def test_any_consumer_arguments(stream, max_version, dl_device, copy):
    before = handoff.stats()
    p = Producer()
    w = handoff.ordered(p)
    cap, err = attempt(lambda: w.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy))
    expected = expected_ask(stream, max_version, dl_device)
    if expected is not None:
        assert err is not None, f"accepted: {cap!r}"
        assert err[0] is expected[0] and expected[1] in err[1], (err, expected)
        assert p.calls == [], "refused before the producer is asked"
        assert p.deleted == 0
    else:
        d = pair_of_ints(dl_device) if dl_device is not None else (1, 0)
        if d[0] == 2 and d[1] >= 0 and not handoff.cuda_available():
            assert err[0] is handoff.HandoffError and "CUDA is not available" in err[1], err
            assert p.calls == [], "the stream is resolved before the producer is asked"
        else:
            assert len(p.calls) == 1, "asked once"
            call = p.calls[0]
            for k, v in (("stream", stream), ("max_version", max_version), ("dl_device", dl_device), ("copy", copy)):
                assert call[k] is v, f"{k} is forwarded as given"
            if d[0] in (1, 3):
                assert err is None, err
                del cap
            else:
                # The producer ignored dl_device: its host tensor is not what was asked for.
                assert err is not None, f"a host tensor went out for dl_device={dl_device}: {cap!r}"
                assert err[0] is BufferError and "but it said" in err[1], err
            assert p.deleted == 1, "taken, so deleted exactly once"
    forget(p)
    settled(before)


# ---------------------------------------------------------------------------------
# Malformed DLPack structs (dlpack_ctypes), one field wrong at a time, with the
# value in the message; then any combination of fields.

F32 = np.arange(8, dtype=np.float32)


def _fault(values, make):
    """A strategy of (fields of a Producer, the text the refusal must contain)."""
    return values.map(lambda v: make(*v) if isinstance(v, tuple) else make(v))


def _device(t, i):
    return dict(device=(t, i), dlpack_device=(1, 0)), f"device (device_type {t}, device_id {i})"


def _negative_dim(axis, v):
    shape = [2] * axis + [v] + [1] * (2 - axis)
    return dict(shape=shape, strides=[1, 1, 1]), f"shape[{axis}] is {v}"


def _unknown_flag(bit, known):
    flags = known | (1 << bit)
    return dict(flags=flags), f"flags {flags:#x} has bits DLPack does not define"


FAULTS = st.one_of(
    _fault(st.integers(-(2**31), -1), lambda n: (dict(ndim=n), f"ndim is {n}: it must be >= 0")),
    _fault(st.integers(65, 2**31 - 1), lambda n: (dict(ndim=n), f"ndim is {n}: handoff takes at most 64")),
    _fault(st.integers(0, 2**32 - 1).filter(lambda m: m != 1),
           lambda m: (dict(version=(m, 0)), f"version.major is {m}")),
    _fault(st.tuples(st.integers(3, 63), st.sampled_from([0, READ_ONLY, IS_COPIED])), _unknown_flag),
    _fault(st.integers(2, 2**16 - 1), lambda n: (dict(dtype=(2, 32, n)), f"dtype (code 2, bits 32, lanes {n})")),
    _fault(st.integers(18, 255), lambda c: (dict(dtype=(c, 32, 1)), f"dtype (code {c}, bits 32, lanes 1)")),
    _fault(st.tuples(st.integers(0, 2), st.integers(-(2**63), -1)), _negative_dim),
    _fault(st.tuples(st.integers(0, 2**31 - 1).filter(lambda t: t not in (1, 2, 3, 12)), st.integers(0, 7)), _device),
    _fault(st.tuples(st.sampled_from([2, 12]), st.integers(-(2**31), -1)), _device),
)


FAULT_EXAMPLES = [
    (dict(ndim=-1), "ndim is -1"),
    (dict(version=(2, 0)), "version.major is 2"),
    (dict(dtype=(2, 32, 4)), "dtype (code 2, bits 32, lanes 4)"),
    (dict(device=(7, 0), dlpack_device=(1, 0)), "device (device_type 7, device_id 0)"),
]


@FAST
@given(fault=FAULTS, versioned=st.booleans(), max_version=st.sampled_from([None, (1, 0)]))
def test_one_wrong_field_is_named_with_its_value(fault, versioned, max_version):
    fields, message = fault
    if not versioned and ("version" in fields or "flags" in fields):
        versioned = True  # the legacy ABI has neither field
    before = handoff.stats()
    p = Producer(F32, versioned=versioned, **fields)
    _, err = attempt(lambda: handoff.ordered(p).__dlpack__(max_version=max_version))
    assert err is not None and err[0] is handoff.InvalidTensorError, err
    assert err[1].startswith("invalid DLPack tensor: ") and message in err[1], (err, message)
    assert capsule_name(p.capsule) == ("used_dltensor_versioned" if versioned else "used_dltensor")
    assert p.deleted == 1, "refused, and deleted exactly once"
    settled(before)


STRUCTS = st.fixed_dictionaries(
    {
        "versioned": st.booleans(),
        "version": st.tuples(st.integers(0, 2), st.integers(0, 4)),
        "flags": st.one_of(st.sampled_from([0, READ_ONLY, IS_COPIED, IS_SUBBYTE_TYPE_PADDED, READ_ONLY | IS_COPIED]),
                           st.integers(0, 2**64 - 1)),
        "device": st.sampled_from([(1, 0), (3, 0), (2, 0), (12, 0), (7, 0), (1, -1), (2, -1)]),
        "dtype": st.tuples(st.integers(0, 20), st.sampled_from([0, 1, 4, 8, 16, 24, 32, 64, 128, 255]),
                           st.sampled_from([0, 1, 2, 4])),
        "dims": st.lists(st.tuples(st.integers(-2, 2**62), st.integers(-(2**62), 2**62)), max_size=4),
        "ndim_delta": st.sampled_from([0, 0, 0, -1, "negative", "huge"]),
        "null_strides": st.booleans(),
        "null_shape": st.booleans(),
        "data": st.sampled_from(["array", 0, 1, 16, 2**64 - 8, 2**63]),
        "byte_offset": st.one_of(st.sampled_from([0, 0, 1, 4, 2**64 - 4]), st.integers(0, 2**64 - 1)),
        "null_deleter": st.sampled_from([False, False, False, True]),
    }
)


def build(s: dict) -> Producer:
    shape = [d for d, _ in s["dims"]]
    strides = [st_ for _, st_ in s["dims"]]
    ndim = len(shape)
    if s["ndim_delta"] == "negative":
        ndim = -1
    elif s["ndim_delta"] == "huge":
        ndim = 65
    elif s["ndim_delta"] == -1 and ndim > 0:
        ndim -= 1  # fewer dims than the arrays hold: reads stay in bounds
    p = Producer(
        F32, versioned=s["versioned"], version=s["version"], flags=s["flags"], device=s["device"],
        dlpack_device=(1, 0), dtype=s["dtype"], shape=shape, strides=None if s["null_strides"] else strides,
        null_strides=s["null_strides"], null_shape=s["null_shape"], ndim=ndim,
        data=F32.ctypes.data if s["data"] == "array" else s["data"], byte_offset=s["byte_offset"],
    )
    if s["null_deleter"]:  # DLPack allows a NULL deleter: nothing to call
        p.managed.deleter = (dlpack_ctypes.VERSIONED_DELETER if s["versioned"] else dlpack_ctypes.LEGACY_DELETER)()
    return p


@pytest.mark.parametrize("versioned", [True, False])
def test_misaligned_host_memory_is_passed_on_unchanged_unless_another_field_is_wrong(versioned):
    """Host data not aligned for its dtype, otherwise valid: the consumer gets the
    producer's own capsule, untouched, to copy or refuse as it would without handoff
    (its destructor deletes the tensor once). With another field wrong it is refused,
    naming that field, as any tensor is."""
    before = handoff.stats()
    p = Producer(F32, versioned=versioned, byte_offset=2)
    cap = handoff.ordered(p).__dlpack__(max_version=(1, 0))
    assert cap is p.capsule and capsule_name(cap) == ("dltensor_versioned" if versioned else "dltensor")
    assert p.deleted == 0
    consume(cap, p)
    assert p.deleted == 1, "the consumer deleted it, once"
    settled(before)
    for fields, message in FAULT_EXAMPLES:
        if not versioned and "version" in fields:
            continue
        p = Producer(F32, versioned=versioned, **{"byte_offset": 2, **fields})
        _, err = attempt(lambda: handoff.ordered(p).__dlpack__(max_version=(1, 0)))
        assert err is not None and err[0] is handoff.InvalidTensorError and message in err[1], err
        assert capsule_name(p.capsule).startswith("used_") and p.deleted == 1
        forget(p)
    settled(before)


def passed_on(cap, p) -> bool:
    """Whether ``cap`` is the producer's own capsule, handed on unchanged."""
    return cap is not None and cap is p.capsule and not capsule_name(cap).startswith("used_")


def consume(cap, p) -> None:
    """What a consumer does with a capsule it takes: renames it used, and calls the
    tensor's deleter (if any) when done with it."""
    rename(cap, b"used_" + capsule_name(cap).encode())
    if p.managed.deleter:
        p.managed.deleter(C.pointer(p.managed))


@pytest.mark.parametrize("consumer", CONSUMERS)
@settings(FAST, max_examples=200)
@given(s=STRUCTS, max_version=st.sampled_from([None, (1, 0)]), writable=st.booleans(), busy_us=BUSY)
def test_any_struct_is_taken_and_deleted_exactly_once(consumer, s, max_version, writable, busy_us):
    """Whatever the fields say (within the producer's own arrays, as no importer can
    check more), the capsule is taken and the answer is a capsule or a refusal that
    says what is wrong — or, for host memory valid but for its alignment, the capsule
    is handed on unchanged — and the deleter runs once. The data is never read."""
    busy_us = busy(consumer, busy_us)
    before = handoff.stats()
    p = build(s)
    if busy_us is None:
        w = handoff.ordered(p, writable=writable)
    else:
        w = _handoff._mock_ordered(p, busy_us, writable=writable)
    cap, err = attempt(lambda: w.__dlpack__(max_version=max_version))
    if passed_on(cap, p):  # valid host memory but for its alignment: the consumer judges
        # Host memory: on the CPU, whatever its device id says ((1, -1) included), as a
        # CPU tensor handoff takes in (check_device: both are the host).
        assert s["device"][0] == 1 and p.deleted == 0
        consume(cap, p)
        del cap
    elif err is None:
        assert capsule_name(p.capsule).startswith("used_"), "taken"
        assert capsule_name(cap) in ("dltensor", "dltensor_versioned")
        assert p.deleted == 0
        del cap
    else:
        assert capsule_name(p.capsule).startswith("used_"), "taken"
        ty, message = err
        assert ty in (handoff.InvalidTensorError, BufferError), err
        assert (message.startswith("invalid DLPack tensor: ") or "but it said" in message
                or "read-only" in message), err
    released(w, busy_us)
    assert p.deleted == (0 if s["null_deleter"] else 1), "deleted exactly once"
    forget(p)
    settled(before)


# ---------------------------------------------------------------------------------
# __cuda_array_interface__: raises, is no dict, or has a key of any type and value.

GOOD_INTERFACE = {"shape": (4,), "typestr": "<f4", "data": (0x7F00_0000_0000, False), "strides": None,
                  "version": 3, "stream": 1}
INTERFACE_VALUES = st.one_of(
    ANY,
    st.tuples(st.integers(-(2**64), 2**64)),
    st.tuples(st.integers(), st.booleans()),
    st.tuples(st.integers(0, 2**64 - 1), ANY),
    st.lists(st.integers(-4, 4), max_size=3),
    st.text(max_size=5),
    st.text(alphabet="<>|=fiucbV0123468", min_size=1, max_size=5),
)


class Interface:
    def __init__(self, iface):
        self._iface = iface

    @property
    def __cuda_array_interface__(self):
        if isinstance(self._iface, BaseException):
            raise self._iface
        return self._iface


@pytest.mark.skipif(handoff.cuda_available(), reason="checks the refusals that come before the driver is asked")
@FAST
@given(key=st.sampled_from(sorted(GOOD_INTERFACE) + ["mask"]), value=INTERFACE_VALUES,
       mode=st.sampled_from(["set", "del"]), how=st.sampled_from(["device", "dlpack"]))
@example(key="typestr", value="<\u00e94", mode="set", how="dlpack")
@example(key="typestr", value="<\u00f1f4", mode="set", how="device")
@example(key="typestr", value="\u00e94", mode="set", how="dlpack")
def test_any_cuda_array_interface_key(key, value, mode, how):
    iface = dict(GOOD_INTERFACE)
    if mode == "del":
        iface.pop(key, None)
    else:
        iface[key] = value
    obj = Interface(iface)
    alive = weakref.ref(obj)
    w = handoff.ordered(obj)
    _, err = attempt(w.__dlpack_device__ if how == "device" else lambda: w.__dlpack__(max_version=(1, 0)))
    assert err is not None, "no driver here: at least that is refused"
    ty, message = err
    if ty is handoff.HandoffError and "CUDA is not available" in message:
        return  # the interface was read and found well-formed
    assert ty in (TypeError, ValueError, BufferError, handoff.InvalidTensorError), err
    names = {"typestr": ("typestr", "dtype"), "strides": ("stride",)}.get(key, (key,))
    assert any(n in message for n in names), (key, err)
    if key == "typestr" and isinstance(value, str) and ty is BufferError:
        assert repr(value)[1:-1] in message or value in message, "the typestr is quoted"
    del w, obj
    assert alive() is None


@pytest.mark.parametrize("raised", [AttributeError("gone"), RuntimeError("broken"), KeyError("k")])
def test_a_cuda_array_interface_that_raises(raised):
    obj = Interface(raised)
    if isinstance(raised, AttributeError):
        # hasattr() says there is none: the object has neither protocol.
        with pytest.raises(TypeError, match="has neither"):
            handoff.ordered(obj)
    else:
        with pytest.raises(type(raised), match=str(raised.args[0])):
            handoff.ordered(obj)


@pytest.mark.skipif(handoff.cuda_available(), reason="checks the refusals that come before the driver is asked")
@FAST
@given(value=WRONG_VALUES.filter(lambda v: not isinstance(v, dict)))
def test_a_cuda_array_interface_that_is_no_dict(value):
    _, err = attempt(lambda: handoff.ordered(Interface(value)).__dlpack__())
    assert err[0] is TypeError and "__cuda_array_interface__ must be a dict" in err[1], err


# ---------------------------------------------------------------------------------
# A producer's deleter that calls back into handoff.

REENTRY_SCRIPT = textwrap.dedent(
    """
    import faulthandler, sys
    faulthandler.dump_traceback_later(20, exit=True)
    sys.path.insert(0, {tests!r})
    import numpy as np
    import handoff
    from handoff import _handoff
    from dlpack_ctypes import Producer

    class Reentrant(Producer):
        def __init__(self, action):
            super().__init__()
            self.action = action

        def _on_delete(self, ptr):
            super()._on_delete(ptr)
            if self.action == "flush":
                handoff.flush()
            elif self.action == "stats":
                handoff.stats()
            elif self.action == "nested":
                b = np.from_dlpack(handoff.ordered(np.ones(2)))
                del b
                handoff.flush()

    for action in ["flush", "stats", "nested"]:
        for path in {paths!r}:
            p = Reentrant(action)
            o = handoff.ordered(p) if path == "host" else _handoff._mock_ordered(p, 100)
            b = np.from_dlpack(o)
            del b
            if path == "advance":
                o._mock_advance(1000)
            handoff.flush()
            assert p.deleted == 1, (action, path, p.deleted)
            del p, o
            print(action, path, "ok", flush=True)
    assert handoff.stats()["pending"] == 0
    print("no deadlock")
    """
)


@pytest.mark.parametrize(
    "paths", [["host"], needs_hooks(["advance", "flush"])], ids=["ordered", "simulated"]
)
def test_a_deleter_that_calls_back_into_handoff(paths):
    """A producer's deleter may call ``flush()`` (or make a hand-off of its own), also
    when ``flush()`` is what runs it: released at once (host memory), or behind a
    simulated consumer stream (a test seam), by the reaper or by ``flush()``. In a
    subprocess: a deadlock fails, not hangs."""
    import os

    script = REENTRY_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)), paths=paths)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "no deadlock" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------
# Wrappers that keep themselves alive through their producer.


class Dev(int):
    """An int that can hold a reference (a device id with an attribute)."""


@pytest.mark.parametrize("through", ["obj", "device"])
def test_a_cycle_through_the_wrapper_is_collected(through):
    class Cyclic:
        def __init__(self):
            self.array = np.ones(4)
            self.device = (1, Dev(0))

        def __dlpack_device__(self):
            return self.device

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

    c = Cyclic()
    w = handoff.ordered(c)
    if through == "obj":
        c.wrapper = w  # producer -> wrapper -> producer
    else:
        c.device[1].wrapper = w  # wrapper -> its device tuple -> wrapper
        c.device = None
    alive = weakref.ref(c)
    b = np.from_dlpack(w)
    del b, c, w
    gc.collect()
    assert alive() is None, "the garbage collector sees through the wrapper"


# ---------------------------------------------------------------------------------
# Through the framework helpers.


@functools.lru_cache(maxsize=None)
def _import_error(framework):
    try:
        importlib.import_module(framework)
    except Exception as e:  # noqa: BLE001 - torch without its CUDA libraries raises ValueError
        return f"{type(e).__name__}: {e}"[:200]
    return None


def _helper(framework):
    """``handoff.to_jax`` / ``handoff.to_torch``, skipped where the framework does not import."""
    why = _import_error(framework)
    if why is not None:
        pytest.skip(f"import {framework} fails: {why}")
    return handoff.to_jax if framework == "jax" else handoff.to_torch


@pytest.mark.parametrize("framework", ["jax", "torch"])
@settings(FAST, max_examples=25)
@given(answer=ANSWERS.filter(lambda a: a[0] != "twice"), fault=st.sampled_from([None, *FAULT_EXAMPLES]))
def test_the_framework_helpers_pass_every_refusal_on(framework, answer, fault):
    helper = _helper(framework)
    if fault is not None:
        # A malformed struct: the helper raises what ordered() raises, deleted once.
        fields, message = fault
        p = Producer(**fields)
        _, err = attempt(lambda: helper(p))
        assert err is not None and err[0] is handoff.InvalidTensorError and message in err[1], err
        assert p.deleted == 1
        return
    h = Hostile(answer)
    out, err = attempt(lambda: helper(h))
    if answer[0] == "valid":
        assert err is None, err
        del out
        gc.collect()
        assert h.tensor.deleted == 1, "exactly once, when the framework lets go"
        return
    assert err is not None, out
    expected = expected_answer(answer, {})
    # A framework may retry a TypeError without max_version, or re-raise as its own subclass.
    assert issubclass(err[0], expected[0]), (err, expected)
    assert all(n in err[1] for n in expected[1]), (err, expected)
    if h.tensor is not None:
        assert h.tensor.deleted == 0
        forget(h.tensor)


# ---------------------------------------------------------------------------------
# A producer that copies when the consumer said copy=False.


@FAST
@given(flags=st.sampled_from([0, IS_COPIED, READ_ONLY | IS_COPIED]),
       copy=st.sampled_from([None, False, True, np.False_]), max_version=st.sampled_from([None, (1, 0)]))
def test_a_copy_where_the_consumer_said_copy_false_is_refused(flags, copy, max_version):
    before = handoff.stats()
    p = Producer(flags=flags)
    cap, err = attempt(lambda: handoff.ordered(p).__dlpack__(max_version=max_version, copy=copy))
    if flags & IS_COPIED and copy is not None and not copy:
        assert err == (BufferError, "copy=False, but the producer's tensor is a copy (its flags have IS_COPIED): "
                                    "the producer did not honor copy=False"), err
    elif flags & READ_ONLY and max_version is None:
        assert err is not None and "read-only" in err[1], err
    else:
        assert err is None, err
        del cap
    assert p.deleted == 1, "taken, and deleted exactly once"
    settled(before)


# ---------------------------------------------------------------------------------
# Refusals on another thread: the deleter still runs once, on the main thread.


@pytest.mark.parametrize("consumer", CONSUMERS)
@settings(FAST, max_examples=20)
@given(fault=FAULTS, busy_us=BUSY)
def test_a_refusal_on_another_thread_is_deleted_once_on_the_main_thread(consumer, fault, busy_us):
    import threading

    busy_us = busy(consumer, busy_us)

    fields, message = fault
    p = Producer(F32, **fields)
    w = wrap(p, busy_us)
    errors = []
    t = threading.Thread(target=lambda: errors.append(attempt(lambda: w.__dlpack__(max_version=(1, 0)))[1]))
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert errors[0][0] is handoff.InvalidTensorError and message in errors[0][1], errors
    handoff.flush()  # runs the deleters queued for this, the main, thread
    assert p.deleted == 1
    assert p.deleter_threads == [threading.main_thread().ident]
