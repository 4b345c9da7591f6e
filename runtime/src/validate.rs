//! Validation of DLPack descriptors (rule 5), on top of dlpark's structural checks.
//!
//! Order matters: nothing behind a pointer is read before the scalar fields that
//! bound it (`ndim`) are known to be sane.

use crate::device::Device;
use crate::dtype::{self, DataType};
use crate::error::ValidationError;
use dlpark::DlpackFlags;
use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType, DLPackVersion, DLTensor};
use dlpark::tensor::Error as DlparkError;
use std::ffi::c_void;

/// The most dimensions a hand-off may have.
pub const MAX_NDIM: i32 = 64;

impl Device {
    /// The device a DLPack descriptor names, or [`ValidationError::UnsupportedDevice`]
    /// for device types handoff does not exchange (OpenCL, Vulkan, ROCm, ...).
    pub fn from_dlpack(device: DLDevice) -> Result<Device, ValidationError> {
        let unsupported = || ValidationError::UnsupportedDevice {
            device_type: device.device_type.0,
            device_id: device.device_id,
        };
        let ordinal = u32::try_from(device.device_id).map_err(|_| unsupported());
        match device.device_type {
            DLDeviceType::CPU | DLDeviceType::CUDAHOST => Ok(Device::Host),
            DLDeviceType::CUDA => Ok(Device::Cuda(ordinal?)),
            DLDeviceType::EXTDEV => Ok(Device::Mock(ordinal?)),
            _ => Err(unsupported()),
        }
    }
}

/// What a hand-off's DLPack tensor says of its memory: what [`check_parts`] checks and
/// `managed` lays out.
pub(crate) struct Parts<'a> {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub dtype: DLDataType,
    pub shape: &'a [i64],
    /// `None`, or strides that are compact, for compact memory: it then carries
    /// canonical compact strides (size-1 dimensions' strides rewritten), so that
    /// consumers comparing strides exactly accept it.
    pub strides: Option<&'a [i64]>,
    pub byte_offset: u64,
    pub flags: DlpackFlags,
}

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

/// Checks a foreign descriptor: its structure (the scalar fields, then what `ndim`
/// bounds behind the shape and strides pointers, read by dlpark), then its layout
/// ([`check_layout`]). `version` is `None` for the legacy ABI.
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
    let device = check_scalars(tensor.device, tensor.dtype, flags)?;
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
    let layout = Layout {
        shape: view.shape(),
        strides: view.strides(),
        dtype: tensor.dtype,
        data: tensor.data as usize,
        byte_offset: tensor.byte_offset,
        flags,
    };
    check_layout(&layout, access)?;
    Ok(Checked { device })
}

