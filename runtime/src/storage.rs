//! Storage for your own tensor types: what `#[derive(DlpackExchange)]` builds on.
//!
//! - [`Storage`]: memory that gives a pointer and a device, and stays alive (at the
//!   same address) as long as the value does. Implemented for `Vec<T>`, `Box<[T]>`,
//!   `Arc<[T]>` and [`Buffer<T>`].
//! - [`Typed`]: storage that knows its element type, so the dtype can come from it.
//! - [`Adopt`]: storage that can take foreign memory in from a [`Handoff`] (a
//!   derived type gets `Import` when its storage can adopt). [`Buffer<T>`] can.
//! - [`Dims`], [`StridesField`], [`ByteOffsetField`], [`StreamField`]: the field types
//!   a derived type may use for its shape, strides, byte offset and stream.
//! - [`describe`], [`expect_dtype`], [`Received`]: what the generated code calls.
//! - [`is_compact`]: handoff's one compactness rule (strides of size-1 dimensions,
//!   and of empty tensors, do not matter).
//!
//! ```
//! use handoff_runtime::storage::Buffer;
//! let b = Buffer::from(vec![1.0f32, 2.0, 3.0]);
//! assert_eq!(b.as_slice(), Some(&[1.0, 2.0, 3.0][..]));
//! ```

use crate::device::Device;
use crate::dtype::{self, DataType, Element};
use crate::error::Result;
use crate::handoff::{Handoff, TensorDesc};
use crate::stream::Stream;
use crate::validate::byte_extent;
pub use crate::validate::is_compact;
use std::borrow::Cow;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

/// Memory a tensor's elements live in.
///
/// # Safety
/// [`data_ptr`](Storage::data_ptr) must point to [`byte_len`](Storage::byte_len)
/// bytes of [`device`](Storage::device) memory that stay valid, at the same address,
/// for as long as the value lives — also after the value is moved (heap memory, not
/// an inline array). Consumers may write through it unless
/// [`read_only`](Storage::read_only) is true.
pub unsafe trait Storage: Send + 'static {
    /// The base address.
    fn data_ptr(&self) -> *mut c_void;
    /// How many bytes from `data_ptr` belong to it.
    fn byte_len(&self) -> usize;
    /// Where the memory lives (host memory by default).
    fn device(&self) -> Device {
        Device::Host
    }
    /// Whether consumers must not write (shared memory such as `Arc<[T]>`).
    fn read_only(&self) -> bool {
        false
    }
}

/// Storage that knows its element type: a derived type with no `dtype` field and no
/// `#[dlpack(dtype = ...)]` takes its dtype from here.
#[diagnostic::on_unimplemented(
    message = "the storage `{Self}` does not say its element type",
    label = "the dtype cannot come from this storage",
    note = "add `#[dlpack(dtype = f32)]` on the struct, or a field `#[dlpack(dtype)] dtype: handoff::dtype::DataType`"
)]
pub trait Typed: Storage {
    /// The element type.
    type Elem: Element;
}

/// Storage that can take foreign memory in: the derived type's `Import` calls it.
#[diagnostic::on_unimplemented(
    message = "the storage `{Self}` cannot adopt foreign memory, so this type does not implement `Import`",
    label = "this storage cannot view another framework's memory",
    note = "use `handoff::storage::Buffer<T>` as the `#[dlpack(data)]` field to import into this type"
)]
pub trait Adopt: Storage + Sized {
    /// Takes `handoff`'s memory in, from its first element (`data + byte_offset`).
    /// Keeps the hand-off (and so the producer's memory) until dropped.
    ///
    /// # Errors
    /// [`StorageError`] when the elements do not fit this storage.
    fn adopt(handoff: Handoff) -> Result<Self>;
}

