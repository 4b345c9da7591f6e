//! `Handoff`, the value in flight: a DLPack versioned managed tensor that owns the
//! producer's keep-alive and whose deleter releases it in stream order.

use crate::device::Device;
use crate::dtype::DataType;
use crate::error::{Result, ValidationError};
use crate::managed::{self, Head};
use crate::reaper;
use crate::stats::{self, Counter};
use crate::stream::Stream;
use crate::stream_ordered::{Ready, StreamOrdered};
use crate::tensor_desc::TensorDesc;
use crate::validate::{self, Access, Parts};
use dlpark::DlpackFlags;
use dlpark::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use dlpark::{Managed, ManagedTensorBase};
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

/// When a hand-off gives the producer's keep-alive back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// After all work the consumer enqueued on its stream before dropping (rule 3).
    /// Immediate when the consumer stream is the producer's own or the host.
    AfterConsumer,
    /// As soon as the consumer drops: for producers whose allocator is itself
    /// stream-ordered across streams (PyTorch's `recordStream`). Dropped on another
    /// thread than the one that made the hand-off (PJRT lets go of a view on its
    /// own), it goes back to that one, which drops it at its next release, within
    /// [`reaper::STALE`](crate::reaper::STALE) otherwise.
    Immediately,
}

/// A value that can be handed to another framework without a copy.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be handed off: it does not implement `Export`",
    label = "not exportable",
    note = "a `tch::Tensor` (or `&tch::Tensor`) is exportable once the torch adapter is linked: depend on \
            `handoff-torch` (or `handoff` with its `torch` feature) and name it once, e.g. `use handoff_torch as _;`",
    note = "a cudarc `CudaSlice` needs `handoff-cuda` (feature `cuda`), an XLA `Buffer` `handoff-xla`; a type \
            of your own implements `StreamOrdered` and `Export`, or derives `handoff::DlpackExchange`"
)]
pub trait Export: StreamOrdered + Send + Sized + 'static {
    /// Describes the memory. `self` is kept alive, unchanged, until the consumer is done.
    fn describe(&self) -> Result<TensorDesc<'_>>;

    /// Makes the value ready on `consumer` and wraps it in a [`Handoff`].
    fn export(self, consumer: &Stream) -> Result<Handoff> {
        Handoff::export(self, consumer)
    }
}

/// A type that can take a [`Handoff`] in, viewing its memory without a copy and
/// keeping it (and so the producer's keep-alive) until it is dropped.
#[diagnostic::on_unimplemented(
    message = "a hand-off cannot be taken into `{Self}`: it does not implement `Import`",
    label = "not importable",
    note = "a `tch::Tensor` is importable once the torch adapter is linked: depend on `handoff-torch` (or \
            `handoff` with its `torch` feature) and name it once, e.g. `use handoff_torch as _;`",
    note = "a type of your own implements `Import` (or `ImportInto<Ctx>` when it needs a context), or derives \
            `handoff::DlpackExchange`"
)]
pub trait Import: Sized {
    /// Takes the hand-off in. Use [`Handoff::import`], which counts it.
    fn from_handoff(handoff: Handoff) -> Result<Self>;
}

/// A tensor in flight between a producer and a consumer: a DLPack
/// `DLManagedTensorVersioned` (through dlpark) made ready on the consumer's stream.
///
/// Dropping it, or calling its DLPack deleter after [`Handoff::into_raw`], gives the
/// producer's memory back only after the consumer's queued work is done. Dropped on
/// another thread than the one that made it (PJRT lets go of a view on its own), it
/// is given back to that one, which drops it at its next release (see
/// [`reaper`](crate::reaper)'s homes): the hand-off's memory, like the producer's, is
/// freed where it was allocated.
pub struct Handoff {
    /// Dropped by `Drop` alone, or given up by `into_raw`.
    managed: ManuallyDrop<Managed<DLManagedTensorVersioned>>,
    device: Device,
    /// The consumer stream and the home, held by the tensor's context
    /// (`managed::Owner`): valid as long as `managed` is owned here.
    head: NonNull<Head>,
    ready: Ready,
    /// The strides are compact row-major (known when they were laid out).
    compact: bool,
}

