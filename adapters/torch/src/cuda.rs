//! PyTorch's CUDA streams: the current stream of a device, side streams from
//! PyTorch's pool, and switching the current stream.
//!
//! The raw functions (handles as integers, `0` = the legacy default stream, which is
//! PyTorch's default stream) work in every build; the ones that give or take a
//! [`Stream`] need the crate's `cuda` feature (handoff-runtime's CUDA backend).
//!
//! ```no_run
//! # fn main() -> handoff_runtime::Result<()> {
//! use handoff_torch::cuda;
//! if cuda::is_available() {
//!     let side = cuda::stream_from_pool(0, false)?;
//!     let _current = cuda::use_raw_stream(0, side)?; // restored on drop
//!     assert_eq!(cuda::current_raw_stream(0)?, side);
//! }
//! # Ok(()) }
//! ```

use crate::ffi;
use handoff_runtime::Result;
#[cfg(feature = "cuda")]
use handoff_runtime::Stream;

/// Whether PyTorch can use CUDA in this process: loads `libtorch_cuda.so` first (see
/// [`crate::init`]), then asks `tch::Cuda::is_available()`.
pub fn is_available() -> bool {
    crate::init();
    tch::Cuda::is_available()
}

fn index(ordinal: u32) -> i32 {
    i32::try_from(ordinal).unwrap_or(i32::MAX)
}

/// PyTorch's current stream of CUDA device `ordinal`, as a raw `CUstream`.
pub fn current_raw_stream(ordinal: u32) -> Result<u64> {
    crate::init();
    let mut raw = 0u64;
    // SAFETY: `raw` is a valid out pointer; the shim catches every exception.
    ffi::check("getCurrentCUDAStream", unsafe { ffi::hf_cuda_current_stream(index(ordinal), &mut raw) })?;
    Ok(raw)
}

/// Makes `raw` PyTorch's current stream of device `ordinal` on this thread.
/// `raw` must be a live stream of that device (or `0`, the default stream).
pub fn set_current_raw_stream(ordinal: u32, raw: u64) -> Result<()> {
    crate::init();
    // SAFETY: the shim catches every exception; PyTorch only stores the handle.
    ffi::check("setCurrentCUDAStream", unsafe { ffi::hf_cuda_set_current_stream(index(ordinal), raw) })?;
    Ok(())
}

/// A stream from PyTorch's pool of side streams of device `ordinal` (they live as long
/// as the process; PyTorch hands them out round-robin).
pub fn stream_from_pool(ordinal: u32, high_priority: bool) -> Result<u64> {
    crate::init();
    let mut raw = 0u64;
    // SAFETY: `raw` is a valid out pointer; the shim catches every exception.
    ffi::check("getStreamFromPool", unsafe {
        ffi::hf_cuda_stream_from_pool(index(ordinal), high_priority as i32, &mut raw)
    })?;
    Ok(raw)
}

/// Enqueues a kernel that spins for `cycles` GPU clock cycles on PyTorch's current
/// stream of device `ordinal` (`at::cuda::sleep`, what `torch.cuda._sleep` calls).
/// For tests of ordering: the host does not wait.
pub fn sleep(ordinal: u32, cycles: i64) -> Result<()> {
    crate::init();
    // SAFETY: the shim catches every exception.
    ffi::check("at::cuda::sleep", unsafe { ffi::hf_cuda_sleep(index(ordinal), cycles) })?;
    Ok(())
}

/// Restores the previous current stream of its device when dropped.
#[must_use = "the previous stream is restored when the guard is dropped"]
pub struct StreamGuard {
    ordinal: u32,
    previous: u64,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Err(e) = set_current_raw_stream(self.ordinal, self.previous) {
            eprintln!("handoff-torch: cannot restore the current stream of cuda:{} ({e})", self.ordinal);
        }
    }
}

/// Makes `raw` the current stream of device `ordinal` until the guard drops.
pub fn use_raw_stream(ordinal: u32, raw: u64) -> Result<StreamGuard> {
    let previous = current_raw_stream(ordinal)?;
    set_current_raw_stream(ordinal, raw)?;
    Ok(StreamGuard { ordinal, previous })
}

/// PyTorch's current stream of CUDA device `ordinal`, as a handoff [`Stream`].
///
/// PyTorch's streams outlive the hand-offs made on them: the current stream is the
/// legacy default stream or one of PyTorch's pool streams (never destroyed), unless
/// the program made a stream of its own current, which it must then keep alive while
/// hand-offs made on it are in flight.
#[cfg(feature = "cuda")]
pub fn current_stream(ordinal: u32) -> Result<Stream> {
    // SAFETY: a stream of the primary context (PyTorch's), alive as documented above.
    unsafe { handoff_runtime::cuda::stream(ordinal, current_raw_stream(ordinal)?) }
}

/// Makes a CUDA `stream` PyTorch's current stream of its device until the guard drops.
#[cfg(feature = "cuda")]
pub fn use_stream(stream: &Stream) -> Result<StreamGuard> {
    let (ordinal, raw) = raw_of(stream)?;
    use_raw_stream(ordinal, raw)
}

/// The device ordinal and raw handle of a CUDA stream, or an error naming it.
#[cfg(feature = "cuda")]
pub(crate) fn raw_of(stream: &Stream) -> Result<(u32, u64)> {
    handoff_runtime::cuda::raw_stream(stream)
        .ok_or_else(|| crate::error::TorchError::NotCudaStream { stream: format!("{stream:?}") }.into())
}