/// Why storage or a derived type's fields were refused. Each variant names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// A dimension or stride does not fit in `i64`.
    #[error("{field}[{axis}] is {value}: it does not fit in i64")]
    Overflow {
        /// The field (`shape`, `strides`).
        field: &'static str,
        /// The axis.
        axis: usize,
        /// The value.
        value: String,
    },
    /// A dimension or stride does not fit in the field's type on import.
    #[error("{field}[{axis}] is {value}: it does not fit in the field's type `{ty}`")]
    DoesNotFit {
        /// The field.
        field: &'static str,
        /// The axis (0 for scalars such as `byte_offset`).
        axis: usize,
        /// The value.
        value: i64,
        /// The field's type.
        ty: &'static str,
    },
    /// A fixed-size field has the wrong length on import.
    #[error("{field} has {len} dimensions but its type `{ty}` holds {expected}")]
    Rank {
        /// The field.
        field: &'static str,
        /// The hand-off's number of dimensions.
        len: usize,
        /// The field's length.
        expected: usize,
        /// The field's type.
        ty: &'static str,
    },
    /// A dimension is negative.
    #[error("shape[{axis}] is {value}: dimensions must be >= 0")]
    NegativeDimension {
        /// The axis.
        axis: usize,
        /// The value.
        value: i64,
    },
    /// Shape and strides differ in length.
    #[error("shape has {shape_len} dimensions but strides has {strides_len}; give one stride per dimension")]
    StridesLength {
        /// The shape's length.
        shape_len: usize,
        /// The strides' length.
        strides_len: usize,
    },
    /// The tensor reaches outside its storage.
    #[error(
        "shape {shape:?} with strides {strides:?} and byte_offset {byte_offset} of {dtype} spans bytes \
         {start}..{end}, but the storage holds {len} bytes; make the shape fit the data"
    )]
    OutOfBounds {
        /// The shape.
        shape: Vec<i64>,
        /// The strides (compact ones when none were given).
        strides: Vec<i64>,
        /// The byte offset.
        byte_offset: u64,
        /// The dtype's name.
        dtype: String,
        /// The first byte reached.
        start: i128,
        /// One past the last byte reached.
        end: i128,
        /// The storage's length in bytes.
        len: usize,
    },
    /// The hand-off's dtype is not the one the type holds.
    #[error("dtype is {found}, but `{ty}` holds {expected}; convert the tensor to {expected} first")]
    Dtype {
        /// The type imported into.
        ty: &'static str,
        /// What it holds.
        expected: String,
        /// What the hand-off has.
        found: String,
    },
    /// The hand-off's elements have another size than the storage's.
    #[error("dtype {found} has {bits} bits per element, but `{ty}` stores {elem_bits}-bit elements")]
    ElementSize {
        /// The storage type.
        ty: &'static str,
        /// The hand-off's dtype.
        found: String,
        /// Its bits.
        bits: u8,
        /// The storage's element bits.
        elem_bits: usize,
    },
    /// The hand-off is strided, and the type imported into has no strides field.
    #[error(
        "strides {strides:?} are not compact, and `{ty}` has no `#[dlpack(strides)]` field; add one, or make the tensor contiguous first"
    )]
    NotCompact {
        /// The type imported into.
        ty: &'static str,
        /// The hand-off's strides.
        strides: Vec<i64>,
    },
    /// The device a field names is not the one the storage's memory is on.
    #[error(
        "{field} is {device}, but the storage's memory is on {storage}; \
         set {field} to {storage}, or put the data in {device} storage"
    )]
    DeviceMismatch {
        /// The field (`device`).
        field: &'static str,
        /// The device the field names.
        device: Device,
        /// The device the storage's memory is on ([`Storage::device`]).
        storage: Device,
    },
    /// Negative strides reach before the first element, which storage cannot adopt.
    #[error(
        "strides {strides:?} reach before the first element; `{ty}` adopts tensors with non-negative strides only"
    )]
    NegativeStrides {
        /// The storage type.
        ty: &'static str,
        /// The strides.
        strides: Vec<i64>,
    },
}

impl From<StorageError> for crate::Error {
    fn from(e: StorageError) -> Self {
        crate::Error::Storage(Box::new(e))
    }
}

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

/// The layout a derived type's fields give.
#[derive(Debug, Clone)]
pub struct Layout<'a> {
    /// The device (from a `device` field, or the storage).
    pub device: Device,
    /// The dtype.
    pub dtype: DataType,
    /// The shape.
    pub shape: Cow<'a, [i64]>,
    /// The strides, `None` for compact.
    pub strides: Option<Cow<'a, [i64]>>,
    /// The byte offset.
    pub byte_offset: u64,
}

fn compact(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    strides
}

