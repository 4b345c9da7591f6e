//! Finding the CUDA driver without panicking.
//!
//! cudarc 0.19 with `dynamic-loading` panics when `libcuda` is missing or lacks a
//! symbol. So before the first cudarc call, `libcuda.so.1` is opened here with
//! `libloading`, every symbol this module calls is looked up, cudarc's own search is
//! checked to succeed, and only then are `cuInit` and `cuDeviceGetCount` called
//! (inside `catch_unwind`, as a last guard). The outcome is computed once.

use crate::error::{Error, Result};
use cudarc::driver::{result::DriverError, sys};
use libloading::Library;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

/// The driver library handoff opens (the name the NVIDIA driver installs).
pub const LIBRARY: &str = "libcuda.so.1";

/// Every driver entry point the backend calls, checked before the first call so that
/// cudarc's lazy symbol loading cannot panic later.
pub(crate) const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuStreamWaitEvent",
    "cuStreamGetCaptureInfo_v3",
    "cuUserObjectCreate",
    "cuGraphRetainUserObject",
    "cuStreamUpdateCaptureDependencies_v2",
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuGraphNodeGetDependentNodes_v2",
    "cuGraphHostNodeGetParams",
    "cuGraphHostNodeSetParams",
    "cuGraphNodeGetDependencies_v2",
    "cuGraphAddDependencies_v2",
    "cuGraphDestroyNode",
    "cuGraphDebugDotPrint",
    "cuThreadExchangeStreamCaptureMode",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// The loaded driver: the library stays open for the life of the process.
pub(crate) struct Driver {
    _library: Library,
    pub(crate) devices: u32,
}

static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

/// The driver, loaded and initialized once, or why it cannot be used.
pub(crate) fn driver() -> Result<&'static Driver> {
    match DRIVER.get_or_init(init) {
        Ok(d) => Ok(d),
        Err(reason) => Err(Error::CudaUnavailable { reason: reason.clone() }),
    }
}

/// Whether the driver was loaded and initialized already (never loads it).
pub(crate) fn loaded() -> bool {
    matches!(DRIVER.get(), Some(Ok(_)))
}

/// Opens `name` and checks that it exports every symbol in [`SYMBOLS`].
pub(crate) fn probe_library(name: &str) -> std::result::Result<Library, String> {
    // SAFETY: opening a shared library runs its initializers; the NVIDIA driver's
    // have no preconditions, and any other library of that name is only inspected.
    let library = unsafe { Library::new(name) }.map_err(|e| format!("cannot load {name}: {e}"))?;
    for symbol in SYMBOLS {
        // SAFETY: the symbol is only looked up, never called through this pointer.
        unsafe { library.get::<*const std::ffi::c_void>(symbol.as_bytes()) }
            .map_err(|e| format!("{name} has no symbol {symbol} (driver too old?): {e}"))?;
    }
    Ok(library)
}

fn init() -> std::result::Result<Driver, String> {
    let library = probe_library(LIBRARY)?;
    // SAFETY: only tries to open the candidate names cudarc will use.
    if !unsafe { sys::is_culib_present() } {
        return Err(format!("{LIBRARY} loads, but none of the library names cudarc looks for does"));
    }
    let devices = catch_unwind(AssertUnwindSafe(|| -> std::result::Result<u32, String> {
        count_calls(2);
        // SAFETY: cuInit has no preconditions; the library is known to be present.
        check(unsafe { sys::cuInit(0) }).map_err(|e| format!("cuInit failed: {e}"))?;
        let mut n = 0;
        // SAFETY: `n` is a valid out pointer; cuInit succeeded.
        check(unsafe { sys::cuDeviceGetCount(&mut n) })
            .map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
        Ok(n.max(0) as u32)
    }))
    .map_err(|_| "the CUDA driver panicked while loading".to_string())??;
    Ok(Driver { _library: library, devices })
}

/// A driver result as a `Result`.
pub(crate) fn check(r: sys::CUresult) -> std::result::Result<(), DriverError> {
    r.result()
}

/// A driver error as handoff's typed error, naming the call and its arguments.
pub(crate) fn backend_error(call: &'static str, e: DriverError, what: std::fmt::Arguments<'_>) -> Error {
    Error::Backend { backend: "cuda", call, message: format!("{e} ({what})") }
}

#[inline]
pub(crate) fn count_calls(n: u64) {
    crate::stats::add(crate::stats::DRIVER_CALLS, n);
}

/// How many CUDA driver calls the backend has made on the calling thread (context
/// queries and switches included). Tests use it to prove that a hand-off made none.
pub fn driver_calls() -> u64 {
    crate::stats::of_this_thread(crate::stats::DRIVER_CALLS)
}

/// How many CUDA driver calls the backend has made in the whole process.
pub fn driver_calls_total() -> u64 {
    crate::stats::total(crate::stats::DRIVER_CALLS)
}
