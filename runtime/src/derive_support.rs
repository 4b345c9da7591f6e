//! What `#[derive(DlpackExchange)]`'s generated code calls: hidden API
//! (`handoff::__private`), as serde and thiserror keep theirs. Not for hand-written code.

use crate::dtype::{self, DataType};
use crate::error::{Result, StorageError};
use crate::handoff::Handoff;
use crate::storage::Storage;
use crate::stream::Stream;
use crate::tensor_desc::TensorDesc;
use crate::validate::{byte_extent, is_compact};
use std::borrow::Cow;

/// Completes a derived type's description with its storage's memory (data pointer,
/// read-only), checking that the device is the storage's and that the tensor stays
/// inside the storage. What a derived `Export::describe` returns.
///
/// # Errors
/// [`StorageError::DeviceMismatch`] when `desc.device` is not [`Storage::device`];
/// an invalid dtype; [`StorageError::NegativeDimension`],
/// [`StorageError::StridesLength`], [`StorageError::OutOfBounds`].
pub fn describe<'a, S: Storage + ?Sized>(storage: &'a S, mut desc: TensorDesc<'a>) -> Result<TensorDesc<'a>> {
    // The pointer means host memory or device memory by where the storage put it; a
    // label cannot move it.
    if desc.device != storage.device() {
        return Err(StorageError::DeviceMismatch {
            field: "device",
            device: desc.device,
            storage: storage.device(),
        }
        .into());
    }
    dtype::check(desc.dtype)?;
    if let Some((axis, &value)) = desc.shape.iter().enumerate().find(|(_, d)| **d < 0) {
        return Err(StorageError::NegativeDimension { axis, value }.into());
    }
    let strides: Cow<'_, [i64]> = match &desc.strides {
        Some(s) if s.len() != desc.shape.len() => {
            return Err(
                StorageError::StridesLength { shape_len: desc.shape.len(), strides_len: s.len() }.into()
            );
        }
        Some(s) => Cow::Borrowed(&s[..]),
        None => Cow::Owned(
            dlpark::tensor::compact_strides(&desc.shape)
                .map_err(|_| crate::error::ValidationError::ShapeOverflow { shape: desc.shape.to_vec() })?,
        ),
    };
    let len = storage.byte_len();
    let out_of_bounds = |start: i128, end: i128| StorageError::OutOfBounds {
        shape: desc.shape.to_vec(),
        strides: strides.to_vec(),
        byte_offset: desc.byte_offset,
        dtype: dtype::name(desc.dtype),
        start,
        end,
        len,
    };
    let (lo, hi) =
        byte_extent(&desc.shape, &strides, desc.dtype).ok_or_else(|| out_of_bounds(i128::MIN, i128::MAX))?;
    let (start, end) =
        if hi == 0 { (0, 0) } else { (desc.byte_offset as i128 + lo, desc.byte_offset as i128 + hi) };
    if start < 0 || end > len as i128 {
        return Err(out_of_bounds(start, end).into());
    }
    drop(strides);
    desc.data = storage.data_ptr();
    desc.read_only = storage.read_only();
    Ok(desc)
}

/// Checks that `handoff` holds `expected` elements before a derived `Import` takes it.
///
/// # Errors
/// [`StorageError::Dtype`] naming `ty`.
pub fn expect_dtype(handoff: &Handoff, expected: DataType, ty: &'static str) -> Result<()> {
    if handoff.dtype() == expected {
        Ok(())
    } else {
        Err(StorageError::Dtype { ty, expected: dtype::name(expected), found: dtype::name(handoff.dtype()) }
            .into())
    }
}

/// Checks that `handoff` is compact before a derived `Import` without a strides field takes it.
///
/// # Errors
/// [`StorageError::NotCompact`] naming `ty`.
pub fn expect_compact(handoff: &Handoff, ty: &'static str) -> Result<()> {
    if handoff.is_contiguous() {
        Ok(())
    } else {
        Err(StorageError::NotCompact { ty, strides: handoff.strides().to_vec() }.into())
    }
}

