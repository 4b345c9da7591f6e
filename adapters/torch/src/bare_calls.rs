//! The bare shim calls of a hand-off, with nothing of handoff around them: what a
//! perfect PyTorch adapter could not avoid. The host-cost benchmark
//! (`examples/benches/pipeline_gpu.rs`) times them beside handoff's own paths and
//! prints handoff's share above them. Only with the `bench-internals` feature: not part of
//! the API (hidden, unstable).

use crate::error::TorchError;
use crate::{dtype, ffi, init};
use handoff_runtime::dtype::DataType;
use handoff_runtime::{Device, MAX_NDIM};
use std::ffi::c_void;
use std::mem::MaybeUninit;

/// The shim's describe of a tensor (data pointer, sizes, strides, dtype, device,
/// flags), with no checks: returns the data pointer.
pub fn describe(tensor: &tch::Tensor) -> Result<*mut c_void, TorchError> {
    let mut dims = [MaybeUninit::<i64>::uninit(); 2 * MAX_NDIM as usize];
    Ok(crate::describe::read_facts(tensor, 0, &mut dims)?.data)
}

/// The shim's `recordStream` of `tensor` on CUDA stream `raw` of device `ordinal`.
#[cfg(feature = "cuda")]
pub fn record_stream(tensor: &tch::Tensor, ordinal: u32, raw: u64) -> Result<(), TorchError> {
    let mut recorded = 0i32;
    // SAFETY: a live `at::Tensor*` and a live stream of its device.
    ffi::check("recordStream", unsafe {
        ffi::hf_cuda_record_stream(tensor.as_ptr() as *const c_void, ordinal as i32, raw, &mut recorded)
    })
}

unsafe extern "C" fn nothing_to_release(_ctx: *mut c_void) {}

/// The shim's `from_blob` of memory of `device` (host or CUDA), with a deleter that
/// does nothing.
///
/// # Safety
/// `data` must hold an array of `shape`, `strides` and `dtype` on that device, valid
/// for as long as the returned tensor and its views are used.
pub unsafe fn from_blob(
    data: *mut c_void,
    shape: &[i64],
    strides: &[i64],
    dtype: DataType,
    device: Device,
) -> Result<tch::Tensor, TorchError> {
    init();
    let (device_type, ordinal) = match device {
        Device::Host => (0, 0),
        Device::Cuda(ordinal) => (1, ordinal),
        other => return Err(TorchError::ImportDevice { device: other }),
    };
    let scalar_type = dtype::from_dlpack(dtype)
        .ok_or(TorchError::ImportDtype { dtype: handoff_runtime::dtype::name(dtype) })?;
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: forwarded from the caller; shape and strides hold ndim values each.
    ffi::check("from_blob", unsafe {
        ffi::hf_from_blob(
            data,
            shape.len() as i32,
            shape.as_ptr(),
            strides.as_ptr(),
            scalar_type,
            device_type,
            ordinal as i32,
            std::ptr::null_mut(),
            nothing_to_release,
            &mut out,
        )
    })?;
    // SAFETY: on success `out` is a heap `at::Tensor*` the shim gave up.
    Ok(unsafe { tch::Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
}
