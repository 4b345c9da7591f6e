//! The field types a derived tensor may use for its shape, strides, byte offset and
//! stream, and their conversions to and from a hand-off's values.

use crate::error::StorageError;
use crate::stream::Stream;
use std::borrow::Cow;

/// A field type that holds dimensions: a shape, or strides in elements.
///
/// Implemented for `Vec`, `Box<[_]>` and arrays of `i64`, `i32`, `u64`, `usize`.
pub trait Dims: Sized {
    /// The values as `i64`.
    ///
    /// # Errors
    /// [`StorageError::Overflow`] naming `field`.
    fn to_dims(&self, field: &'static str) -> Result<Cow<'_, [i64]>, StorageError>;
    /// The field from `i64` values (on import).
    ///
    /// # Errors
    /// [`StorageError::DoesNotFit`] or [`StorageError::Rank`] naming `field`.
    fn from_dims(dims: &[i64], field: &'static str) -> Result<Self, StorageError>;
}

/// A field type for strides: any [`Dims`] (always explicit), or an `Option` of one
/// (`None` = compact row-major; imports give `None` when compact).
pub trait StridesField: Sized {
    /// The strides, `None` for compact.
    ///
    /// # Errors
    /// [`StorageError::Overflow`].
    fn to_strides(&self, field: &'static str) -> Result<Option<Cow<'_, [i64]>>, StorageError>;
    /// The field from a hand-off's strides.
    ///
    /// # Errors
    /// As [`Dims::from_dims`].
    fn from_strides(strides: &[i64], compact: bool, field: &'static str) -> Result<Self, StorageError>;
}

fn fit<T: TryFrom<i64>>(v: i64, axis: usize, field: &'static str) -> Result<T, StorageError> {
    T::try_from(v).map_err(|_| StorageError::DoesNotFit {
        field,
        axis,
        value: v,
        ty: std::any::type_name::<T>(),
    })
}

macro_rules! dims_impls {
    ($($t:ty),*) => {$(
        impl Dims for Vec<$t> {
            fn to_dims(&self, field: &'static str) -> Result<Cow<'_, [i64]>, StorageError> {
                to_i64(&self[..], field)
            }
            fn from_dims(dims: &[i64], field: &'static str) -> Result<Self, StorageError> {
                dims.iter().enumerate().map(|(i, &d)| fit::<$t>(d, i, field)).collect()
            }
        }
        impl Dims for Box<[$t]> {
            fn to_dims(&self, field: &'static str) -> Result<Cow<'_, [i64]>, StorageError> {
                to_i64(&self[..], field)
            }
            fn from_dims(dims: &[i64], field: &'static str) -> Result<Self, StorageError> {
                Vec::<$t>::from_dims(dims, field).map(Vec::into_boxed_slice)
            }
        }
        impl<const N: usize> Dims for [$t; N] {
            fn to_dims(&self, field: &'static str) -> Result<Cow<'_, [i64]>, StorageError> {
                to_i64(&self[..], field)
            }
            fn from_dims(dims: &[i64], field: &'static str) -> Result<Self, StorageError> {
                let v = Vec::<$t>::from_dims(dims, field)?;
                v.try_into().map_err(|v: Vec<$t>| StorageError::Rank {
                    field, len: v.len(), expected: N, ty: std::any::type_name::<Self>(),
                })
            }
        }
        strides_impls!(Vec<$t>, Box<[$t]>);
        impl<const N: usize> StridesField for [$t; N] {
            fn to_strides(&self, field: &'static str) -> Result<Option<Cow<'_, [i64]>>, StorageError> {
                self.to_dims(field).map(Some)
            }
            fn from_strides(strides: &[i64], _: bool, field: &'static str) -> Result<Self, StorageError> {
                Self::from_dims(strides, field)
            }
        }
        impl<const N: usize> StridesField for Option<[$t; N]> {
            fn to_strides(&self, field: &'static str) -> Result<Option<Cow<'_, [i64]>>, StorageError> {
                self.as_ref().map(|s| s.to_dims(field)).transpose()
            }
            fn from_strides(strides: &[i64], compact: bool, field: &'static str) -> Result<Self, StorageError> {
                if compact { Ok(None) } else { <[$t; N]>::from_dims(strides, field).map(Some) }
            }
        }
    )*};
}

macro_rules! strides_impls {
    ($($t:ty),*) => {$(
        impl StridesField for $t {
            fn to_strides(&self, field: &'static str) -> Result<Option<Cow<'_, [i64]>>, StorageError> {
                self.to_dims(field).map(Some)
            }
            fn from_strides(strides: &[i64], _: bool, field: &'static str) -> Result<Self, StorageError> {
                Self::from_dims(strides, field)
            }
        }
        impl StridesField for Option<$t> {
            fn to_strides(&self, field: &'static str) -> Result<Option<Cow<'_, [i64]>>, StorageError> {
                self.as_ref().map(|s| s.to_dims(field)).transpose()
            }
            fn from_strides(strides: &[i64], compact: bool, field: &'static str) -> Result<Self, StorageError> {
                if compact { Ok(None) } else { <$t>::from_dims(strides, field).map(Some) }
            }
        }
    )*};
}

dims_impls!(i64, i32, u64, usize);

trait ToI64: Copy + std::fmt::Display {
    fn to_i64(self) -> Option<i64>;
}
macro_rules! to_i64_impls {
    ($($t:ty),*) => {$(
        impl ToI64 for $t {
            fn to_i64(self) -> Option<i64> { i64::try_from(self).ok() }
        }
    )*};
}
to_i64_impls!(i64, i32, u64, usize);

fn to_i64<'a, T: ToI64 + 'static>(v: &'a [T], field: &'static str) -> Result<Cow<'a, [i64]>, StorageError> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<i64>() {
        // SAFETY: `T` is `i64` (checked just above), so the slice is a slice of i64.
        let same = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<i64>(), v.len()) };
        return Ok(Cow::Borrowed(same));
    }
    v.iter()
        .enumerate()
        .map(|(axis, &x)| x.to_i64().ok_or(StorageError::Overflow { field, axis, value: x.to_string() }))
        .collect::<Result<Vec<i64>, _>>()
        .map(Cow::Owned)
}

/// A field type for the byte offset: `u64`, `usize` or `u32` (imports give 0: the
/// offset is folded into the adopted storage's pointer).
pub trait ByteOffsetField: Sized {
    /// The offset in bytes.
    ///
    /// # Errors
    /// [`StorageError::Overflow`].
    fn to_byte_offset(&self, field: &'static str) -> Result<u64, StorageError>;
    /// The field from an offset (on import).
    ///
    /// # Errors
    /// [`StorageError::DoesNotFit`].
    fn from_byte_offset(offset: u64, field: &'static str) -> Result<Self, StorageError>;
}

macro_rules! offset_impls {
    ($($t:ty),*) => {$(
        impl ByteOffsetField for $t {
            fn to_byte_offset(&self, field: &'static str) -> Result<u64, StorageError> {
                u64::try_from(*self).map_err(|_| StorageError::Overflow { field, axis: 0, value: self.to_string() })
            }
            fn from_byte_offset(offset: u64, field: &'static str) -> Result<Self, StorageError> {
                <$t>::try_from(offset).map_err(|_| StorageError::DoesNotFit {
                    field, axis: 0, value: offset.min(i64::MAX as u64) as i64, ty: stringify!($t),
                })
            }
        }
    )*};
}
offset_impls!(u64, usize, u32);

/// A field type for the stream the value's pending writes are on: [`Stream`] or
/// `Option<Stream>` (`None` = host-ordered).
pub trait StreamField: Sized {
    /// The stream, `None` for host-ordered.
    fn to_stream(&self) -> Option<Stream>;
    /// The field from the consumer stream of an import.
    fn from_stream(stream: &Stream) -> Self;
}

impl StreamField for Stream {
    fn to_stream(&self) -> Option<Stream> {
        Some(self.clone())
    }
    fn from_stream(stream: &Stream) -> Self {
        stream.clone()
    }
}

impl StreamField for Option<Stream> {
    fn to_stream(&self) -> Option<Stream> {
        self.clone()
    }
    fn from_stream(stream: &Stream) -> Self {
        if stream.is_host() { None } else { Some(stream.clone()) }
    }
}