/// What a derived `Import` keeps of a hand-off before its storage adopts it: the
/// hand-off's own description, whether it is compact, and its consumer stream.
pub fn received(handoff: &Handoff) -> (TensorDesc<'static>, bool, Stream) {
    let desc = handoff.desc().into_owned();
    let compact = is_compact(&desc.shape, desc.strides.as_deref().unwrap_or(&[]));
    (desc, compact, handoff.consumer_stream().clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::storage::{Dims, Elements, StridesField};
    use std::sync::Arc;

    fn layout(shape: &[i64], strides: Option<&[i64]>, byte_offset: u64) -> TensorDesc<'static> {
        let mut d = TensorDesc::new(std::ptr::null_mut(), Device::Host, DataType::F32, shape.to_vec());
        d.strides = strides.map(|s| s.to_vec().into());
        d.byte_offset = byte_offset;
        d
    }

    fn storage_err<T: std::fmt::Debug>(r: Result<T>) -> StorageError {
        match r {
            Err(crate::Error::Storage(e)) => *e,
            other => panic!("expected a storage error, got {other:?}"),
        }
    }

    #[test]
    fn describe_checks_the_extent() {
        let data = vec![0f32; 6];
        assert!(describe(&data, layout(&[2, 3], None, 0)).is_ok());
        assert!(describe(&data, layout(&[3, 2], Some(&[1, 3]), 0)).is_ok());
        assert!(describe(&data, layout(&[0, 100], None, 0)).is_ok());
        assert!(describe(&data, layout(&[5], None, 4)).is_ok());
        let e = storage_err(describe(&data, layout(&[6], None, 4)));
        assert!(matches!(e, StorageError::OutOfBounds { start: 4, end: 28, len: 24, .. }), "{e}");
        let e = storage_err(describe(&data, layout(&[2, -1], None, 0)));
        assert!(matches!(e, StorageError::NegativeDimension { axis: 1, value: -1 }), "{e}");
        let e = storage_err(describe(&data, layout(&[2, 3], Some(&[1]), 0)));
        assert!(matches!(e, StorageError::StridesLength { .. }), "{e}");
        let e = storage_err(describe(&data, layout(&[2], Some(&[-1]), 0)));
        assert!(matches!(e, StorageError::OutOfBounds { start: -4, .. }), "{e}");
    }

    #[test]
    fn dims_convert_both_ways_with_named_errors() {
        assert_eq!(vec![2usize, 3].to_dims("shape").unwrap().as_ref(), &[2, 3]);
        assert!(matches!(vec![1i64].to_dims("shape").unwrap(), Cow::Borrowed(_)));
        let e = vec![usize::MAX].to_dims("shape").unwrap_err();
        assert!(matches!(e, StorageError::Overflow { field: "shape", axis: 0, .. }), "{e}");
        assert_eq!(<[u64; 2]>::from_dims(&[4, 5], "shape").unwrap(), [4, 5]);
        let e = <[u64; 2]>::from_dims(&[4], "shape").unwrap_err();
        assert!(matches!(e, StorageError::Rank { len: 1, expected: 2, .. }), "{e}");
        let e = Vec::<u64>::from_dims(&[-4], "strides").unwrap_err();
        assert!(matches!(e, StorageError::DoesNotFit { field: "strides", value: -4, .. }), "{e}");
        assert_eq!(Option::<Vec<i64>>::from_strides(&[1], true, "strides").unwrap(), None);
        assert_eq!(Option::<Vec<i64>>::from_strides(&[2], false, "strides").unwrap(), Some(vec![2]));
    }

    #[test]
    fn describe_refuses_a_device_the_storage_is_not_on() {
        let data = vec![0f32; 4];
        let mut l = layout(&[4], None, 0);
        l.device = Device::Cuda(1);
        let e = storage_err(describe(&data, l));
        assert_eq!(
            e,
            StorageError::DeviceMismatch { field: "device", device: Device::Cuda(1), storage: Device::Host }
        );
        assert_eq!(
            e.to_string(),
            "device is cuda:1, but the storage's memory is on host; set device to host, or put the data in cuda:1 storage"
        );
        let empty = Elements::<f32>::from(Vec::new());
        assert_eq!(empty.as_slice(), Some(&[][..]));
    }

    #[test]
    fn arc_storage_is_read_only() {
        let a: Arc<[f32]> = Arc::from(vec![1.0f32; 4]);
        let d = describe(&a, layout(&[4], None, 0)).unwrap();
        assert!(d.read_only);
    }
}
