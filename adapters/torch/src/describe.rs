//! Reading a tensor through the shim: everything an export needs, once, with clear
//! refusals of what DLPack cannot describe.

use crate::error::TorchError;
use crate::{dtype, ffi};
use handoff_runtime::{Device, MAX_NDIM, TensorDesc};
use std::ffi::c_void;

/// Reads and checks everything an export needs; refuses what DLPack cannot describe.
pub(crate) fn describe_tensor(tensor: &tch::Tensor) -> std::result::Result<TensorDesc<'static>, TorchError> {
    let mut facts = ffi::TensorFacts::default();
    let (mut shape, mut strides) = ([0i64; MAX_NDIM as usize], [0i64; MAX_NDIM as usize]);
    // SAFETY: `as_ptr` is a live `at::Tensor*` for as long as `tensor`; the buffers
    // hold `cap` values each; the shim catches every exception.
    ffi::check("describe", unsafe {
        ffi::hf_describe(
            tensor.as_ptr() as *const c_void,
            &mut facts,
            shape.as_mut_ptr(),
            strides.as_mut_ptr(),
            MAX_NDIM,
        )
    })?;
    if facts.defined == 0 {
        return Err(TorchError::Undefined);
    }
    if facts.layout != 0 {
        return Err(TorchError::NotStrided { layout: ffi::name(&facts.layout_name) });
    }
    let Some(dtype) = dtype::to_dlpack(facts.scalar_type) else {
        return Err(TorchError::UnsupportedDtype {
            dtype: ffi::name(&facts.dtype_name),
            hint: dtype::hint(facts.scalar_type),
        });
    };
    let device = match (facts.device_type, u32::try_from(facts.device_index)) {
        (0, _) => Device::Host,
        (1, Ok(i)) => Device::Cuda(i),
        _ => return Err(TorchError::UnsupportedDevice { device: ffi::name(&facts.device_name) }),
    };
    if facts.ndim > MAX_NDIM || facts.ndim < 0 {
        return Err(TorchError::TooManyDims { ndim: facts.ndim, max: MAX_NDIM });
    }
    let ndim = facts.ndim as usize;
    let (shape, strides) = (shape[..ndim].to_vec(), strides[..ndim].to_vec());
    if facts.requires_grad != 0 {
        return Err(TorchError::RequiresGrad { shape });
    }
    if facts.is_conj != 0 {
        return Err(TorchError::Conjugate);
    }
    if facts.is_neg != 0 {
        return Err(TorchError::Negative);
    }
    Ok(TensorDesc::new(facts.data, device, dtype, shape).with_strides(strides))
}

/// Checks that `tensor` can be exported, returning why not.
///
/// ```
/// use handoff_torch::{check, TorchError};
/// let x = tch::Tensor::ones([2], (tch::Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
/// assert!(matches!(check(&x), Err(TorchError::RequiresGrad { .. })));
/// assert!(check(&x.detach()).is_ok());
/// ```
pub fn check(tensor: &tch::Tensor) -> std::result::Result<(), TorchError> {
    describe_tensor(tensor).map(drop)
}
