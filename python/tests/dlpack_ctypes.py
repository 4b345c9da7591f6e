"""A DLPack producer built with ctypes, for tests: any field can be wrong, and its
deleter counts its calls."""

from __future__ import annotations

import ctypes as C
import threading
from typing import Any, Optional, Sequence

import numpy as np


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [
        ("data", C.c_void_p),
        ("device", DLDevice),
        ("ndim", C.c_int32),
        ("dtype", DLDataType),
        ("shape", C.POINTER(C.c_int64)),
        ("strides", C.POINTER(C.c_int64)),
        ("byte_offset", C.c_uint64),
    ]


class DLManagedTensor(C.Structure):
    pass


LEGACY_DELETER = C.CFUNCTYPE(None, C.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", C.c_void_p),
    ("deleter", LEGACY_DELETER),
]


class DLPackVersion(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32)]


class DLManagedTensorVersioned(C.Structure):
    pass


VERSIONED_DELETER = C.CFUNCTYPE(None, C.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", C.c_void_p),
    ("deleter", VERSIONED_DELETER),
    ("flags", C.c_uint64),
    ("dl_tensor", DLTensor),
]

READ_ONLY = 1
IS_COPIED = 2
IS_SUBBYTE_TYPE_PADDED = 4

_api = C.pythonapi
_api.PyCapsule_New.restype = C.py_object
_api.PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
_api.PyCapsule_GetName.restype = C.c_char_p
_api.PyCapsule_GetName.argtypes = [C.py_object]
_api.PyCapsule_IsValid.restype = C.c_int
_api.PyCapsule_IsValid.argtypes = [C.c_void_p, C.c_char_p]
_api.PyCapsule_GetPointer.restype = C.c_void_p
_api.PyCapsule_GetPointer.argtypes = [C.c_void_p, C.c_char_p]

# Capsule names must outlive their capsules.
_VERSIONED = C.c_char_p(b"dltensor_versioned")
_LEGACY = C.c_char_p(b"dltensor")

_DESTRUCTOR = C.CFUNCTYPE(None, C.c_void_p)


@_DESTRUCTOR
def _destroy(
    capsule: int,
    _api=_api,
    _kinds=((_VERSIONED, DLManagedTensorVersioned), (_LEGACY, DLManagedTensor)),
    _cast=C.cast,
    _pointer=C.POINTER,
) -> None:
    # As a producer's capsule destructor must: delete only an unconsumed tensor. What it
    # uses is bound here: at interpreter exit it may run after this module's globals
    # were cleared.
    for name, kind in _kinds:
        if _api.PyCapsule_IsValid(capsule, name) == 1:
            ptr = _api.PyCapsule_GetPointer(capsule, name)
            managed = _cast(ptr, _pointer(kind))
            managed.contents.deleter(managed)
            return


_DESTROY_PTR = C.cast(_destroy, C.c_void_p).value
# Never freed: a capsule that outlives this module at interpreter exit (a Producer's
# ``capsule``) calls its destructor after the module's globals are cleared, and a
# freed ctypes callback crashes the process (seen: SIGSEGV in the exit collection).
_api.Py_IncRef.argtypes = [C.py_object]
_api.Py_IncRef(_destroy)


def capsule_name(capsule: Any) -> str:
    """The name of a capsule (``dltensor``, ``used_dltensor_versioned``, ...)."""
    return _api.PyCapsule_GetName(capsule).decode()


def make_capsule(address: int, versioned: bool, *, destructor: bool = True) -> Any:
    """A DLPack capsule over the managed tensor at ``address``."""
    name = _VERSIONED if versioned else _LEGACY
    return _api.PyCapsule_New(address, name, _DESTROY_PTR if destructor else None)


def _i64_array(values: Optional[Sequence[int]]) -> Any:
    if values is None:
        return None
    return (C.c_int64 * max(len(values), 1))(*values)


# Producers whose tensor is out (handed out, deleter not yet called) stay alive, as a
# real producer's manager_ctx keeps its owner: a deleter must stay callable until called.
_OUT: set = set()


class Producer:
    """One DLPack managed tensor made with ctypes, over ``array``'s memory (kept
    alive here), with a deleter that counts its calls in ``deleted``.

    Every field can be set, including wrong values; ``__dlpack__`` records the
    arguments it was called with in ``calls`` and keeps the last capsule in
    ``capsule``.
    """

    def __init__(
        self,
        array: Optional[np.ndarray] = None,
        *,
        versioned: bool = True,
        version: tuple = (1, 1),
        flags: int = 0,
        device: tuple = (1, 0),
        dlpack_device: Optional[tuple] = None,
        dtype: Optional[tuple] = None,
        shape: Optional[Sequence[int]] = None,
        strides: Optional[Sequence[int]] = None,
        null_shape: bool = False,
        null_strides: bool = False,
        ndim: Optional[int] = None,
        data: Optional[int] = None,
        byte_offset: int = 0,
        legacy_only: bool = False,
    ) -> None:
        if array is None:
            array = np.arange(8, dtype=np.float32)
        self.array = array
        self.deleted = 0
        self.deleter_threads: list = []  # threading.get_ident() of each deleter call
        self.calls: list = []
        self.capsule: Any = None
        self.versioned = versioned
        self.legacy_only = legacy_only
        self.dlpack_device = dlpack_device or device
        if dtype is None:
            kind = {"f": 2, "i": 0, "u": 1, "c": 5, "b": 6}[array.dtype.kind]
            dtype = (kind, array.dtype.itemsize * 8, 1)
        if shape is None:
            shape = array.shape
        if strides is None and not null_strides:
            strides = [s // array.dtype.itemsize for s in array.strides]
        self._shape = None if null_shape else _i64_array(shape)
        self._strides = None if null_strides else _i64_array(strides)
        t = DLTensor()
        t.data = array.ctypes.data if data is None else data
        t.device = DLDevice(*device)
        t.ndim = len(shape) if ndim is None else ndim
        t.dtype = DLDataType(*dtype)
        t.shape = C.cast(self._shape, C.POINTER(C.c_int64)) if self._shape is not None else None
        t.strides = C.cast(self._strides, C.POINTER(C.c_int64)) if self._strides is not None else None
        t.byte_offset = byte_offset
        if versioned:
            self._deleter = VERSIONED_DELETER(self._on_delete)
            m = DLManagedTensorVersioned()
            m.version = DLPackVersion(*version)
            m.flags = flags
        else:
            self._deleter = LEGACY_DELETER(self._on_delete)
            m = DLManagedTensor()
        m.dl_tensor = t
        m.manager_ctx = None
        m.deleter = self._deleter
        self.managed = m

    def _on_delete(self, _ptr: Any) -> None:
        self.deleted += 1
        self.deleter_threads.append(threading.get_ident())
        _OUT.discard(self)

    def __hash__(self) -> int:
        return id(self)

    def __dlpack_device__(self) -> tuple:
        return self.dlpack_device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if self.legacy_only and max_version is not None:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.calls.append({"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy})
        self.capsule = make_capsule(C.addressof(self.managed), self.versioned)
        _OUT.add(self)
        return self.capsule


class Holder:
    """A producer that returns a capsule made elsewhere (to watch a consumer take it)."""

    def __init__(self, capsule: Any, device: tuple = (1, 0)) -> None:
        self.capsule = capsule
        self.device = device

    def __dlpack_device__(self) -> tuple:
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.capsule
