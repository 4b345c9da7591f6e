//! The CUDA backend: [`Stream`]s over borrowed `CUstream`s, ordered through pooled
//! events with the driver's thin layer (`cuEventRecord`, `cuStreamWaitEvent`,
//! `cuEventQuery`), on each device's primary context.
//!
//! - **Borrowed streams.** [`stream`] (unsafe: the caller vouches for the handle)
//!   wraps a raw `CUstream` owned by someone else (PyTorch, XLA, cudarc, your code).
//!   handoff never creates or destroys a stream; the owner must keep it alive while
//!   handoff values refer to it, or be attached with `Stream::with_owner`.
//! - **Per-thread default streams** (`0x2`, DLPack's value 2) belong to the thread
//!   that made the `Stream`: two threads' are different streams, and one used on
//!   another thread is refused, never silently taken for that thread's stream.
//! - **One backend per device**, opened on first use and cached: making a
//!   [`Stream`] costs an `Arc` clone, no allocation and no driver call.
//! - **Events** come from a per-device [`EventPool`](crate::EventPool), created with
//!   `CU_EVENT_DISABLE_TIMING`; a steady state creates none.
//! - **Context.** Every driver call runs with the device's primary context current
//!   (the one PyTorch, XLA's CUDA plugin and cudarc use, so raw handles are valid
//!   across the three), whatever is current on the calling thread: when it already is,
//!   the check costs one `cuCtxGetCurrent`; when another context is current, the
//!   primary one is pushed and popped around the call; when none is, it is made
//!   current and left so.
//! - **No `libcuda`**: every function returns [`Error::CudaUnavailable`], never
//!   panics. `libcuda.so.1` is probed with `libloading` before cudarc is touched
//!   (cudarc panics when the library is missing).
//! - **No hidden sync.** Nothing here uses cudarc's safe layer. The only blocking call
//!   is `cuEventSynchronize`, which the runtime reaches only through
//!   [`stats::host_sync`](crate::stats::host_sync), so it is counted.
//!
//! ```
//! use handoff_runtime::cuda;
//! if cuda::is_available() {
//!     let legacy = cuda::legacy_stream(0).unwrap();
//!     assert_eq!(cuda::raw_stream(&legacy), Some((0, 0)));
//!     // SAFETY: value 1 names the legacy default stream.
//!     assert_eq!(unsafe { cuda::from_dlpack_stream(0, 1) }.unwrap(), legacy);
//! } else {
//!     assert!(matches!(cuda::legacy_stream(0), Err(handoff_runtime::Error::CudaUnavailable { .. })));
//! }
//! ```

mod backend;
mod driver;
mod graph;
mod graph_edit;

pub use graph::with_capture_mode_relaxed;

pub use driver::{LIBRARY, driver_calls, driver_calls_total};
pub use graph_edit::{Settled, code_library, describe_graph, prune_taken_out, settle_capture};

use crate::error::{Error, Result};
use crate::stream::{RawStream, Stream};
use backend::{CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, CudaBackend, LEGACY};

/// Whether CUDA can be used: `libcuda.so.1` loads with every symbol handoff calls,
/// `cuInit` succeeds and there is at least one device.
pub fn is_available() -> bool {
    matches!(device_count(), Ok(n) if n >= 1)
}

/// The number of CUDA devices, or [`Error::CudaUnavailable`] saying why the driver
/// cannot be used.
pub fn device_count() -> Result<u32> {
    driver::driver().map(|d| d.devices)
}

