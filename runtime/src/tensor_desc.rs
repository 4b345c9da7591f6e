//! `TensorDesc`: how a producer describes the memory it hands off (address, device,
//! element type, shape, strides), borrowed or owned; nothing is copied.

use crate::device::Device;
use crate::dtype::DataType;
use std::borrow::Cow;
use std::ffi::c_void;

/// How a producer describes its memory for export. Nothing is copied.
///
/// ```
/// use handoff_runtime::{Device, TensorDesc, dtype::DataType};
/// let data = vec![0f32; 6];
/// let desc = TensorDesc::new(data.as_ptr() as *mut _, Device::Host, DataType::F32, &[2, 3][..])
///     .with_strides(&[1, 2][..]);
/// assert_eq!(desc.shape.as_ref(), &[2, 3]);
/// ```
#[derive(Debug, Clone)]
pub struct TensorDesc<'a> {
    /// The base address (device memory for device tensors).
    pub data: *mut c_void,
    /// Where the memory lives.
    pub device: Device,
    /// The element type.
    pub dtype: DataType,
    /// The extent of each dimension.
    pub shape: Cow<'a, [i64]>,
    /// Strides in elements; `None` for compact row-major.
    pub strides: Option<Cow<'a, [i64]>>,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
    /// Consumers must not write.
    pub read_only: bool,
    /// The memory is a copy owned by this hand-off alone (sets DLPack `IS_COPIED`).
    pub is_copied: bool,
}

// SAFETY: a description only: `data` is an address, never dereferenced through a
// `TensorDesc`; whoever reads the memory does so under the owner's rules.
unsafe impl Send for TensorDesc<'_> {}

impl<'a> TensorDesc<'a> {
    /// A compact, writable, not copied tensor.
    pub fn new(data: *mut c_void, device: Device, dtype: DataType, shape: impl Into<Cow<'a, [i64]>>) -> Self {
        TensorDesc {
            data,
            device,
            dtype,
            shape: shape.into(),
            strides: None,
            byte_offset: 0,
            read_only: false,
            is_copied: false,
        }
    }

    /// Explicit strides, in elements.
    pub fn with_strides(mut self, strides: impl Into<Cow<'a, [i64]>>) -> Self {
        self.strides = Some(strides.into());
        self
    }

    /// A byte offset from `data` to the first element.
    pub fn with_byte_offset(mut self, byte_offset: u64) -> Self {
        self.byte_offset = byte_offset;
        self
    }

    /// Marks the tensor read-only for consumers.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// The same description, owning its shape and strides.
    pub fn into_owned(self) -> TensorDesc<'static> {
        TensorDesc {
            data: self.data,
            device: self.device,
            dtype: self.dtype,
            shape: Cow::Owned(self.shape.into_owned()),
            strides: self.strides.map(|s| Cow::Owned(s.into_owned())),
            byte_offset: self.byte_offset,
            read_only: self.read_only,
            is_copied: self.is_copied,
        }
    }
}
