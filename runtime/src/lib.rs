//! # handoff-runtime
//!
//! The stream-ordered hand-off protocol, which every adapter of handoff builds on.
//!
//! - [`Device`], [`dtype`], [`Dims`]: where memory lives, what it holds (DLPack's
//!   types), and a shape or strides kept inline.
//! - [`Stream`], [`Event`], [`Backend`]: streams of any device, pooled events.
//! - [`StreamOrdered`]: a value that knows how to be made ready on a consumer stream.
//! - [`Export`], [`Import`], [`Handoff`]: the DLPack tensor in flight; its release
//!   is stream-ordered through the [`reaper`].
//! - [`transfer`], [`transfer_into`]: the generic entry points, over [`Exportable`],
//!   [`Importable`] and [`ImportInto`] (imports that need a context, such as an XLA client).
//! - [`stats()`] and [`mod@stats`]: counters of every record, wait, elision, copy and host sync.
//! - [`graph`]: hand-offs made while a stream captures a CUDA graph.
//! - [`mock`]: a simulated device with a hazard checker, for tests without a GPU.
//! - `testing` (cargo feature `testing`): a device backend that does nothing, for
//!   tests and benchmarks of code over streams and events.
//!
//! ```
//! use handoff_runtime::{mock::{Mock, MockTensor}, stats, Export, Ready};
//!
//! let mock = Mock::new();
//! let (producer, consumer) = (mock.stream(0, "producer"), mock.stream(0, "consumer"));
//! let x = mock.tensor_f32(&producer, "x", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
//! let (h, delta) = stats::measure(|| x.export(&consumer).unwrap());
//! assert_eq!(h.ready(), Ready::Waited);
//! assert_eq!((delta.waits_enqueued, delta.host_syncs), (1, 0));
//! let y: MockTensor = h.import().unwrap();
//! ```
#![warn(missing_docs)]

#[cfg(feature = "cuda")]
pub mod cuda;
mod derive_support;
mod device;
mod dims;
pub mod dtype;
mod error;
pub mod graph;
mod handoff;
mod managed;
pub mod mock;
pub mod reaper;
pub mod registry;
pub mod stats;
pub mod storage;
mod stream;
mod stream_ordered;
mod tensor_desc;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod transfer;
mod validate;

pub use device::Device;
pub use dims::Dims;
pub use error::{Error, Result, ValidationError};
pub use handoff::{Export, Handoff, Import, Release};
pub use stats::{Stats, stats};
pub use stream::{Backend, Event, EventPool, RawEvent, RawStream, Stream};
pub use stream_ordered::{Ready, StreamOrdered, order};
pub use tensor_desc::TensorDesc;
pub use transfer::{Exportable, ImportInto, Importable, transfer, transfer_into};
pub use validate::{Access, MAX_NDIM, check_passed_on};

/// The DLPack C ABI, for code that passes raw DLPack pointers to
/// [`Handoff::from_raw`] or takes them from [`Handoff::into_raw`] (the types of the
/// DLPack header, through `dlpark`).
pub mod ffi {
    pub use dlpark::DlpackFlags;
    pub use dlpark::ffi::{
        DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
        DLPackExchangeAPI, DLPackExchangeAPIHeader, DLPackVersion, DLTensor,
    };
}

/// What `#[derive(DlpackExchange)]`'s generated code calls. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::derive_support::{describe, expect_compact, expect_dtype, received};
}
