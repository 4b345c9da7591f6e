//! Storage for your own tensor types: what `#[derive(DlpackExchange)]` builds on.
//!
//! - [`Storage`]: memory that gives a pointer and a device, and stays alive (at the
//!   same address) as long as the value does. Implemented for `Vec<T>`, `Box<[T]>`,
//!   `Arc<[T]>` and [`Elements<T>`].
//! - [`Typed`]: storage that knows its element type, so the dtype can come from it.
//! - [`Adopt`]: storage that can take foreign memory in from a [`Handoff`] (a
//!   derived type gets `Import` when its storage can adopt). [`Elements<T>`] can.
//! - [`Dims`], [`StridesField`], [`ByteOffsetField`], [`StreamField`]: the field types
//!   a derived type may use for its shape, strides, byte offset and stream.
//! - [`is_compact`]: handoff's one compactness rule (strides of size-1 dimensions,
//!   and of empty tensors, do not matter).
//!
//! ```
//! use handoff_runtime::storage::Elements;
//! let b = Elements::from(vec![1.0f32, 2.0, 3.0]);
//! assert_eq!(b.as_slice(), Some(&[1.0, 2.0, 3.0][..]));
//! ```

mod elements;
mod fields;
mod std_impls;

pub use crate::error::StorageError;
pub use crate::validate::is_compact;
pub use elements::Elements;
pub use fields::{ByteOffsetField, Dims, StreamField, StridesField};

use crate::device::Device;
use crate::dtype::Element;
use crate::error::Result;
use crate::handoff::Handoff;
use std::ffi::c_void;

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
    note = "use `handoff::storage::Elements<T>` as the `#[dlpack(data)]` field to import into this type"
)]
pub trait Adopt: Storage + Sized {
    /// Takes `handoff`'s memory in, from its first element (`data + byte_offset`).
    /// Keeps the hand-off (and so the producer's memory) until dropped.
    ///
    /// # Errors
    /// [`StorageError`] when the elements do not fit this storage.
    fn adopt(handoff: Handoff) -> Result<Self>;
}