// SAFETY: `head` points into the managed tensor this value owns, whose `Stream` is
// `Send + Sync` and which nothing else touches before the deleter, which only an owner
// runs; the rest is the managed tensor and plain values.
unsafe impl Send for Handoff {}
// SAFETY: as above; `&Handoff` only reads.
unsafe impl Sync for Handoff {}

impl Handoff {
    /// Makes `value` ready on `consumer` and wraps it (what [`Export::export`] does).
    pub fn export<T: Export>(value: T, consumer: &Stream) -> Result<Handoff> {
        // Immediate only when the memory goes back in order on the consumer's own
        // stream: then the free itself waits for the consumer's queued work.
        let released_in_order = value.releases_on(consumer);
        let ready = value.ready_on(consumer)?;
        let release = if released_in_order { Release::Immediately } else { Release::AfterConsumer };
        let laid = lay_out(&value.describe()?)?;
        Handoff::wrap(value, laid, consumer, ready, release, Some(T::held_release_stream))
    }

    /// Wraps memory described by `describe(&keep_alive)`, which the caller has already
    /// made ready on `consumer` (`ready` says how), releasing `keep_alive` as `release` says.
    ///
    /// This is the constructor adapters use when they order or release memory
    /// their own way.
    pub fn with_keep_alive<K: Send + 'static>(
        keep_alive: K,
        describe: impl FnOnce(&K) -> Result<TensorDesc<'_>>,
        consumer: &Stream,
        ready: Ready,
        release: Release,
    ) -> Result<Handoff> {
        let laid = lay_out(&describe(&keep_alive)?)?;
        Handoff::wrap(keep_alive, laid, consumer, ready, release, None)
    }

    /// [`with_keep_alive`](Self::with_keep_alive) for a description read beforehand,
    /// into values of its own: `keep_alive` holds the memory `desc` describes,
    /// unchanged, until the consumer is done. A keep-alive that needs to hold only
    /// the framework's handle (not its description too) keeps the hand-off small.
    ///
    /// ```
    /// use handoff_runtime::{Device, Handoff, Ready, Release, Stream, TensorDesc, dtype::DataType};
    /// let data = vec![1.0f32, 2.0, 3.0];
    /// let shape = [3i64];
    /// let desc = TensorDesc::new(data.as_ptr() as *mut _, Device::Host, DataType::F32, &shape[..]);
    /// let h = Handoff::from_desc(data, &desc, &Stream::host(), Ready::Elided, Release::AfterConsumer).unwrap();
    /// assert_eq!(h.shape(), &[3]);
    /// ```
    pub fn from_desc<K: Send + 'static>(
        keep_alive: K,
        desc: &TensorDesc<'_>,
        consumer: &Stream,
        ready: Ready,
        release: Release,
    ) -> Result<Handoff> {
        let laid = lay_out(desc)?;
        Handoff::wrap(keep_alive, laid, consumer, ready, release, None)
    }

    /// Moves `keep_alive` into the tensor [`lay_out`] made room for (its head
    /// borrowing the keep-alive's handle of the consumer stream, when `held` finds one).
    // Inlined: see `managed::lay_out`.
    #[inline(always)]
    fn wrap<K: Send + 'static>(
        keep_alive: K,
        (laid, device): (managed::Laid<K>, Device),
        consumer: &Stream,
        ready: Ready,
        release: Release,
        held: managed::HeldStream<K>,
    ) -> Result<Handoff> {
        let compact = laid.compact;
        let (managed, head) = laid.finish(consumer, release == Release::AfterConsumer, keep_alive, held)?;
        stats::count(Counter::Exports, 1);
        Ok(Handoff { managed: ManuallyDrop::new(managed), device, head, ready, compact })
    }

    /// Takes in a foreign `DLManagedTensorVersioned` that its producer has already
    /// made ready on `consumer` (as the DLPack stream convention asks), validating it
    /// before any metadata is used. On every error the foreign deleter has been
    /// called exactly once. Dropping the result calls the foreign deleter only after
    /// the work queued on `consumer` before the drop is done.
    ///
    /// # Safety
    /// `ptr` must be null or a managed tensor the caller owns, whose version field is
    /// readable, and whose other fields are readable when the major version matches.
    pub unsafe fn from_raw(
        ptr: *mut DLManagedTensorVersioned,
        consumer: &Stream,
        access: Access,
    ) -> Result<Handoff> {
        // SAFETY: forwarded from the caller.
        let foreign = unsafe { Managed::from_raw(ptr) }.map_err(|e| match e {
            dlpark::dlpack::FromRawError::Version { source } => {
                ValidationError::IncompatibleVersion { major: source.actual, expected: source.expected }
            }
            _ => ValidationError::NullPointer,
        })?;
        let flags = foreign.flags();
        // SAFETY: owned, version checked; check() bounds every read.
        let checked = unsafe { validate::check(foreign.tensor(), Some(foreign.version()), flags, access) }?;
        Self::adopt(foreign, flags, checked.device, consumer)
    }

    /// Takes in a foreign legacy `DLManagedTensor`, as [`Handoff::from_raw`] does.
    ///
    /// # Safety
    /// `ptr` must be null or a managed tensor the caller owns, with readable fields.
    pub unsafe fn from_raw_legacy(
        ptr: *mut DLManagedTensor,
        consumer: &Stream,
        access: Access,
    ) -> Result<Handoff> {
        // SAFETY: forwarded from the caller.
        let foreign = unsafe { Managed::from_raw(ptr) }.map_err(|_| ValidationError::NullPointer)?;
        // SAFETY: owned (legacy ABI: no version); check() bounds every read.
        let checked = unsafe { validate::check(foreign.tensor(), None, DlpackFlags::empty(), access) }?;
        Self::adopt(foreign, DlpackFlags::empty(), checked.device, consumer)
    }

    /// Re-wraps a validated foreign tensor (on `device`) so that its deleter, too, runs
    /// in stream order. The re-wrapped tensor says what the foreign one said (its
    /// compact strides canonical) and is not checked again.
    fn adopt<M: ManagedTensorBase + 'static>(
        foreign: Managed<M>,
        flags: DlpackFlags,
        device: Device,
        consumer: &Stream,
    ) -> Result<Handoff> {
        // SAFETY: validated above; metadata is immutable while owned.
        let t: DLTensor = *unsafe { foreign.tensor() };
        let (shape, strides): (&[i64], Option<&[i64]>) = if t.ndim == 0 {
            (&[], None)
        } else {
            // SAFETY: validated: `ndim` readable shape values, and `ndim` readable
            // strides when they are not null.
            unsafe {
                (
                    std::slice::from_raw_parts(t.shape, t.ndim as usize),
                    (!t.strides.is_null()).then(|| std::slice::from_raw_parts(t.strides, t.ndim as usize)),
                )
            }
        };
        let parts = Parts {
            data: t.data,
            device: t.device,
            dtype: t.dtype,
            shape,
            strides,
            byte_offset: t.byte_offset,
            flags,
        };
        let laid = managed::lay_out::<Managed<M>>(&parts)?;
        let compact = laid.compact;
        let (managed, head) = laid.finish(consumer, true, foreign, None)?;
        stats::count(Counter::Imports, 1);
        Ok(Handoff { managed: ManuallyDrop::new(managed), device, head, ready: Ready::Elided, compact })
    }

    /// Gives the hand-off to a consumer type (counted as an import).
    #[inline]
    pub fn import<T: Import>(self) -> Result<T> {
        stats::count(Counter::Imports, 1);
        T::from_handoff(self)
    }

    /// Gives up ownership as a raw DLPack pointer, for a C consumer. Its deleter
    /// performs the stream-ordered release.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: taken once; `this` is never dropped, so `Drop` does not take it again.
        unsafe { ManuallyDrop::take(&mut this.managed) }.into_raw()
    }

    /// Releases a hand-off that [`into_raw`](Self::into_raw) gave up, as dropping it
    /// would have: its deleter runs on the thread that made it (the tensor is given
    /// back there when this runs on another), and the producer's keep-alive goes after
    /// the consumer's queued work when the hand-off asked for that. For adapters that
    /// pass a hand-off through a C callback's one context pointer (PJRT's
    /// `on_delete_callback`, PyTorch's storage deleter) instead of boxing it.
    ///
    /// ```
    /// use handoff_runtime::{Export, Handoff, Stream, mock::Mock};
    /// let mock = Mock::new();
    /// let s = mock.stream(0, "s");
    /// let raw = mock.tensor_f32(&s, "x", &[2], &[1.0, 2.0]).export(&s).unwrap().into_raw();
    /// // SAFETY: from `into_raw`, released once.
    /// unsafe { Handoff::release_raw(raw) };
    /// ```
    ///
    /// # Safety
    /// `ptr` must come from [`into_raw`](Self::into_raw), and neither this nor its
    /// deleter may have run on it yet.
    pub unsafe fn release_raw(ptr: *mut DLManagedTensorVersioned) {
        // SAFETY: a hand-off's own tensor (the caller's promise): version checked when
        // it was made, owned from here on.
        let Ok(managed) = (unsafe { Managed::from_raw(ptr) }) else { return };
        // SAFETY: every hand-off's context is an `Owner` (`repr(C)`, its `Head` first),
        // alive until the deleter runs, which only dropping `managed` does.
        let home = unsafe { (*((*ptr).manager_ctx as *const Head)).home };
        reaper::give_home(home, Returning { _tensor: managed });
    }

    /// The raw DLPack pointer, still owned by `self`.
    pub fn as_raw(&self) -> *mut DLManagedTensorVersioned {
        self.managed.as_ptr()
    }

    #[inline]
    fn tensor(&self) -> &DLTensor {
        // SAFETY: owned and validated; metadata is immutable while owned.
        unsafe { self.managed.tensor() }
    }

    /// The hand-off's memory as a [`TensorDesc`] (explicit strides), borrowing its
    /// shape and strides.
    pub fn desc(&self) -> TensorDesc<'_> {
        let mut desc = TensorDesc::new(self.data(), self.device, self.dtype(), self.shape())
            .with_strides(self.strides())
            .with_byte_offset(self.byte_offset());
        desc.read_only = self.is_read_only();
        desc.is_copied = self.is_copied();
        desc
    }

    /// Where the memory lives.
    #[inline]
    pub fn device(&self) -> Device {
        self.device
    }

    /// The element type.
    #[inline]
    pub fn dtype(&self) -> DataType {
        self.tensor().dtype
    }

    /// The extent of each dimension.
    #[inline]
    pub fn shape(&self) -> &[i64] {
        let t = self.tensor();
        if t.ndim == 0 {
            return &[];
        }
        // SAFETY: validated: `ndim` readable values.
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }
    }

    /// The strides in elements (always explicit in a hand-off).
    #[inline]
    pub fn strides(&self) -> &[i64] {
        let t = self.tensor();
        if t.ndim == 0 {
            return &[];
        }
        // SAFETY: every Handoff is built with explicit strides of `ndim` values.
        unsafe { std::slice::from_raw_parts(t.strides, t.ndim as usize) }
    }

    /// Whether the strides are compact row-major, by handoff's one rule
    /// ([`storage::is_compact`](crate::storage::is_compact)): strides of size-1
    /// dimensions, and of tensors with no elements, do not matter (as in DLPack and
    /// PyTorch), so `torch.ones(1, 8).t()` (shape `[8, 1]`, strides `[1, 8]`) is compact.
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        self.compact
    }

    /// The base address.
    #[inline]
    pub fn data(&self) -> *mut c_void {
        self.tensor().data
    }

    /// Bytes from [`data`](Self::data) to the first element.
    #[inline]
    pub fn byte_offset(&self) -> u64 {
        self.tensor().byte_offset
    }

    /// The address of the first element (`data + byte_offset`).
    #[inline]
    pub fn data_ptr(&self) -> *mut u8 {
        (self.data() as *mut u8).wrapping_add(self.byte_offset() as usize)
    }

    /// The number of elements.
    pub fn num_elements(&self) -> usize {
        self.shape().iter().map(|&d| d as usize).product()
    }

    /// The bytes the elements take (packed sub-byte types rounded up once: validation
    /// refuses `IS_SUBBYTE_TYPE_PADDED` sub-byte tensors, so sub-byte data is always packed).
    pub fn num_bytes(&self) -> usize {
        (self.num_elements() * self.dtype().bits as usize).div_ceil(8)
    }

    /// Consumers must not write.
    #[inline]
    pub fn is_read_only(&self) -> bool {
        self.managed.flags().contains(DlpackFlags::READ_ONLY)
    }

    /// The memory is a copy made for this hand-off.
    pub fn is_copied(&self) -> bool {
        self.managed.flags().contains(DlpackFlags::IS_COPIED)
    }

    /// The stream the data was made ready on, and on which the consumer works.
    #[inline]
    pub fn consumer_stream(&self) -> &Stream {
        self.head().consumer()
    }

    #[inline]
    fn head(&self) -> &Head {
        // SAFETY: the owner in the managed tensor's context holds it until the deleter
        // runs, which happens only once `self` gives the tensor up or is dropped.
        unsafe { self.head.as_ref() }
    }

    /// What making the data ready took.
    pub fn ready(&self) -> Ready {
        self.ready
    }

    /// When the hand-off gives the producer's keep-alive back once dropped: after the
    /// work queued on its consumer stream ([`Release::AfterConsumer`]), or at once.
    ///
    /// ```
    /// use handoff_runtime::{Export, Release, Stream, mock::Mock};
    /// let mock = Mock::new();
    /// let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
    /// let h = mock.tensor_f32(&a, "x", &[2], &[1.0, 2.0]).export(&b).unwrap();
    /// assert_eq!(h.release(), Release::AfterConsumer);
    /// ```
    pub fn release(&self) -> Release {
        if self.head().after_consumer { Release::AfterConsumer } else { Release::Immediately }
    }
}

