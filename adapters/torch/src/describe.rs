//! Reading a tensor through the shim: everything an export needs, once, with clear
//! refusals of what DLPack cannot describe.

use crate::error::TorchError;
use crate::{dtype, ffi};
use handoff_runtime::dtype::DataType;
use handoff_runtime::{Device, Dims, MAX_NDIM, TensorDesc};
use std::ffi::c_void;
use std::mem::MaybeUninit;

/// What an export needs of a tensor, read once: its shape and strides kept inline
/// (no allocation up to rank 8).
pub(crate) struct Described {
    pub data: *mut c_void,
    pub device: Device,
    pub dtype: DataType,
    pub shape: Dims,
    pub strides: Dims,
    /// PyTorch's current stream of the tensor's CUDA device (raw), when it was asked
    /// for ([`describe_for_export`]).
    pub current_stream: Option<u64>,
}

// SAFETY: a description only: `data` is an address, never dereferenced through it.
unsafe impl Send for Described {}

impl Described {
    /// The description, borrowing the shape and strides.
    pub fn desc(&self) -> TensorDesc<'_> {
        TensorDesc::new(self.data, self.device, self.dtype, &self.shape[..]).with_strides(&self.strides[..])
    }

    /// The description, owning its shape and strides.
    pub fn into_desc(self) -> TensorDesc<'static> {
        self.desc().into_owned()
    }
}

/// Reads and checks everything an export needs; refuses what DLPack cannot describe.
pub(crate) fn describe_tensor(tensor: &tch::Tensor) -> std::result::Result<Described, TorchError> {
    describe_with(tensor, 0)
}

/// [`describe_tensor`], with PyTorch's current stream of a CUDA tensor's device read
/// in the same shim call.
pub(crate) fn describe_for_export(tensor: &tch::Tensor) -> std::result::Result<Described, TorchError> {
    describe_with(tensor, ffi::DESCRIBE_STREAM)
}

/// Inlined into its callers: the description it returns is then written where the
/// caller keeps it, not copied there through the stack (which stalls on the stores
/// just made, on every export).
#[inline(always)]
fn describe_with(tensor: &tch::Tensor, what: i32) -> std::result::Result<Described, TorchError> {
    let mut dims = [MaybeUninit::<i64>::uninit(); 2 * MAX_NDIM as usize];
    let facts = read_facts(tensor, what, &mut dims)?;
    let (shape, strides) = dims.split_at(MAX_NDIM as usize);
    if facts.defined == 0 {
        return Err(TorchError::Undefined);
    }
    let dtype = dtype::to_dlpack(facts.scalar_type);
    let device = match (facts.device_type, u32::try_from(facts.device_index)) {
        (0, _) => Some(Device::Host),
        (1, Ok(i)) => Some(Device::Cuda(i)),
        _ => None,
    };
    let (Some(dtype), Some(device), 0) = (dtype, device, facts.layout) else {
        return Err(refusal(tensor, facts.scalar_type));
    };
    if facts.ndim > MAX_NDIM || facts.ndim < 0 {
        return Err(TorchError::TooManyDims { ndim: facts.ndim, max: MAX_NDIM });
    }
    let ndim = facts.ndim as usize;
    // SAFETY: the shim wrote `ndim` (<= MAX_NDIM) values to each buffer.
    let (shape, strides) = unsafe { (init(&shape[..ndim]), init(&strides[..ndim])) };
    if facts.requires_grad != 0 {
        return Err(TorchError::RequiresGrad { shape: shape.to_vec() });
    }
    if facts.is_conj != 0 {
        return Err(TorchError::Conjugate);
    }
    if facts.is_neg != 0 {
        return Err(TorchError::Negative);
    }
    let current_stream = (facts.has_stream == 1).then_some(facts.stream);
    Ok(Described { data: facts.data, device, dtype, shape, strides, current_stream })
}

/// The values of a written buffer.
///
/// # Safety
/// Every value of `written` must have been initialized.
unsafe fn init(written: &[MaybeUninit<i64>]) -> Dims {
    // SAFETY: forwarded from the caller; `MaybeUninit<i64>` has `i64`'s layout.
    Dims::from(unsafe { std::slice::from_raw_parts(written.as_ptr() as *const i64, written.len()) })
}

/// Why a tensor whose layout, dtype or device DLPack cannot carry is refused, with
/// PyTorch's names of them (asked of the shim again, now with names).
fn refusal(tensor: &tch::Tensor, scalar_type: i32) -> TorchError {
    let mut dims = [MaybeUninit::<i64>::uninit(); 2 * MAX_NDIM as usize];
    let facts = match read_facts(tensor, ffi::DESCRIBE_NAMES, &mut dims) {
        Ok(facts) => facts,
        Err(e) => return e,
    };
    if facts.layout != 0 {
        return TorchError::NotStrided { layout: ffi::name(&facts.layout_name) };
    }
    if dtype::to_dlpack(scalar_type).is_none() {
        return TorchError::UnsupportedDtype {
            dtype: ffi::name(&facts.dtype_name),
            hint: dtype::hint(scalar_type),
        };
    }
    TorchError::UnsupportedDevice { device: ffi::name(&facts.device_name) }
}

/// The shim's facts of `tensor`, with what the `ffi::DESCRIBE_*` bits of `what` ask
/// for; its sizes written to the first `MAX_NDIM` values of `dims` and its strides to
/// the others (`ndim` of each, when `ndim <= MAX_NDIM`).
pub(crate) fn read_facts(
    tensor: &tch::Tensor,
    what: i32,
    dims: &mut [MaybeUninit<i64>; 2 * MAX_NDIM as usize],
) -> std::result::Result<ffi::TensorFacts, TorchError> {
    let mut facts = ffi::TensorFacts::default();
    let (shape, strides) = dims.split_at_mut(MAX_NDIM as usize);
    // SAFETY: `as_ptr` is a live `at::Tensor*` for as long as `tensor`; the buffers
    // have room for `MAX_NDIM` values each; the shim catches every exception.
    ffi::check("describe", unsafe {
        ffi::hf_describe(
            tensor.as_ptr() as *const c_void,
            &mut facts,
            shape.as_mut_ptr() as *mut i64,
            strides.as_mut_ptr() as *mut i64,
            MAX_NDIM,
            what,
        )
    })?;
    Ok(facts)
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