/// The [`Stream`] for a raw `CUstream` of device `ordinal`, borrowed: handoff never
/// destroys it. `0` (and `CU_STREAM_LEGACY`, `0x1`) name the legacy default stream,
/// and give equal streams; `0x2` (`CU_STREAM_PER_THREAD`) names the per-thread default
/// stream *of the calling thread* (a different stream on each thread: the result
/// belongs to this thread, see [`Stream`]).
///
/// Cheap: the backend is cached, so this makes no driver call and no allocation.
/// Attach what owns the stream with [`Stream::with_owner`] to keep it alive.
///
/// # Safety
/// `raw` must be a stream of the primary context of `ordinal` (PyTorch's, XLA's and
/// cudarc's streams are) that stays alive for as long as the returned value or any
/// clone of it is used (a hand-off in flight records its release event on it later).
/// The default streams ([`legacy_stream`], [`per_thread_stream`]) always are.
///
/// # Errors
/// [`Error::CudaUnavailable`] without a usable driver or when `ordinal` is not a device.
pub unsafe fn stream(ordinal: u32, raw: u64) -> Result<Stream> {
    let backend: &'static backend::CudaBackend = backend::backend(ordinal)?;
    let raw = if raw == CU_STREAM_LEGACY { LEGACY } else { raw };
    Ok(Stream::new_static(backend, raw))
}

/// The legacy default stream of device `ordinal` (it exists as long as the context).
///
/// # Errors
/// As [`stream`].
pub fn legacy_stream(ordinal: u32) -> Result<Stream> {
    // SAFETY: the legacy default stream lives as long as the primary context.
    unsafe { stream(ordinal, LEGACY) }
}

/// The calling thread's per-thread default stream of device `ordinal`: it belongs to
/// this thread, and is refused on others.
///
/// # Errors
/// As [`stream`].
pub fn per_thread_stream(ordinal: u32) -> Result<Stream> {
    // SAFETY: a per-thread default stream lives as long as the primary context.
    unsafe { stream(ordinal, CU_STREAM_PER_THREAD) }
}

/// The [`Stream`] a DLPack Python-protocol `stream` value names on device `ordinal`
/// (the value a consumer passes to `__dlpack__(stream=...)` for `kDLCUDA`).
///
/// - `1`: the legacy default stream (also what Python's `None` means for CUDA:
///   pass 1 for it);
/// - `2`: the per-thread default stream;
/// - `> 2`: a raw `CUstream`, borrowed as [`stream`] does;
/// - `0`: refused: the spec disallows it, because it is ambiguous between the three
///   meanings above;
/// - `-1`: refused: it means "the producer must not synchronize at all", which is no
///   stream to order on. Returning some stream would make [`crate::order`] enqueue
///   a wait the consumer asked not to have; a caller that accepts `-1` should skip
///   ordering (see [`DlpackStream::NoSync`]);
/// - other negative values: refused (not defined by the spec).
///
/// The value is checked before the driver is, so a bad value is reported as such on
/// every machine. `2` gives the calling thread's per-thread default stream.
///
/// # Safety
/// A value `> 2` must be a stream handle as [`stream`] requires.
///
/// # Errors
/// [`Error::Adapter`] for `0`, `-1` and other negative values (naming the value);
/// [`Error::CudaUnavailable`] as [`stream`].
pub unsafe fn from_dlpack_stream(ordinal: u32, value: i64) -> Result<Stream> {
    match DlpackStream::from_value(value)?.raw() {
        // SAFETY: the default streams always qualify; other handles are the caller's.
        Some(raw) => unsafe { stream(ordinal, raw) },
        None => Err(Error::Adapter {
            adapter: "cuda",
            message: "DLPack stream value -1 means the producer must not synchronize: there is no stream \
                      to order on; skip ordering instead of asking for a Stream"
                .into(),
        }),
    }
}

/// The device ordinal and raw `CUstream` of a CUDA stream (`0` for the legacy
/// default stream, `0x2` for the per-thread one), or `None` for other backends and
/// for another thread's per-thread default stream (whose handle names a different
/// stream here).
pub fn raw_stream(stream: &Stream) -> Option<(u32, u64)> {
    let any: &dyn std::any::Any = stream.backend();
    let backend = any.downcast_ref::<CudaBackend>()?;
    stream.is_usable_here().then(|| (backend.ordinal(), stream.raw()))
}

