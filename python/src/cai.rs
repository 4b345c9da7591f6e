//! Objects that expose only `__cuda_array_interface__` (version 3, numba's and
//! CuPy's convention).
//!
//! The interface's `stream` is the producer's stream (`None`: nothing to wait for).
//! Where a numba consumer would synchronize the host with it, handoff orders on the
//! GPU: an event recorded on the producer's stream and a wait enqueued on the
//! consumer's (`handoff_runtime::order`, counted in `stats()`), nothing when both are
//! the same stream. The producer object is kept alive by the hand-off until the work
//! the consumer queued before its release is done, and `readonly` becomes DLPack's
//! `READ_ONLY`.

use crate::errors::{self, HandoffError};
use crate::keep_alive::PyKeepAlive;
use crate::streams::Consumer;
use handoff_runtime::cuda::{self, DlpackStream};
use handoff_runtime::dtype::{DataType, DataTypeCode};
use handoff_runtime::{Access, Device, Handoff, Ready, Release, TensorDesc, ValidationError};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::borrow::Cow;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

/// The newest interface version handoff reads.
const MAX_VERSION: i64 = 3;

/// A `__cuda_array_interface__`, read and checked.
#[derive(Debug)]
pub struct Interface {
    /// The device pointer.
    pub ptr: u64,
    /// `data[1]`: consumers must not write.
    pub read_only: bool,
    /// `shape`.
    pub shape: Vec<i64>,
    /// `strides` in elements (`None`: C-contiguous).
    pub strides: Option<Vec<i64>>,
    /// `typestr`, as a DLPack dtype.
    pub dtype: DataType,
    /// `stream` (version 3): the producer's stream, `None` when nothing is pending.
    pub stream: Option<DlpackStream>,
}

/// Reads `obj.__cuda_array_interface__`. Everything the interface can get wrong is a
/// `BufferError`/`TypeError`/`ValueError` naming the key and the value.
pub fn read(obj: &Bound<'_, PyAny>) -> PyResult<Interface> {
    let py = obj.py();
    let iface = obj.getattr(intern!(py, "__cuda_array_interface__"))?;
    let d = iface
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err(format!("__cuda_array_interface__ must be a dict, not {iface}")))?;
    let get =
        |key: &str| -> PyResult<Option<Bound<'_, PyAny>>> { Ok(d.get_item(key)?.filter(|v| !v.is_none())) };
    let version: i64 = match get("version")? {
        Some(v) => {
            v.extract().map_err(|_| PyTypeError::new_err(format!("version must be an int, not {v}")))?
        }
        None => 0,
    };
    if !(0..=MAX_VERSION).contains(&version) {
        return Err(PyBufferError::new_err(format!(
            "__cuda_array_interface__ version {version}: handoff reads versions 0 to {MAX_VERSION}"
        )));
    }
    let shape: Vec<i64> = get("shape")?
        .ok_or_else(|| PyBufferError::new_err("__cuda_array_interface__ has no shape"))?
        .extract()
        .map_err(|_| PyTypeError::new_err("__cuda_array_interface__ shape must be a tuple of ints"))?;
    let typestr: String = get("typestr")?
        .ok_or_else(|| PyBufferError::new_err("__cuda_array_interface__ has no typestr"))?
        .extract()
        .map_err(|_| PyTypeError::new_err("__cuda_array_interface__ typestr must be a str"))?;
    let dtype = parse_typestr(&typestr)?;
    let (ptr, read_only): (u64, bool) = get("data")?
        .ok_or_else(|| PyBufferError::new_err("__cuda_array_interface__ has no data"))?
        .extract()
        .map_err(|_| {
            PyTypeError::new_err("__cuda_array_interface__ data must be a (pointer, readonly) pair")
        })?;
    if get("mask")?.is_some() {
        return Err(PyBufferError::new_err(
            "__cuda_array_interface__ has a mask: masked arrays are not exchanged",
        ));
    }
    let item = (dtype.bits as i64) / 8;
    let strides = match get("strides")? {
        None => None,
        Some(s) => {
            let bytes: Vec<i64> = s.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "__cuda_array_interface__ strides must be None or a tuple of ints, not {s}"
                ))
            })?;
            if bytes.len() != shape.len() {
                return Err(PyBufferError::new_err(format!(
                    "__cuda_array_interface__ strides {bytes:?} do not match shape {shape:?}"
                )));
            }
            if let Some(bad) = bytes.iter().find(|&&b| b % item != 0) {
                return Err(PyBufferError::new_err(format!(
                    "__cuda_array_interface__ stride {bad} bytes is not a multiple of the {item}-byte \
                     element ({typestr}): DLPack strides count elements"
                )));
            }
            Some(bytes.iter().map(|b| b / item).collect())
        }
    };
    let stream = match get("stream")? {
        Some(s) if version >= 3 => {
            let v: i64 = s.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "__cuda_array_interface__ stream must be None or an int, not {s}"
                ))
            })?;
            match DlpackStream::from_value(v) {
                Ok(DlpackStream::NoSync) | Err(_) => {
                    return Err(PyValueError::new_err(format!(
                        "__cuda_array_interface__ stream {v}: the interface takes None, 1 (legacy), \
                         2 (per-thread) or a CUstream handle; 0 is disallowed"
                    )));
                }
                Ok(s) => Some(s),
            }
        }
        _ => None,
    };
    Ok(Interface { ptr, read_only, shape, strides, dtype, stream })
}