/// Checks a producer's description once, before the keep-alive moves in, and lays it
/// out with room for an owner of `K` (the tensor laid out from it is handoff's own and
/// not read back).
// Inlined: see `managed::lay_out`.
#[inline(always)]
fn lay_out<K: Send + 'static>(desc: &TensorDesc<'_>) -> Result<(managed::Laid<K>, Device)> {
    let mut flags = DlpackFlags::empty();
    flags.set(DlpackFlags::READ_ONLY, desc.read_only);
    flags.set(DlpackFlags::IS_COPIED, desc.is_copied);
    let parts = Parts {
        data: desc.data,
        device: desc.device.to_dlpack(),
        dtype: desc.dtype,
        shape: &desc.shape,
        strides: desc.strides.as_deref(),
        byte_offset: desc.byte_offset,
        flags,
    };
    let laid = managed::lay_out::<K>(&parts)?;
    // Compact strides reach exactly the elements: checked as compact, without
    // walking them.
    let parts = if laid.compact { Parts { strides: None, ..parts } } else { parts };
    Ok((laid, validate::check_parts(&parts, Access::Read)?.device))
}

/// The managed tensor of a hand-off dropped away from home, on its way there (its
/// deleter runs when this is dropped).
struct Returning {
    _tensor: Managed<DLManagedTensorVersioned>,
}

// SAFETY: as `Handoff`'s: an owned managed tensor, whose deleter any thread may run.
unsafe impl Send for Returning {}

impl Drop for Handoff {
    fn drop(&mut self) {
        let home = self.head().home;
        // SAFETY: taken once, here; `into_raw` skips this drop.
        let managed = unsafe { ManuallyDrop::take(&mut self.managed) };
        // At home (or with none), the deleter runs now; elsewhere the whole tensor is
        // given back to the thread that made it.
        reaper::give_home(home, Returning { _tensor: managed });
    }
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("device", &self.device)
            .field("dtype", &crate::dtype::name(self.dtype()))
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("byte_offset", &self.byte_offset())
            .field("consumer", self.consumer_stream())
            .field("ready", &self.ready)
            .finish()
    }
}