/// The id of the CUDA graph capture `stream` is part of (`cuStreamGetCaptureInfo`,
/// never blocking), unique in the process for its life: two captures never share one,
/// even where the driver reuses a graph's handle. `None` when `stream` is not
/// capturing, or is not a CUDA stream usable on this thread.
///
/// ```
/// use handoff_runtime::cuda;
/// if cuda::is_available() {
///     let legacy = cuda::legacy_stream(0).unwrap(); // never captures
///     assert_eq!(cuda::capture_id(&legacy).unwrap(), None);
/// }
/// ```
///
/// # Errors
/// A capture invalidated by an earlier error, or the driver's error.
pub fn capture_id(stream: &Stream) -> Result<Option<u64>> {
    let Some((ordinal, raw)) = raw_stream(stream) else { return Ok(None) };
    Ok(backend::backend(ordinal)?.capture_graph(raw)?.map(|(_, id)| id))
}

/// The DLPack Python-protocol value that names a CUDA stream (what a consumer passes
/// to a producer's `__dlpack__(stream=...)`): `1` for the legacy default stream, `2`
/// for the per-thread one, the handle otherwise. `None` for other backends.
pub fn dlpack_stream_value(stream: &Stream) -> Option<i64> {
    raw_stream(stream).map(|(_, raw)| DlpackStream::from_raw(raw).value())
}

/// The raw `CUcontext` handoff uses for device `ordinal`: its primary context.
///
/// # Errors
/// As [`stream`].
pub fn primary_context(ordinal: u32) -> Result<u64> {
    Ok(backend::backend(ordinal)?.context() as usize as u64)
}

/// A CUDA stream as the DLPack Python protocol names it, decoded without a driver.
///
/// ```
/// use handoff_runtime::cuda::DlpackStream;
/// assert_eq!(DlpackStream::from_value(1).unwrap(), DlpackStream::Legacy);
/// assert_eq!(DlpackStream::from_value(0x7f00).unwrap().raw(), Some(0x7f00));
/// assert!(DlpackStream::from_value(0).is_err());
/// assert_eq!(DlpackStream::from_value(-1).unwrap(), DlpackStream::NoSync);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DlpackStream {
    /// `1`: the legacy default stream (raw handle `0`).
    Legacy,
    /// `2`: the per-thread default stream (`CU_STREAM_PER_THREAD`).
    PerThread,
    /// `> 2`: a raw `CUstream` handle.
    Raw(u64),
    /// `-1`: the consumer asks for no synchronization at all.
    NoSync,
}

impl DlpackStream {
    /// Decodes a protocol value. `0` (disallowed by the spec as ambiguous) and
    /// negative values other than `-1` are refused with [`Error::Adapter`].
    pub fn from_value(value: i64) -> Result<DlpackStream> {
        match value {
            1 => Ok(DlpackStream::Legacy),
            2 => Ok(DlpackStream::PerThread),
            -1 => Ok(DlpackStream::NoSync),
            v if v > 2 => Ok(DlpackStream::Raw(v as u64)),
            0 => Err(Error::Adapter {
                adapter: "cuda",
                message: "DLPack stream value 0 is disallowed by the DLPack spec for CUDA (it is ambiguous \
                          between None, 1 and 2): pass 1 for the legacy default stream, 2 for the per-thread \
                          default stream, or the CUstream handle"
                    .into(),
            }),
            v => Err(Error::Adapter {
                adapter: "cuda",
                message: format!(
                    "DLPack stream value {v} is not defined for CUDA: use -1 (no sync), 1 (legacy), \
                     2 (per-thread) or a CUstream handle > 2"
                ),
            }),
        }
    }

    /// The stream a raw handle names (`0` and `0x1` legacy, `0x2` per-thread).
    pub fn from_raw(raw: RawStream) -> DlpackStream {
        match raw {
            LEGACY | CU_STREAM_LEGACY => DlpackStream::Legacy,
            CU_STREAM_PER_THREAD => DlpackStream::PerThread,
            r => DlpackStream::Raw(r),
        }
    }

    /// The raw handle handoff uses for it (`0` for legacy), `None` for [`NoSync`](Self::NoSync).
    pub fn raw(self) -> Option<RawStream> {
        match self {
            DlpackStream::Legacy => Some(LEGACY),
            DlpackStream::PerThread => Some(CU_STREAM_PER_THREAD),
            DlpackStream::Raw(r) => Some(r),
            DlpackStream::NoSync => None,
        }
    }