/// Describes `storage` with `layout`, checking that the tensor stays inside the
/// storage. This is what a derived `Export::describe` calls.
///
/// # Errors
/// [`StorageError::DeviceMismatch`] when `layout.device` is not
/// [`Storage::device`]; an invalid dtype; [`StorageError::NegativeDimension`],
/// [`StorageError::StridesLength`], [`StorageError::OutOfBounds`].
///
/// ```
/// use handoff_runtime::storage::{describe, Layout, StorageError};
/// use handoff_runtime::{Device, Error, dtype::DataType};
/// let data = vec![0f32; 6];
/// let layout = |shape: Vec<i64>| Layout {
///     device: Device::Host, dtype: DataType::F32, shape: shape.into(), strides: None, byte_offset: 0,
/// };
/// assert!(describe(&data, layout(vec![2, 3])).is_ok());
/// let err = describe(&data, layout(vec![3, 3])).unwrap_err();
/// assert!(matches!(&err, Error::Storage(e) if matches!(**e, StorageError::OutOfBounds { len: 24, .. })), "{err}");
/// ```
pub fn describe<'a, S: Storage + ?Sized>(storage: &'a S, layout: Layout<'a>) -> Result<TensorDesc<'a>> {
    // The pointer means host memory or device memory by where the storage put it; a
    // label cannot move it.
    if layout.device != storage.device() {
        return Err(StorageError::DeviceMismatch {
            field: "device",
            device: layout.device,
            storage: storage.device(),
        }
        .into());
    }
    dtype::check(layout.dtype)?;
    if let Some((axis, &value)) = layout.shape.iter().enumerate().find(|(_, d)| **d < 0) {
        return Err(StorageError::NegativeDimension { axis, value }.into());
    }
    let strides: Cow<'_, [i64]> = match &layout.strides {
        Some(s) if s.len() != layout.shape.len() => {
            return Err(
                StorageError::StridesLength { shape_len: layout.shape.len(), strides_len: s.len() }.into()
            );
        }
        Some(s) => Cow::Borrowed(&s[..]),
        None => Cow::Owned(compact(&layout.shape)),
    };
    let len = storage.byte_len();
    let out_of_bounds = |start: i128, end: i128| StorageError::OutOfBounds {
        shape: layout.shape.to_vec(),
        strides: strides.to_vec(),
        byte_offset: layout.byte_offset,
        dtype: dtype::name(layout.dtype),
        start,
        end,
        len,
    };
    let (lo, hi) = byte_extent(&layout.shape, &strides, layout.dtype)
        .ok_or_else(|| out_of_bounds(i128::MIN, i128::MAX))?;
    let (start, end) =
        if hi == 0 { (0, 0) } else { (layout.byte_offset as i128 + lo, layout.byte_offset as i128 + hi) };
    if start < 0 || end > len as i128 {
        return Err(out_of_bounds(start, end).into());
    }
    drop(strides);
    let mut desc = TensorDesc::new(storage.data_ptr(), layout.device, layout.dtype, layout.shape)
        .with_byte_offset(layout.byte_offset);
    desc.strides = layout.strides;
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

/// What a derived `Import` reads from a hand-off before its storage adopts it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The device.
    pub device: Device,
    /// The dtype.
    pub dtype: DataType,
    /// The shape.
    pub shape: Vec<i64>,
    /// The strides.
    pub strides: Vec<i64>,
    /// Whether the strides are compact.
    pub compact: bool,
    /// The consumer stream.
    pub stream: Stream,
}

impl Received {
    /// Reads `handoff`'s metadata.
    pub fn of(handoff: &Handoff) -> Received {
        Received {
            device: handoff.device(),
            dtype: handoff.dtype(),
            shape: handoff.shape().to_vec(),
            strides: handoff.strides().to_vec(),
            compact: handoff.is_contiguous(),
            stream: handoff.consumer_stream().clone(),
        }
    }
}

// SAFETY: a Vec's heap buffer keeps its address when the Vec is moved, and holds
// `len` initialized elements.
unsafe impl<T: Element + Send> Storage for Vec<T> {
    fn data_ptr(&self) -> *mut c_void {
        self.as_ptr() as *mut c_void
    }
    fn byte_len(&self) -> usize {
        std::mem::size_of_val(&self[..])
    }
}
impl<T: Element + Send> Typed for Vec<T> {
    type Elem = T;
}

// SAFETY: as for Vec: the boxed slice is on the heap.
unsafe impl<T: Element + Send> Storage for Box<[T]> {
    fn data_ptr(&self) -> *mut c_void {
        self.as_ptr() as *mut c_void
    }
    fn byte_len(&self) -> usize {
        std::mem::size_of_val(&self[..])
    }
}
impl<T: Element + Send> Typed for Box<[T]> {
    type Elem = T;
}

// SAFETY: the shared slice is on the heap and lives while this handle does; it is
// shared, so consumers get it read-only.
unsafe impl<T: Element + Send + Sync> Storage for Arc<[T]> {
    fn data_ptr(&self) -> *mut c_void {
        self.as_ptr() as *mut c_void
    }
    fn byte_len(&self) -> usize {
        std::mem::size_of_val(&self[..])
    }
    fn read_only(&self) -> bool {
        true
    }
}
impl<T: Element + Send + Sync> Typed for Arc<[T]> {
    type Elem = T;
}

