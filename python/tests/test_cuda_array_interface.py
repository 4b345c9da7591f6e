"""Objects that expose only ``__cuda_array_interface__``: what can be checked without a
GPU (the interface is read and checked before the driver is asked; without a driver a
clear HandoffError). The GPU path runs in bench/gpu_exchange_checks.py."""

import pytest

import handoff


class Interface:
    def __init__(self, **overrides):
        self.__cuda_array_interface__ = {
            "shape": (4,),
            "typestr": "<f4",
            "data": (0x7F00_0000_0000, False),
            "strides": None,
            "version": 3,
            "stream": 1,
        }
        self.__cuda_array_interface__.update(overrides)


def test_wrapping_needs_no_driver():
    o = handoff.ordered(Interface())
    assert "__cuda_array_interface__" in repr(o)


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"typestr": ">f4"}, BufferError, "big-endian"),
        ({"typestr": "<V2"}, BufferError, "kinds"),
        ({"typestr": "<f3"}, handoff.InvalidTensorError, "bits 24"),
        ({"typestr": "f"}, BufferError, "typestr"),
        ({"mask": object()}, BufferError, "mask"),
        ({"strides": (6,)}, BufferError, "not a multiple"),
        ({"strides": (4, 4)}, BufferError, "do not match"),
        ({"version": 4}, BufferError, "version 4"),
        ({"stream": 0}, ValueError, "stream 0"),
        ({"stream": -1}, ValueError, "stream -1"),
        ({"data": None}, BufferError, "no data"),
        ({"shape": "abc"}, TypeError, "shape"),
    ],
)
def test_bad_interfaces_are_refused_naming_the_key(overrides, error, message):
    o = handoff.ordered(Interface(**overrides))
    with pytest.raises(error, match=message):
        o.__dlpack__(max_version=(1, 0))


@pytest.mark.skipif(handoff.cuda_available(), reason="this machine has CUDA")
def test_without_a_driver_the_error_says_why():
    o = handoff.ordered(Interface())
    with pytest.raises(handoff.HandoffError, match="CUDA is not available"):
        o.__dlpack_device__()
    with pytest.raises(handoff.HandoffError, match="CUDA is not available"):
        o.__dlpack__(max_version=(1, 0))


@pytest.mark.skipif(handoff.cuda_available(), reason="this machine has CUDA")
def test_cuda_tensors_need_the_driver():
    from dlpack_ctypes import Producer

    p = Producer(device=(2, 0))
    with pytest.raises(handoff.HandoffError, match="CUDA is not available"):
        handoff.ordered(p).__dlpack__(stream=1, max_version=(1, 0))
    assert p.calls == [], "the stream is resolved before the producer is asked"