/// The DLPack dtype of a NumPy-style `typestr` (`<f4`, `|u1`, `<c8`, `|b1`, ...).
/// Only little-endian (or byte-sized) scalar types are taken.
pub fn parse_typestr(typestr: &str) -> PyResult<DataType> {
    let bad = |why: &str| PyBufferError::new_err(format!("typestr {typestr:?}: {why}"));
    let b = typestr.as_bytes();
    // ASCII only: the size is sliced off by bytes below.
    if b.len() < 3 || !typestr.is_ascii() {
        return Err(bad("expected <byte order><kind><size>, such as \"<f4\""));
    }
    let size: u8 = typestr[2..].parse().map_err(|_| bad("the size is not a number"))?;
    match b[0] {
        b'<' | b'|' | b'=' => {}
        b'>' if size == 1 => {}
        b'>' => return Err(bad("big-endian data is not exchanged")),
        _ => return Err(bad("the byte order is not one of <, >, | or =")),
    }
    let code = match b[1] {
        b'f' => DataTypeCode::FLOAT,
        b'i' => DataTypeCode::INT,
        b'u' => DataTypeCode::UINT,
        b'c' => DataTypeCode::COMPLEX,
        b'b' => DataTypeCode::BOOL,
        _ => return Err(bad("only f, i, u, c and b kinds are exchanged")),
    };
    let bits = size.checked_mul(8).ok_or_else(|| bad("too large an element"))?;
    let dtype = DataType::new(code, bits, 1);
    handoff_runtime::dtype::check(dtype).map_err(|e| errors::to_py(e.into()))?;
    Ok(dtype)
}

/// Wraps the interface's memory in a [`Handoff`] for `consumer`: ordered after the
/// producer's stream with a GPU wait (unless the consumer asked for none), keeping
/// `obj` alive until the consumer's queued work is done.
pub fn handoff(
    obj: &Bound<'_, PyAny>,
    ordinal: u32,
    consumer: &Consumer,
    access: Access,
) -> PyResult<Handoff> {
    let iface = read(obj)?;
    if access == Access::Write && iface.read_only {
        return Err(errors::to_py(ValidationError::ReadOnly.into()));
    }
    let producer = match iface.stream {
        // SAFETY: the producer names the stream its pending writes are on, alive while
        // the interface is; it is used only here, to record one event.
        Some(s) => Some(unsafe { cuda::from_dlpack_stream(ordinal, s.value()) }.map_err(errors::to_py)?),
        None => None,
    };
    let ready = if consumer.no_sync {
        Ready::Elided
    } else {
        handoff_runtime::order(producer.as_ref(), &consumer.stream).map_err(errors::to_py)?
    };
    let mut desc =
        TensorDesc::new(iface.ptr as usize as *mut c_void, Device::Cuda(ordinal), iface.dtype, iface.shape);
    if let Some(strides) = iface.strides {
        desc = desc.with_strides(Cow::Owned(strides));
    }
    desc.read_only = iface.read_only;
    Handoff::with_keep_alive(
        PyKeepAlive::new(obj.clone().unbind()),
        move |_| Ok(desc),
        &consumer.stream,
        ready,
        Release::AfterConsumer,
    )
    .map_err(errors::to_py)
}

type PointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;

/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const DEVICE_ORDINAL: c_int = 9;

fn pointer_get_attribute() -> Result<PointerGetAttribute, String> {
    static SYMBOL: OnceLock<Result<(libloading::Library, PointerGetAttribute), String>> = OnceLock::new();
    let loaded = SYMBOL.get_or_init(|| {
        // SAFETY: the driver library is already loaded by the runtime (checked by the
        // caller with `cuda::is_available`); opening it again runs no initializer.
        let lib = unsafe { libloading::Library::new(cuda::LIBRARY) }.map_err(|e| e.to_string())?;
        // SAFETY: `cuPointerGetAttribute` has this signature in every CUDA driver.
        let f = unsafe { lib.get::<PointerGetAttribute>(b"cuPointerGetAttribute\0") }
            .map(|s| *s)
            .map_err(|e| e.to_string())?;
        Ok((lib, f))
    });
    loaded.as_ref().map(|(_, f)| *f).map_err(Clone::clone)
}

/// The CUDA device that holds `obj.__cuda_array_interface__`'s memory (asked of the
/// driver; device 0 for a null pointer, which only empty arrays have).
pub fn device_ordinal(obj: &Bound<'_, PyAny>) -> PyResult<u32> {
    let py = obj.py();
    let ptr = read(obj)?.ptr;
    let available = py.detach(cuda::device_count);
    let devices = available.map_err(errors::to_py)?;
    if ptr == 0 {
        return Ok(0);
    }
    let query =
        pointer_get_attribute().map_err(|e| HandoffError::new_err(format!("cuPointerGetAttribute: {e}")))?;
    let mut ordinal: c_int = -1;
    // SAFETY: `ordinal` is a valid out-pointer for this attribute (an int).
    let rc = unsafe { query((&mut ordinal as *mut c_int).cast(), DEVICE_ORDINAL, ptr) };
    match (rc, u32::try_from(ordinal)) {
        (0, Ok(o)) => Ok(o),
        // Without a current context some drivers cannot answer; with one device the
        // answer is not in doubt.
        _ if devices == 1 => Ok(0),
        _ => Err(HandoffError::new_err(format!(
            "cuPointerGetAttribute(DEVICE_ORDINAL, {ptr:#x}) failed with CUresult {rc}: \
             is the __cuda_array_interface__ pointer device memory?"
        ))),
    }
}