/// Checks a foreign tensor that is handed on, unread, to a consumer outside handoff
/// (host memory, which needs no ordering): every rule of an import
/// ([`Handoff::from_raw`](crate::Handoff::from_raw)) but the alignment of its data,
/// which that consumer judges as it would without handoff (JAX copies host memory it
/// cannot view, NumPy and PyTorch view it).
///
/// # Safety
/// `tensor.shape` and `tensor.strides`, when non-null, must point to `tensor.ndim`
/// readable `i64` each if `0 <= ndim <= MAX_NDIM`.
pub unsafe fn check_passed_on(
    tensor: &DLTensor,
    version: Option<DLPackVersion>,
    flags: DlpackFlags,
    access: Access,
) -> Result<(), ValidationError> {
    // SAFETY: forwarded from the caller.
    match unsafe { check(tensor, version, flags, access) } {
        Ok(_) | Err(ValidationError::Misaligned { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Checks a description handoff lays out itself (an adapter's [`TensorDesc`], or a
/// foreign tensor [`check`] has accepted, re-wrapped): the same rules as [`check`]
/// but the structural reading of a foreign `DLTensor`, which `managed::prepare` did
/// when it laid the shape and strides out (rank, negative dimensions, lengths).
/// Inlined into its one caller (on every hand-off's path), which passes the parts
/// it has just written.
///
/// [`TensorDesc`]: crate::TensorDesc
#[inline(always)]
pub(crate) fn check_parts(parts: &Parts<'_>, access: Access) -> Result<Checked, ValidationError> {
    let device = check_scalars(parts.device, parts.dtype, parts.flags)?;
    let layout = Layout {
        shape: parts.shape,
        strides: parts.strides,
        dtype: parts.dtype,
        data: parts.data as usize,
        byte_offset: parts.byte_offset,
        flags: parts.flags,
    };
    check_layout(&layout, access)?;
    Ok(Checked { device })
}

/// The flags, the device and the element type.
fn check_scalars(device: DLDevice, dtype: DataType, flags: DlpackFlags) -> Result<Device, ValidationError> {
    let known = DlpackFlags::READ_ONLY | DlpackFlags::IS_COPIED | DlpackFlags::IS_SUBBYTE_TYPE_PADDED;
    if !known.contains(flags) {
        return Err(ValidationError::UnknownFlags { flags: flags.bits() });
    }
    let device = Device::from_dlpack(device)?;
    dtype::check(dtype)?;
    // Every byte count of handoff and its adapters assumes packed sub-byte elements;
    // on whole-byte dtypes the flag changes nothing.
    if flags.contains(DlpackFlags::IS_SUBBYTE_TYPE_PADDED) && dtype.bits < 8 {
        return Err(ValidationError::SubbytePadded { dtype: dtype::name(dtype), bits: dtype.bits });
    }
    Ok(device)
}

/// What a description says of its memory. `shape` has no negative dimension and
/// `strides`, when given, as many values (checked before).
struct Layout<'a> {
    shape: &'a [i64],
    /// `None`: compact, row-major.
    strides: Option<&'a [i64]>,
    dtype: DataType,
    data: usize,
    byte_offset: u64,
    flags: DlpackFlags,
}

/// The rules on the memory a layout reaches: its counts fit, its data pointer is
/// there, aligned, and every byte it reaches is an address; and, for a writer, it is
/// writable and no element is reached twice.
fn check_layout(l: &Layout<'_>, access: Access) -> Result<(), ValidationError> {
    let (shape, dtype) = (l.shape, l.dtype);
    let overflow = || ValidationError::ShapeOverflow { shape: shape.to_vec() };
    // The dimensions must multiply within isize even when another is 0 (an empty
    // tensor): what every consumer indexes, and the same whatever the order.
    let nonzero = shape.iter().filter(|&&d| d != 0).try_fold(1usize, |a, &d| a.checked_mul(d as usize));
    let nonzero = nonzero.filter(|&n| n <= isize::MAX as usize).ok_or_else(overflow)?;
    let elements = if shape.contains(&0) { 0 } else { nonzero };
    let bits = u128::from(dtype.bits) * u128::from(dtype.lanes);
    if (elements as u128 * bits).div_ceil(8) > isize::MAX as u128 {
        return Err(overflow());
    }
    if elements > 0
        && let Some(strides) = l.strides
    {
        // The furthest element from the start, in elements, either way. Compact
        // strides span exactly the elements, already bounded above.
        let span: i128 = shape.iter().zip(strides).map(|(&d, &s)| (d as i128 - 1) * (s as i128).abs()).sum();
        if (span + 1) * dtype.element_size() as i128 > isize::MAX as i128 {
            return Err(ValidationError::ExtentOverflow {
                shape: shape.to_vec(),
                strides: strides.to_vec(),
                dtype: dtype::name(dtype),
            });
        }
    }
    let (data, byte_offset) = (l.data, l.byte_offset);
    if data == 0 && elements > 0 {
        return Err(ValidationError::NullData { elements });
    }
    if data == 0 && byte_offset != 0 {
        return Err(ValidationError::NullDataOffset { byte_offset });
    }
    let start = usize::try_from(byte_offset).ok().and_then(|o| data.checked_add(o));
    let Some(start) = start else {
        return Err(ValidationError::ByteOffsetOverflow { data, byte_offset });
    };
    if elements > 0 {
        // Compact memory reaches its packed bytes from the first element on.
        let extent = match l.strides {
            Some(strides) => byte_extent(shape, strides, dtype),
            None => Some((0, (elements as u128 * bits).div_ceil(8) as i128)),
        };
        // Bounded by the extent check above (at most isize::MAX bytes either way).
        let extent = extent.and_then(|(lo, hi)| Some((i64::try_from(lo).ok()?, u64::try_from(hi).ok()?)));
        let outside = |first_byte: i64, end_byte: u64| ValidationError::OutsideAddressSpace {
            data,
            byte_offset,
            shape: shape.to_vec(),
            strides: l.strides.map_or_else(|| compact_strides(shape), <[i64]>::to_vec),
            first_byte,
            end_byte,
        };
        let Some((lo, hi)) = extent else {
            return Err(outside(i64::MIN, u64::MAX));
        };
        // One past the last byte must be an address too, as for any Rust allocation.
        let (first, end) = (start as i128 + lo as i128, start as i128 + hi as i128);
        if first < 0 || end > usize::MAX as i128 {
            return Err(outside(lo, hi));
        }
    }
    if access == Access::Write && l.flags.contains(DlpackFlags::READ_ONLY) {
        return Err(ValidationError::ReadOnly);
    }
    if access == Access::Write
        && let Some(strides) = l.strides
        && !is_non_overlapping(shape, strides)
    {
        return Err(ValidationError::OverlappingWrite { shape: shape.to_vec(), strides: strides.to_vec() });
    }
    // Last, so that a tensor refused only for it passes every other rule
    // ([`check_passed_on`]).
    let align = dtype::alignment(dtype);
    // A mask for the powers of two every checked dtype has: a division by a divisor
    // known only at run time costs more than the rest of these checks together.
    let offset = if align.is_power_of_two() { start & (align - 1) } else { start % align };
    if offset != 0 {
        return Err(ValidationError::Misaligned { data, byte_offset, align, dtype: dtype::name(dtype) });
    }
    Ok(())
}

/// Row-major compact strides of `shape` (for messages; saturating).
fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    strides
}

/// Whether `strides` (in elements) lay `shape` out compact and row-major, as DLPack
/// and PyTorch read it: the stride of a dimension of size 1 does not matter (it is
/// never stepped), nor does any stride of a tensor with no elements. Shape and
/// strides of different lengths, or a negative dimension, are not compact.
///
/// This is the one compactness rule of handoff: [`Handoff::is_contiguous`], the
/// derived `Import` of types without a strides field, and every adapter's check
/// through `is_contiguous` follow it.
///
/// [`Handoff::is_contiguous`]: crate::Handoff::is_contiguous
///
/// ```
/// use handoff_runtime::storage::is_compact;
/// assert!(is_compact(&[2, 3], &[3, 1]));
/// assert!(is_compact(&[8, 1], &[1, 8])); // torch.ones(1, 8).t()
/// assert!(is_compact(&[0, 3], &[7, 5])); // no elements
/// assert!(is_compact(&[], &[])); // a scalar
/// assert!(!is_compact(&[2, 3], &[1, 2]));
/// ```
pub fn is_compact(shape: &[i64], strides: &[i64]) -> bool {
    if shape.len() != strides.len() || shape.iter().any(|&d| d < 0) {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    // The stride the next dimension (walking from the last) must have; `None` once
    // it no longer fits in i64 (then no stepped dimension can match it).
    let mut expected = Some(1i64);
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d == 1 {
            continue;
        }
        if expected != Some(s) {
            return false;
        }
        expected = expected.and_then(|e| e.checked_mul(d));
    }
    true
}

/// Whether no element of `shape` laid out with `strides` (in elements) is reached
/// from two different indices. A sufficient test, cheap and sound: dimensions of
/// size > 1, sorted by |stride|, must each step further than all the smaller ones
/// together reach. It refuses broadcasts (stride 0 on a dimension of size > 1) and
/// interleavings such as shape `[2, 2]` strides `[1, 1]`; it may refuse some exotic
/// layouts that do not overlap, never accepts one that does.
pub(crate) fn is_non_overlapping(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut dims: Vec<(u128, u128)> = shape
        .iter()
        .zip(strides)
        .filter(|&(&d, _)| d > 1)
        .map(|(&d, &s)| (u128::from(s.unsigned_abs()), d as u128))
        .collect();
    dims.sort_unstable();
    // The furthest element the dimensions so far reach from the first, in elements.
    let mut reach: u128 = 0;
    for (stride, d) in dims {
        if stride <= reach {
            return false;
        }
        reach = reach.saturating_add(stride.saturating_mul(d - 1));
    }
    true
}

/// The bytes the elements of `shape` with `strides` (in elements) of `dtype` reach,
/// relative to the first element's address: `(start, end)` with `start <= 0` the
/// lowest byte and `end` one past the highest; `(0, 0)` when there are no elements;
/// `None` when the sums overflow. Sub-byte elements are packed.
pub(crate) fn byte_extent(shape: &[i64], strides: &[i64], dtype: DataType) -> Option<(i128, i128)> {
    if shape.contains(&0) {
        return Some((0, 0));
    }
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&d, &s) in shape.iter().zip(strides) {
        let step = (i128::from(d) - 1).checked_mul(i128::from(s))?;
        if step < 0 {
            lo = lo.checked_add(step)?;
        } else {
            hi = hi.checked_add(step)?;
        }
    }
    let bits = i128::from(dtype.bits) * i128::from(dtype.lanes);
    // Elements to bytes, rounding away from the first element: the byte holding the
    // lowest element's first bit, and one past the byte holding the last bit.
    let to_bytes = |e: i128| -> Option<i128> {
        let b = e.checked_mul(bits)?;
        Some(if b < 0 { -((-b + 7) / 8) } else { (b + 7) / 8 })
    };
    Some((to_bytes(lo)?, to_bytes(hi.checked_add(1)?)?))
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
            shape: if tensor.shape.is_null() || tensor.ndim <= 0 {
                Vec::new()
            } else {
                // SAFETY: only reached after dlpark read the shape successfully (a
                // null one is handled above): `ndim` readable values.
                unsafe { std::slice::from_raw_parts(tensor.shape, tensor.ndim as usize) }.to_vec()
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_unknown_devices() {
        for d in [Device::Host, Device::Cuda(0), Device::Cuda(7), Device::Mock(2)] {
            assert_eq!(Device::from_dlpack(d.to_dlpack()).unwrap(), d);
        }
        let vulkan = DLDevice { device_type: DLDeviceType::VULKAN, device_id: 0 };
        assert!(matches!(
            Device::from_dlpack(vulkan),
            Err(ValidationError::UnsupportedDevice { device_type: 7, device_id: 0 })
        ));
        let negative = DLDevice::cuda(-1);
        assert!(matches!(
            Device::from_dlpack(negative),
            Err(ValidationError::UnsupportedDevice { device_type: 2, device_id: -1 })
        ));
    }

    #[test]
    fn compactness_ignores_size_one_and_empty_strides() {
        assert!(is_compact(&[], &[]));
        assert!(is_compact(&[2, 3, 4], &[12, 4, 1]));
        assert!(is_compact(&[8, 1], &[1, 8]));
        assert!(is_compact(&[1, 1], &[-5, 0]));
        assert!(is_compact(&[3, 1, 2], &[2, 1000, 1]));
        assert!(is_compact(&[0, 2], &[1, 1]));
        assert!(!is_compact(&[2, 3], &[1, 2]));
        assert!(!is_compact(&[3, 1, 2], &[3, 1, 1]));
        assert!(!is_compact(&[2], &[1, 1]), "lengths differ");
        assert!(!is_compact(&[-1, 0], &[1, 1]), "negative dimension");
        // The expected stride overflows only after the first dimension: still compact.
        assert!(is_compact(&[1 << 42, 1 << 22], &[1 << 22, 1]));
        // It overflows before a stepped dimension: nothing matches.
        assert!(!is_compact(&[2, 1 << 40, 1 << 40], &[i64::MAX, 1 << 40, 1]));
    }

    #[test]
    fn overlap_is_found_for_broadcasts_and_interleavings() {
        for (shape, strides) in [
            (&[4i64][..], &[0i64][..]),
            (&[2, 2], &[1, 1]),
            (&[3, 2], &[1, 2]),
            (&[2, 2], &[-1, 1]),
            (&[2, 3], &[2, 1]),
        ] {
            assert!(!is_non_overlapping(shape, strides), "{shape:?} {strides:?}");
        }
        for (shape, strides) in [
            (&[][..], &[][..]),
            (&[4i64][..], &[1i64][..]),
            (&[1], &[0]),
            (&[2, 2], &[1, 2]),
            (&[2, 2], &[-2, 1]),
            (&[2, 3], &[3, 1]),
            (&[2, 3], &[2, 3]),
            (&[3, 0], &[0, 0]),
            (&[2, 2], &[i64::MAX, i64::MIN]),
        ] {
            assert!(is_non_overlapping(shape, strides), "{shape:?} {strides:?}");
        }
    }

    #[test]
    fn byte_extents_round_away_from_the_first_element() {
        assert_eq!(byte_extent(&[2, 3], &[3, 1], DataType::F32), Some((0, 24)));
        assert_eq!(byte_extent(&[2], &[-1], DataType::F32), Some((-4, 4)));
        assert_eq!(byte_extent(&[0, 9], &[-9, 1], DataType::F32), Some((0, 0)));
        // Packed fp4: 3 elements are 12 bits, 2 bytes; one step back is the byte before.
        assert_eq!(byte_extent(&[3], &[1], DataType::F4E2M1FN), Some((0, 2)));
        assert_eq!(byte_extent(&[2], &[-1], DataType::F4E2M1FN), Some((-1, 1)));
        assert_eq!(byte_extent(&[i64::MAX; 64], &[i64::MAX; 64], DataType::C128), None);
        assert_eq!(byte_extent(&[i64::MAX], &[i64::MAX], DataType::C128), None);
    }
}
