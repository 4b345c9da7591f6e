//! [`Elements`]: storage that owns host elements or adopts another framework's memory.

use super::{Adopt, Storage, Typed};
use crate::device::Device;
use crate::dtype::{self, Element};
use crate::error::{Result, StorageError};
use crate::handoff::Handoff;
use crate::validate::byte_extent;
use std::ffi::c_void;
use std::ptr::NonNull;

enum ElementsOwner<T> {
    Owned(#[allow(dead_code)] Vec<T>),
    Adopted(#[allow(dead_code)] Handoff),
}

/// Storage that either owns host elements or views another framework's memory (on
/// any device) through the [`Handoff`] it adopted — the storage to use when a
/// derived type should also import.
///
/// ```
/// use handoff_runtime::storage::{Adopt, Elements};
/// use handoff_runtime::{Export, Stream, TensorDesc, Device, dtype::DataType};
/// let b = Elements::from(vec![1u32, 2, 3, 4]);
/// # struct V(Elements<u32>);
/// # impl handoff_runtime::StreamOrdered for V { fn device(&self) -> Device { Device::Host } fn stream(&self) -> Option<Stream> { None } }
/// # impl Export for V { fn describe(&self) -> handoff_runtime::Result<TensorDesc<'_>> {
/// #     use handoff_runtime::storage::Storage;
/// #     Ok(TensorDesc::new(self.0.data_ptr(), Device::Host, DataType::U32, &[4][..])) } }
/// let h = V(b).export(&Stream::host()).unwrap();
/// let viewed = Elements::<u32>::adopt(h).unwrap();
/// assert_eq!(viewed.as_slice(), Some(&[1, 2, 3, 4][..]));
/// ```
pub struct Elements<T: Element> {
    ptr: *mut c_void,
    len: usize,
    device: Device,
    read_only: bool,
    owner: ElementsOwner<T>,
}

// SAFETY: `ptr` points into memory owned by `owner` (a Vec<T: Send> or a Handoff,
// which is Send); nothing but that owner is shared.
unsafe impl<T: Element + Send> Send for Elements<T> {}

impl<T: Element> From<Vec<T>> for Elements<T> {
    fn from(v: Vec<T>) -> Self {
        Elements {
            ptr: v.as_ptr() as *mut c_void,
            len: std::mem::size_of_val(&v[..]),
            device: Device::Host,
            read_only: false,
            owner: ElementsOwner::Owned(v),
        }
    }
}

impl<T: Element> Elements<T> {
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

    /// Whether these elements are another framework's memory, adopted.
    pub fn is_adopted(&self) -> bool {
        matches!(self.owner, ElementsOwner::Adopted(_))
    }
}

// SAFETY: `ptr` and `len` describe memory owned by `owner`, which moves with the
// buffer without moving the memory (a Vec's heap buffer, or the hand-off's producer memory).
unsafe impl<T: Element + Send> Storage for Elements<T> {
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

impl<T: Element + Send> Typed for Elements<T> {
    type Elem = T;
}

impl<T: Element + Send> Adopt for Elements<T> {
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
        Ok(Elements {
            ptr: handoff.data_ptr().cast(),
            len: usize::try_from(hi).unwrap_or(usize::MAX),
            device: handoff.device(),
            read_only: handoff.is_read_only(),
            owner: ElementsOwner::Adopted(handoff),
        })
    }
}
