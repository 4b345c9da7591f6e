//! Zero-copy exchange between PJRT buffers and [`Handoff`]s.
//!
//! - **Import** ([`Client::import`]): a `PJRT_Client_CreateViewOfDeviceBuffer` of the
//!   hand-off's memory. The hand-off (and so the producer's memory) is kept until
//!   PJRT calls `on_delete_callback`. On CUDA the producer is ordered before the
//!   device's `get_stream_for_external_ready_events` stream (no host wait) and that
//!   stream is passed as the view's `stream`, as JAX does. On CPU, memory not aligned
//!   to 64 bytes is refused unless a copy is asked for.
//!   The view owns the hand-off itself through PJRT's callback; a
//!   [`ViewWatch`] ([`ViewOptions::watched`]) adds a shared owner
//!   that says when PJRT let go. A kernel call's inputs are bare views of the same
//!   kind, held for its one execution.
//! - **Export** (`Buffer`'s [`Export`] impl): `IncreaseExternalReferenceCount` +
//!   `OpaqueDeviceMemoryDataPointer`; on CUDA the consumer stream waits for the buffer
//!   with the stream extension's `wait_until_buffer_ready_on_stream` (no host wait);
//!   on CPU the buffer's ready event is checked, and awaited (a counted host sync)
//!   only if still pending. The external reference is given back only after the
//!   consumer's stream work has completed (the reaper). An execution's
//!   [`OutputBuffer`] has one owner, so its export takes no
//!   external reference: the hand-off owns the buffer, destroyed after the consumer.
//!
//! Each direction has its file: `import` (hand-offs viewed by PJRT), `export` (PJRT
//! buffers handed off), and `ready`, the stream XLA reads hand-offs on
//! ([`Client::ready_stream`]).
//!
//! [`Handoff`]: handoff_runtime::Handoff
//! [`Client::import`]: crate::client::Client::import
//! [`Client::ready_stream`]: crate::client::Client::ready_stream
//! [`ViewWatch`]: crate::buffer::ViewWatch
//! [`Export`]: handoff_runtime::Export
//! [`OutputBuffer`]: crate::buffer::OutputBuffer

mod export;
pub(crate) mod import;
mod ready;

pub use export::Borrowed;
pub use import::{CPU_ALIGNMENT, GPU_ALIGNMENT, ViewOptions};
