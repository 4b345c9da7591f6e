//! The generic entry points: move any exportable value into any importing type, on a
//! stream ([`transfer`]) or into a context that picks its own stream ([`transfer_into`]).
//!
//! Three small traits widen [`Export`] and [`Import`] to what adapters need:
//!
//! - [`Exportable`]: every `Export` type as it is, and framework types an adapter does
//!   not own (a borrowed `tch::Tensor`) through the adapter's wrapper;
//! - [`Importable`]: every `Import` type, and framework types through their adapter
//!   (a `tch::Tensor` out of a hand-off);
//! - [`ImportInto`]: types that import into a context they need (an XLA buffer needs
//!   its client): the context names the stream it reads on, so the producer makes
//!   its data ready there directly and the import adds no wait.
//!
//! The `Via` parameter of the first two names the adapter (a type of the adapter's
//! own crate), which lets an adapter implement them for a framework's types. Generic
//! code never writes it: it is inferred, since each type has one way in and out.

use crate::device::Device;
use crate::error::Result;
use crate::handoff::{Export, Handoff, Import};
use crate::stream::Stream;
use crate::stream_ordered::StreamOrdered;

/// A value that can be handed off: an [`Export`] type as it is, or a framework type
/// through its adapter (`&tch::Tensor` becomes a `handoff_torch::TorchTensor`).
///
/// ```
/// use handoff_runtime::{Exportable, mock::Mock};
/// let mock = Mock::new();
/// let s = mock.stream(0, "s");
/// let x = mock.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
/// let same = x.into_exportable().unwrap(); // an Export type is its own exportable value
/// assert_eq!(same.shape(), &[2]);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be handed off: it is not `Export`, and no linked adapter makes it exportable",
    label = "not exportable",
    note = "a `tch::Tensor` (or `&tch::Tensor`) is exportable once the torch adapter is linked: depend on \
            `handoff-torch` (or `handoff` with its `torch` feature) and name it once, e.g. `use handoff_torch as _;`",
    note = "a cudarc `CudaSlice` needs `handoff-cuda` (feature `cuda`), an XLA `Buffer` `handoff-xla`; a type \
            of your own implements `StreamOrdered` and `Export`, or derives `handoff::DlpackExchange`"
)]
pub trait Exportable<Via = ()> {
    /// The value that is exported.
    type Value: Export;

    /// Turns `self` into the value to export. Nothing is copied: a borrowed framework
    /// tensor becomes a shallow handle of the same memory.
    fn into_exportable(self) -> Result<Self::Value>;
}

impl<T: Export> Exportable for T {
    type Value = T;

    fn into_exportable(self) -> Result<T> {
        Ok(self)
    }
}

/// A type a hand-off can be taken into on the hand-off's own consumer stream: an
/// [`Import`] type, or a framework type through its adapter (`tch::Tensor`).
///
/// ```
/// use handoff_runtime::{Export, Importable, mock::{Mock, MockTensor}};
/// let mock = Mock::new();
/// let s = mock.stream(0, "s");
/// let h = mock.tensor_f32(&s, "x", &[2], &[1.0, 2.0]).export(&s).unwrap();
/// let y = MockTensor::import_handoff(h).unwrap();
/// assert_eq!(y.stream(), &s);
/// ```
#[diagnostic::on_unimplemented(
    message = "a hand-off cannot be taken into `{Self}`: it is not `Import`, and no linked adapter makes it importable",
    label = "not importable",
    note = "a `tch::Tensor` is importable once the torch adapter is linked: depend on `handoff-torch` (or \
            `handoff` with its `torch` feature) and name it once, e.g. `use handoff_torch as _;`",
    note = "a type of your own implements `Import` (or `ImportInto<Ctx>` when it needs a context), or derives \
            `handoff::DlpackExchange`"
)]
pub trait Importable<Via = ()>: Sized + 'static {
    /// Takes the hand-off in (counted as an import).
    fn import_handoff(handoff: Handoff) -> Result<Self>;
}

impl<T: Import + 'static> Importable for T {
    fn import_handoff(handoff: Handoff) -> Result<T> {
        handoff.import()
    }
}

/// A type that imports into a context: the context (an XLA client, or simply a
/// [`Stream`] for every [`Import`] type) names the stream it reads memory of a device
/// on, and takes the hand-off in.
///
/// ```
/// use handoff_runtime::{ImportInto, Stream, Device, mock::MockTensor};
/// let s = Stream::host();
/// // For Import types the context is the consumer stream itself.
/// assert_eq!(<MockTensor as ImportInto<Stream>>::ready_stream(&s, Device::Host).unwrap(), s);
/// ```
pub trait ImportInto<Ctx: ?Sized>: Sized {
    /// The stream `ctx` reads memory of `device` on. A producer exported to this
    /// stream needs no further wait at import.
    fn ready_stream(ctx: &Ctx, device: Device) -> Result<Stream>;

    /// Takes the hand-off in, into `ctx` (counted as an import).
    fn import_into(handoff: Handoff, ctx: &Ctx) -> Result<Self>;
}

impl<T: Import> ImportInto<Stream> for T {
    fn ready_stream(ctx: &Stream, _device: Device) -> Result<Stream> {
        Ok(ctx.clone())
    }

    fn import_into(handoff: Handoff, _ctx: &Stream) -> Result<T> {
        handoff.import()
    }
}

/// Hands `value` to a consumer of type `T` that works on `consumer`: one export
/// (made ready on `consumer`: one event wait, or nothing on the same stream) and one
/// import, no copy.
///
/// ```
/// # use handoff_runtime::{mock::Mock, transfer, stats};
/// let mock = Mock::new();
/// let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
/// let x = mock.tensor_f32(&a, "x", &[2], &[1.0, 2.0]);
/// let y: handoff_runtime::mock::MockTensor = transfer(x, &b).unwrap();
/// assert_eq!(y.stream(), &b);
/// ```
pub fn transfer<T: Importable<I>, I, E>(value: impl Exportable<E>, consumer: &Stream) -> Result<T> {
    T::import_handoff(value.into_exportable()?.export(consumer)?)
}

/// Hands `value` to a consumer of type `T` in the context `ctx` (an XLA client, for
/// `handoff_xla::Buffer`): the value is made ready directly on the stream the context
/// reads on, then imported there. Works for every [`Import`] type with a [`Stream`]
/// as the context.
///
/// ```
/// # use handoff_runtime::{mock::{Mock, MockTensor}, transfer_into};
/// let mock = Mock::new();
/// let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
/// let x = mock.tensor_f32(&a, "x", &[2], &[1.0, 2.0]);
/// let y: MockTensor = transfer_into(x, &b).unwrap();
/// assert_eq!(y.stream(), &b);
/// ```
pub fn transfer_into<T: ImportInto<C>, C: ?Sized, E>(value: impl Exportable<E>, ctx: &C) -> Result<T> {
    let value = value.into_exportable()?;
    let stream = T::ready_stream(ctx, value.device())?;
    T::import_into(value.export(&stream)?, ctx)
}
