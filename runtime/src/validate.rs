//! Validation of DLPack descriptors (rule 5), on top of dlpark's structural checks.
//!
//! Order matters: nothing behind a pointer is read before the scalar fields that
//! bound it (`ndim`) are known to be sane.

use crate::device::Device;
use crate::dtype;
use crate::error::ValidationError;
use dlpark::DlpackFlags;
use dlpark::ffi::{DLPackVersion, DLTensor};
use dlpark::tensor::Error as DlparkError;

/// The most dimensions a hand-off may have.
pub const MAX_NDIM: i32 = 64;

/// Whether an importer means to write through the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Read only: `READ_ONLY` tensors are accepted.
    #[default]
    Read,
    /// Read and write: `READ_ONLY` tensors are refused.
    Write,
}

/// The facts a validated descriptor yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checked {
    pub device: Device,
}

/// Checks a descriptor. `version` is `None` for the legacy ABI.
///
/// # Safety
/// `tensor.shape` and `tensor.strides`, when non-null, must point to `tensor.ndim`
/// readable `i64` each if `0 <= ndim <= MAX_NDIM`.
pub(crate) unsafe fn check(
    tensor: &DLTensor,
    version: Option<DLPackVersion>,
    flags: DlpackFlags,
    access: Access,
) -> Result<Checked, ValidationError> {
    let known = DlpackFlags::READ_ONLY | DlpackFlags::IS_COPIED | DlpackFlags::IS_SUBBYTE_TYPE_PADDED;
    if !known.contains(flags) {
        return Err(ValidationError::UnknownFlags { flags: flags.bits() });
    }
    let device = Device::from_dlpack(tensor.device)?;
    dtype::check(tensor.dtype)?;
    if tensor.ndim < 0 {
        return Err(ValidationError::NegativeNdim { ndim: tensor.ndim });
    }
    if tensor.ndim > MAX_NDIM {
        return Err(ValidationError::TooManyDims { ndim: tensor.ndim, max: MAX_NDIM });
    }
    if let Some(v) = version
        && v.supports(DLPackVersion { major: 1, minor: 2 })
        && tensor.ndim != 0
        && tensor.strides.is_null()
    {
        return Err(ValidationError::StridesRequired { major: v.major, minor: v.minor, ndim: tensor.ndim });
    }
    // SAFETY: ndim is within bounds and the caller vouches for the pointers.
    let view = unsafe { dlpark::tensor::TensorRef::from_raw(tensor) }.map_err(|e| from_dlpark(e, tensor))?;
    let shape = view.shape();
    let elements = view.num_elements();
    if view.num_bytes() > isize::MAX as usize {
        return Err(ValidationError::ShapeOverflow { shape: shape.to_vec() });
    }
    if elements > 0 {
        // The furthest element from the start, in elements, either way. Null strides
        // (compact) span exactly the elements, already bounded above.
        if let Some(strides) = view.strides() {
            let span: i128 =
                shape.iter().zip(strides).map(|(&d, &s)| (d as i128 - 1) * (s as i128).abs()).sum();
            if (span + 1) * tensor.dtype.element_size() as i128 > isize::MAX as i128 {
                return Err(ValidationError::ExtentOverflow {
                    shape: shape.to_vec(),
                    strides: strides.to_vec(),
                    dtype: dtype::name(tensor.dtype),
                });
            }
        }
    }
    let data = tensor.data as usize;
    if data == 0 && elements > 0 {
        return Err(ValidationError::NullData { elements });
    }
    let byte_offset = tensor.byte_offset;
    let start = usize::try_from(byte_offset).ok().and_then(|o| data.checked_add(o));
    let Some(start) = start else {
        return Err(ValidationError::ByteOffsetOverflow { data, byte_offset });
    };
    let align = dtype::alignment(tensor.dtype);
    if data != 0 && start % align != 0 {
        return Err(ValidationError::Misaligned {
            data,
            byte_offset,
            align,
            dtype: dtype::name(tensor.dtype),
        });
    }
    if access == Access::Write && flags.contains(DlpackFlags::READ_ONLY) {
        return Err(ValidationError::ReadOnly);
    }
    Ok(Checked { device })
}

fn from_dlpark(e: DlparkError, tensor: &DLTensor) -> ValidationError {
    match e {
        DlparkError::NegativeNdim { ndim } => ValidationError::NegativeNdim { ndim },
        DlparkError::NullShapePtr { ndim } => ValidationError::NullShape { ndim },
        DlparkError::NegativeDimension { axis, value } => ValidationError::NegativeDimension { axis, value },
        DlparkError::ZeroDtypeBits | DlparkError::ZeroDtypeLanes => ValidationError::UnsupportedDtype {
            code: tensor.dtype.code.0,
            bits: tensor.dtype.bits,
            lanes: tensor.dtype.lanes,
        },
        // The remaining structural failures are all counts that overflow.
        _ => ValidationError::ShapeOverflow {
            // SAFETY: only reached after dlpark read the shape successfully or
            // found it null; a null shape gives an empty list here.
            shape: if tensor.shape.is_null() || tensor.ndim <= 0 {
                Vec::new()
            } else {
                unsafe { std::slice::from_raw_parts(tensor.shape, tensor.ndim as usize) }.to_vec()
            },
        },
    }
}