    /// The protocol value.
    pub fn value(self) -> i64 {
        match self {
            DlpackStream::Legacy => 1,
            DlpackStream::PerThread => 2,
            DlpackStream::Raw(r) => r as i64,
            DlpackStream::NoSync => -1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Export, Ready, StreamOrdered, TensorDesc, dtype::DataType};

    fn unavailable(r: &Result<impl std::fmt::Debug>) -> bool {
        matches!(r, Err(Error::CudaUnavailable { .. }))
    }

    /// The borrowing constructor, for handles these tests never enqueue on (the
    /// default streams, and made-up handles on machines without CUDA).
    fn stream(ordinal: u32, raw: u64) -> Result<Stream> {
        // SAFETY: see above.
        unsafe { super::stream(ordinal, raw) }
    }

    fn from_dlpack_stream(ordinal: u32, value: i64) -> Result<Stream> {
        // SAFETY: as `stream`.
        unsafe { super::from_dlpack_stream(ordinal, value) }
    }

    #[test]
    fn per_thread_default_streams_of_two_threads_are_different_streams() {
        if !is_available() {
            println!("SKIPPED: no CUDA device ({:?})", device_count().err());
            return;
        }
        let here = per_thread_stream(0).unwrap();
        let there = std::thread::spawn(|| per_thread_stream(0).unwrap()).join().unwrap();
        assert_ne!(here, there, "the same handle 0x2, two threads: two streams");
        assert_eq!(here, per_thread_stream(0).unwrap());
        assert_eq!(raw_stream(&here), Some((0, 2)));
        assert_eq!(raw_stream(&there), None, "its handle names another stream on this thread");
        // Ordering another thread's per-thread stream from here is refused (it cannot
        // be reached from this thread), never elided as if it were this thread's.
        for r in [crate::order(Some(&there), &here), crate::order(Some(&here), &there)] {
            assert!(matches!(r, Err(Error::WrongThread { .. })), "{r:?}");
        }
        assert!(matches!(there.record(), Err(Error::WrongThread { .. })));
        // On its own thread it orders as usual.
        assert_eq!(crate::order(Some(&here), &legacy_stream(0).unwrap()).unwrap(), crate::Ready::Waited);
        // The legacy default stream is one stream on every thread.
        let legacy_there = std::thread::spawn(|| legacy_stream(0).unwrap()).join().unwrap();
        assert_eq!(legacy_there, legacy_stream(0).unwrap());
        assert!(legacy_there.record().is_ok());
    }

    #[test]
    fn protocol_values_map_without_a_driver() {
        assert_eq!(DlpackStream::from_value(1).unwrap(), DlpackStream::Legacy);
        assert_eq!(DlpackStream::from_value(2).unwrap(), DlpackStream::PerThread);
        assert_eq!(DlpackStream::from_value(3).unwrap(), DlpackStream::Raw(3));
        assert_eq!(DlpackStream::from_value(0x55d0_1234_5000).unwrap(), DlpackStream::Raw(0x55d0_1234_5000));
        assert_eq!(DlpackStream::from_value(-1).unwrap(), DlpackStream::NoSync);
        assert_eq!(DlpackStream::Legacy.raw(), Some(0));
        assert_eq!(DlpackStream::PerThread.raw(), Some(2));
        assert_eq!(DlpackStream::NoSync.raw(), None);
        for raw in [0u64, 1, 2, 3, 0x7fff_0000] {
            let s = DlpackStream::from_raw(raw);
            assert_eq!(DlpackStream::from_value(s.value()).unwrap(), s, "raw {raw:#x}");
        }
        assert_eq!(DlpackStream::from_raw(1), DlpackStream::Legacy);
        assert_eq!(DlpackStream::from_raw(0).value(), 1);
    }

    #[test]
    fn disallowed_protocol_values_are_typed_errors_naming_the_value() {
        for v in [0i64, -2, -100, i64::MIN] {
            match DlpackStream::from_value(v) {
                Err(Error::Adapter { adapter: "cuda", message }) => {
                    assert!(message.contains(&format!("value {v}")), "{message}")
                }
                other => panic!("{v}: {other:?}"),
            }
            // Refused before the driver is looked at, on every machine.
            assert!(matches!(from_dlpack_stream(0, v), Err(Error::Adapter { .. })), "{v}");
        }
        match from_dlpack_stream(0, -1) {
            Err(Error::Adapter { message, .. }) => assert!(message.contains("-1"), "{message}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        let e = driver::probe_library("libhandoff-no-such-cuda.so.1").err().unwrap();
        assert!(e.contains("libhandoff-no-such-cuda.so.1"), "{e}");
        // A library that exists but is not the driver lacks the symbols.
        if let Err(e) = driver::probe_library("libc.so.6") {
            assert!(e.contains("cuInit"), "{e}");
        }
    }

    #[test]
    fn without_cuda_every_entry_point_is_cuda_unavailable() {
        if is_available() {
            println!(
                "SKIPPED: a CUDA device is present; the no-CUDA paths are tested on machines without one"
            );
            return;
        }
        assert!(!is_available());
        // A driver with no device is "available" as a library but has no ordinal 0.
        if let Ok(n) = device_count() {
            assert_eq!(n, 0);
        } else {
            assert!(unavailable(&device_count()));
        }
        assert!(unavailable(&stream(0, 0)));
        assert!(unavailable(&stream(3, 0x1234_5000)));
        assert!(unavailable(&from_dlpack_stream(0, 1)));
        assert!(unavailable(&from_dlpack_stream(0, 2)));
        assert!(unavailable(&from_dlpack_stream(0, 0x1234_5000)));
        assert!(unavailable(&primary_context(0)));
        match stream(0, 0) {
            Err(e) => assert!(e.to_string().starts_with("CUDA is not available: "), "{e}"),
            Ok(_) => unreachable!(),
        }
        // Twice: the outcome is cached, still an error, still no panic.
        assert!(unavailable(&stream(0, 0)));
        assert_eq!(raw_stream(&Stream::host()), None);
        assert_eq!(dlpack_stream_value(&Stream::host()), None);
        // Host values still hand off without touching CUDA.
        struct HostBytes(Vec<f32>);
        impl StreamOrdered for HostBytes {
            fn device(&self) -> Device {
                Device::Host
            }
            fn stream(&self) -> Option<Stream> {
                None
            }
        }
        impl Export for HostBytes {
            fn describe(&self) -> Result<TensorDesc<'_>> {
                Ok(TensorDesc::new(self.0.as_ptr() as *mut _, Device::Host, DataType::F32, vec![2]))
            }
        }
        let h = HostBytes(vec![1.0, 2.0]).export(&Stream::host()).unwrap();
        assert_eq!(h.ready(), Ready::Elided);
    }

    #[test]
    fn with_cuda_streams_are_cached_and_compare_by_handle() {
        if !is_available() {
            println!("SKIPPED: no CUDA device ({:?})", device_count().err());
            return;
        }
        stream(0, 0).unwrap(); // the first stream of a device opens its backend
        let calls = driver_calls();
        let a = stream(0, 0).unwrap();
        assert_eq!(driver_calls(), calls, "making a stream makes no driver call");
        assert_eq!(a, stream(0, 1).unwrap(), "0 and CU_STREAM_LEGACY are the same stream");
        assert_eq!(a, from_dlpack_stream(0, 1).unwrap());
        assert_eq!(raw_stream(&a), Some((0, 0)));
        assert_eq!(dlpack_stream_value(&a), Some(1));
        let ptds = from_dlpack_stream(0, 2).unwrap();
        assert_eq!(raw_stream(&ptds), Some((0, 2)));
        assert_ne!(a, ptds);
        assert_eq!(a.device(), Device::Cuda(0));
        assert!(format!("{a:?}").contains("cuda:0/legacy"));
        let n = device_count().unwrap();
        assert!(unavailable(&stream(n, 0)), "ordinal {n} does not exist");
    }
}
