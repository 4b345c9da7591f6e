//! The DLPack stream values a consumer passes to `__dlpack__(stream=...)`, and the
//! stream each one makes the release wait for.
//!
//! | value | CUDA tensor | host tensor |
//! |---|---|---|
//! | `None`, `1` | the legacy default stream | the host |
//! | `2` | the per-thread default stream of the thread that asks (resolved here, when the capsule is made, not on whatever thread the deleter runs) | the host |
//! | `-1` | no ordering (the consumer asked for none); the release waits for the legacy default stream | the host |
//! | `> 2` | that `CUstream` (the consumer vouches for it) | the host |
//! | `0`, `< -1` | `ValueError` naming the value, before the producer is asked | same |
//!
//! **Stream `2` and threads.** CUDA's per-thread default stream is a different stream
//! on each thread, so the release event can only be recorded on the consumer's own
//! thread. A consumer that lets go of the tensor on another thread gets the runtime's
//! rule for a release that cannot be ordered: the producer's tensor is leaked on
//! purpose (counted in `stats()["releases_leaked"]`, reported once on stderr), never
//! freed early.
//!
//! **Why `-1` releases after the legacy default stream.** With `-1` the consumer
//! takes synchronization on itself, and handoff does not know which stream it will
//! read on. Releasing at once could hand the memory to a new owner while a consumer
//! kernel still reads it; waiting on the host is what handoff never does. An event
//! recorded on the legacy default stream completes only after all work queued before
//! it on every *blocking* stream of the device (the legacy stream synchronizes with
//! them: the per-thread default streams and XLA's streams are blocking), so the
//! release covers a consumer on any of those. Work on non-blocking streams (PyTorch's
//! pool streams) is not covered: a consumer that passes `-1` and reads on such a
//! stream must keep the tensor alive until its work is done, as DLPack says.

use crate::errors;
use handoff_runtime::Stream;
use handoff_runtime::cuda::{self, DlpackStream};
use handoff_runtime::ffi::{DLDevice, DLDeviceType};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBool;

/// What the consumer's `stream` argument asked for, decoded before anything is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requested {
    /// `None`.
    Default,
    /// A value of the protocol (`1`, `2`, `-1` or a `CUstream`).
    Value(DlpackStream),
}

impl Requested {
    /// Whether the consumer asked for no synchronization (`-1`).
    pub fn no_sync(self) -> bool {
        self == Requested::Value(DlpackStream::NoSync)
    }
}

/// Decodes the consumer's `stream` argument. `0` and negative values but `-1` are a
/// `ValueError` naming the value; anything but `None` or an `int` a `TypeError`.
pub fn parse(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Requested> {
    let Some(s) = stream.filter(|s| !s.is_none()) else {
        return Ok(Requested::Default);
    };
    if s.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("stream must be None or an int, not the bool {s}")));
    }
    let value: i64 = match s.extract() {
        Ok(v) => v,
        Err(_) if s.is_instance_of::<pyo3::types::PyInt>() => {
            return Err(PyValueError::new_err(format!(
                "stream={s}: a DLPack stream value must fit in 64 bits (-1, 1, 2 or a CUstream handle)"
            )));
        }
        Err(_) => {
            let ty = s.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
            return Err(PyTypeError::new_err(format!("stream must be None or an int, not {ty}")));
        }
    };
    DlpackStream::from_value(value)
        .map(Requested::Value)
        .map_err(|e| PyValueError::new_err(format!("stream={value}: {e}")))
}

/// The stream a hand-off's release is ordered on, resolved on the calling thread.
pub struct Consumer {
    /// The stream whose queued work the release waits for.
    pub stream: Stream,
    /// The consumer asked for no synchronization (`-1`).
    pub no_sync: bool,
}

/// Resolves `requested` for a tensor on `device` (see the module's table). A CUDA
/// stream needs the driver: without it, a `HandoffError` says why.
pub fn resolve(device: DLDevice, requested: Requested) -> PyResult<Consumer> {
    let no_sync = requested.no_sync();
    let host = || Consumer { stream: Stream::host(), no_sync };
    let cuda_rules = match device.device_type {
        DLDeviceType::CUDA => true,
        // Pinned host memory that a consumer reads on a stream is released after it.
        DLDeviceType::CUDAHOST => requested != Requested::Default,
        // Host memory, and devices validation refuses (it names them).
        _ => false,
    };
    let Ok(ordinal) = u32::try_from(device.device_id) else {
        // A negative device id: validation refuses the tensor, naming it.
        return Ok(host());
    };
    if !cuda_rules {
        return Ok(host());
    }
    let stream = match requested {
        Requested::Default
        | Requested::Value(DlpackStream::Legacy)
        | Requested::Value(DlpackStream::NoSync) => cuda::legacy_stream(ordinal),
        Requested::Value(DlpackStream::PerThread) => cuda::per_thread_stream(ordinal),
        Requested::Value(raw @ DlpackStream::Raw(_)) => {
            // SAFETY: the consumer names the stream it will read the tensor on, and by
            // the DLPack protocol keeps it alive while it uses the tensor, which is until
            // it calls the deleter (when the release event is recorded on it).
            unsafe { cuda::from_dlpack_stream(ordinal, raw.value()) }
        }
    }
    .map_err(errors::to_py)?;
    Ok(Consumer { stream, no_sync })
}

/// Reads a `(device_type, device_id)` pair (`__dlpack_device__`'s result, or the
/// consumer's `dl_device`).
pub fn parse_device(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<DLDevice> {
    let (device_type, device_id): (i64, i64) = obj.extract().map_err(|_| {
        PyTypeError::new_err(format!("{what} must be a (device_type, device_id) pair of ints, not {obj}"))
    })?;
    let device_type = u32::try_from(device_type).map_err(|_| {
        PyValueError::new_err(format!("{what}: device_type {device_type} is not a DLPack device"))
    })?;
    let device_id = i32::try_from(device_id)
        .map_err(|_| PyValueError::new_err(format!("{what}: device_id {device_id} is out of range")))?;
    Ok(DLDevice { device_type: DLDeviceType(device_type), device_id })
}
