//! # handoff-torch
//!
//! PyTorch tensors (through [`tch`] 0.24, PyTorch 2.11) handed to and from other
//! frameworks with no copy and no host synchronization.
//!
//! - [`TorchTensor`] wraps a `tch::Tensor` with its stream (PyTorch's current stream
//!   of its device when wrapped, or one the caller names; CPU tensors have none). It
//!   is [`StreamOrdered`](handoff_runtime::StreamOrdered), [`Export`](handoff_runtime::Export) and [`Import`](handoff_runtime::Import).
//! - [`export`] and [`import`] do the same for plain `tch::Tensor`s, and
//!   [`CurrentStream`] lets generic code (`handoff::transfer`, an XLA kernel call) take
//!   and return `tch::Tensor`s directly, on PyTorch's current stream.
//! - [`cuda`]: PyTorch's CUDA streams (current, pool, switching) and a GPU spin kernel.
//! - [`graph`]: one CUDA graph for a step that mixes PyTorch's work with XLA's or your own.
//!
//! Export describes the tensor as DLPack from PyTorch's own metadata (every strided
//! layout and every dtype DLPack and PyTorch share); the hand-off keeps a shallow
//! clone of the tensor alive. When the consumer works on another CUDA stream, the
//! caching allocator is told with `recordStream`, so the block is not reused before the
//! consumer's queued work is done (memory not from the caching allocator is kept alive
//! by the reaper instead). Import views the hand-off's memory through `from_blob` with a
//! deleter: when PyTorch drops its last reference, the hand-off is released after the
//! work queued on the import stream (PyTorch's current stream at import, unless one is
//! named) has finished.
//!
//! ```
//! use handoff_runtime::Stream;
//! let x = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).reshape([2, 2]).tr();
//! let h = handoff_torch::export(&x, &Stream::host()).unwrap();
//! assert_eq!((h.shape(), h.strides()), (&[2, 2][..], &[1, 2][..]));
//! let y = handoff_torch::import(h).unwrap();
//! assert_eq!(y.data_ptr(), x.data_ptr());
//! assert!(y.equal(&x));
//! ```
//!
//! Call [`init`] (or any function of this crate) before the program's first
//! `tch::Cuda` query: it loads `libtorch_cuda.so`, which Rust's `--as-needed` linking
//! otherwise leaves out, so that PyTorch sees CUDA. The shim also does it when the
//! process starts. Set `HANDOFF_TORCH_NO_CUDA=1` to skip it.
#![warn(missing_docs)]

#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bare_calls;
pub mod cuda;
mod dtype;
mod error;
mod ffi;
#[cfg(feature = "cuda")]
pub mod graph;

pub use error::TorchError;

mod describe;
mod import;
mod tensor;

pub use describe::check;
pub use import::{ImportOptions, import, import_with};
pub use tensor::{CurrentStream, TorchTensor, export, export_from};

use handoff_runtime::{Device, Result, Stream};
use std::sync::OnceLock;

/// Loads `libtorch_cuda.so` (`RTLD_NOW | RTLD_GLOBAL`) once, so that PyTorch finds
/// CUDA; returns whether it is loaded. On CPU-only installs it is not, and everything
/// but CUDA works.
///
/// ```
/// let cuda_libs = handoff_torch::init();
/// if !cuda_libs { println!("{}", handoff_torch::cuda_load_error().unwrap_or_default()); }
/// ```
pub fn init() -> bool {
    loaded().is_ok()
}

/// Why `libtorch_cuda.so` could not be loaded (`None` when it is loaded).
pub fn cuda_load_error() -> Option<String> {
    loaded().clone().err()
}

/// Loads `libtorch_cuda.so` once; every later call only reads the outcome.
fn loaded() -> &'static std::result::Result<(), String> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let mut loaded = 0i32;
        // SAFETY: a valid out pointer; the shim catches every exception.
        let r = ffi::check("dlopen(libtorch_cuda.so)", unsafe { ffi::hf_load_torch_cuda(&mut loaded) });
        match (r, loaded) {
            (_, 1) => Ok(()),
            (Err(e), _) => Err(e.to_string()),
            (Ok(()), _) => Err("libtorch_cuda.so is not loaded".into()),
        }
    })
}

/// Whether the shim was compiled with PyTorch's CUDA stream and allocator support.
pub fn shim_has_cuda() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { ffi::hf_cuda_compiled() != 0 }
}

/// PyTorch's current stream of `device`: `None` for the host (CPU tensors are
/// host-ordered), the current CUDA stream of a CUDA device.
///
/// ```
/// assert!(handoff_torch::current_stream(handoff_runtime::Device::Host).unwrap().is_none());
/// ```
pub fn current_stream(device: Device) -> Result<Option<Stream>> {
    match device {
        Device::Host => Ok(None),
        #[cfg(feature = "cuda")]
        Device::Cuda(i) => cuda::current_stream(i).map(Some),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(TorchError::CudaFeatureOff { device }.into()),
        other => Err(TorchError::ImportDevice { device: other }.into()),
    }
}

fn probe() -> Vec<handoff_runtime::registry::Probe> {
    use handoff_runtime::registry::Probe;
    let mut lines = vec![Probe::found("libtorch", format!("tch {} (PyTorch 2.11) linked", "0.24.0"))];
    lines.push(match cuda_load_error() {
        None if tch::Cuda::is_available() => {
            Probe::found("libtorch CUDA", format!("{} CUDA device(s)", tch::Cuda::device_count()))
        }
        None => Probe::not_found("libtorch CUDA", "libtorch_cuda.so loaded, but PyTorch sees no CUDA device"),
        Some(why) => Probe::not_found("libtorch CUDA", why),
    });
    lines
}

handoff_runtime::registry::submit! {
    handoff_runtime::registry::Adapter::new("torch", env!("CARGO_PKG_VERSION"))
        .about("PyTorch tensors through tch 0.24 (PyTorch 2.11), CPU and CUDA")
        .devices(&[handoff_runtime::registry::DeviceKind::Host, handoff_runtime::registry::DeviceKind::Cuda])
        .dtypes(&dtype::DTYPES)
        .exports::<TorchTensor>()
        .imports::<TorchTensor>()
        .probe(probe)
}