enum BufferOwner<T> {
    Owned(#[allow(dead_code)] Vec<T>),
    Adopted(#[allow(dead_code)] Handoff),
}

/// Storage that either owns host elements or views another framework's memory (on
/// any device) through the [`Handoff`] it adopted — the storage to use when a
/// derived type should also import.
///
/// ```
/// use handoff_runtime::storage::{Adopt, Buffer};
/// use handoff_runtime::{Export, Stream, TensorDesc, Device, dtype::DataType};
/// let b = Buffer::from(vec![1u32, 2, 3, 4]);
/// # struct V(Buffer<u32>);
/// # impl handoff_runtime::StreamOrdered for V { fn device(&self) -> Device { Device::Host } fn stream(&self) -> Option<Stream> { None } }
/// # impl Export for V { fn describe(&self) -> handoff_runtime::Result<TensorDesc<'_>> {
/// #     use handoff_runtime::storage::Storage;
/// #     Ok(TensorDesc::new(self.0.data_ptr(), Device::Host, DataType::U32, &[4][..])) } }
/// let h = V(b).export(&Stream::host()).unwrap();
/// let viewed = Buffer::<u32>::adopt(h).unwrap();
/// assert_eq!(viewed.as_slice(), Some(&[1, 2, 3, 4][..]));
/// ```
pub struct Buffer<T: Element> {
    ptr: *mut c_void,
    len: usize,
    device: Device,
    read_only: bool,
    owner: BufferOwner<T>,
}

// SAFETY: `ptr` points into memory owned by `owner` (a Vec<T: Send> or a Handoff,
// which is Send); nothing but that owner is shared.
unsafe impl<T: Element + Send> Send for Buffer<T> {}

impl<T: Element> From<Vec<T>> for Buffer<T> {
    fn from(v: Vec<T>) -> Self {
        Buffer {
            ptr: v.as_ptr() as *mut c_void,
            len: std::mem::size_of_val(&v[..]),
            device: Device::Host,
            read_only: false,
            owner: BufferOwner::Owned(v),
        }
    }
}

impl<T: Element> Buffer<T> {
    /// The elements, when the memory is host memory (`None` on a device).
    pub fn as_slice(&self) -> Option<&[T]> {
        let size = std::mem::size_of::<T>();
        if !self.device.is_host()
            || !(self.ptr as usize).is_multiple_of(std::mem::align_of::<T>())
            || size == 0
        {
            return None;
        }
        let len = self.len / size;
        // An empty tensor may have a null data pointer (PyTorch exports every empty
        // tensor so); a slice never may, so empty views use a dangling, aligned one.
        let ptr = if len == 0 { NonNull::<T>::dangling().as_ptr() } else { self.ptr as *mut T };
        // SAFETY: `ptr` is non-null and aligned for T (checked above, or dangling for
        // no elements); when `len > 0` it is host memory of `len` elements owned by
        // `owner`, and every DLPack element type is valid for any bit pattern.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// Whether this buffer views another framework's memory.
    pub fn is_adopted(&self) -> bool {
        matches!(self.owner, BufferOwner::Adopted(_))
    }
}

// SAFETY: `ptr` and `len` describe memory owned by `owner`, which moves with the
// buffer without moving the memory (a Vec's heap buffer, or the hand-off's producer memory).
unsafe impl<T: Element + Send> Storage for Buffer<T> {
    fn data_ptr(&self) -> *mut c_void {
        self.ptr
    }
    fn byte_len(&self) -> usize {
        self.len
    }
    fn device(&self) -> Device {
        self.device
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
}

impl<T: Element + Send> Typed for Buffer<T> {
    type Elem = T;
}

impl<T: Element + Send> Adopt for Buffer<T> {
    fn adopt(handoff: Handoff) -> Result<Self> {
        let ty = std::any::type_name::<Self>();
        let elem_bits = std::mem::size_of::<T>() * 8;
        let dtype = handoff.dtype();
        if elem_bits != 8 && elem_bits != dtype.bits as usize {
            return Err(StorageError::ElementSize {
                ty,
                found: dtype::name(dtype),
                bits: dtype.bits,
                elem_bits,
            }
            .into());
        }
        let (lo, hi) = byte_extent(handoff.shape(), handoff.strides(), dtype).unwrap_or((0, 0));
        if lo < 0 {
            return Err(StorageError::NegativeStrides { ty, strides: handoff.strides().to_vec() }.into());
        }
        Ok(Buffer {
            ptr: handoff.data_ptr().cast(),
            len: usize::try_from(hi).unwrap_or(usize::MAX),
            device: handoff.device(),
            read_only: handoff.is_read_only(),
            owner: BufferOwner::Adopted(handoff),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(shape: &[i64], strides: Option<&[i64]>, byte_offset: u64) -> Layout<'static> {
        Layout {
            device: Device::Host,
            dtype: DataType::F32,
            shape: shape.to_vec().into(),
            strides: strides.map(|s| s.to_vec().into()),
            byte_offset,
        }
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
        let empty = Buffer::<f32>::from(Vec::new());
        assert_eq!(empty.as_slice(), Some(&[][..]));
    }

    #[test]
    fn arc_storage_is_read_only() {
        let a: Arc<[f32]> = Arc::from(vec![1.0f32; 4]);
        let d = describe(&a, layout(&[4], None, 0)).unwrap();
        assert!(d.read_only);
    }
}
