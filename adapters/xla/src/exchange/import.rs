//! Into XLA: a hand-off viewed as a PJRT buffer without a copy
//! (`PJRT_Client_CreateViewOfDeviceBuffer`), checked and ordered before XLA's ready
//! stream by [`prepare`]: [`Client::import`], a kernel call's inputs, and
//! `ImportInto<Client>` for [`Buffer`]. The view owns the hand-off until PJRT calls
//! its `on_delete_callback`.

use super::ready::{cached_ready_stream, ready_stream_at};
use crate::buffer::{Buffer, RawBuffer, Released, ViewWatch};
use crate::client::Client;
use crate::dtype;
use crate::error::{Result, XlaError};
use crate::result;
use handoff_runtime::dtype::DataType;
use handoff_runtime::{Dims, Handoff, ImportInto, Stream};
use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The alignment XLA's CPU client needs for a zero-copy view of host memory.
pub const CPU_ALIGNMENT: usize = 64;

/// The alignment XLA's CUDA executables need of every buffer they read, whatever its
/// dtype (a view at another address is accepted by PJRT, then refused when the program
/// runs: "Address of buffer N must be a multiple of 10"). A view is checked against it
/// before anything runs; a tensor at a 4-byte offset into a flat buffer must be copied
/// by the caller first.
pub const GPU_ALIGNMENT: usize = 16;

/// Memory XLA on a client cannot read in place: its address and the alignment needed.
pub(crate) struct Misaligned {
    address: usize,
    align: usize,
    gpu: bool,
}

impl Misaligned {
    /// `Some` when XLA on `client` cannot read memory at `address` in place and no copy
    /// is allowed (`allow_copy` copies host memory only: on CUDA the caller copies).
    pub(crate) fn refused(client: &Client, address: usize, allow_copy: bool) -> Option<Misaligned> {
        let gpu = client.is_gpu();
        let align = if gpu { GPU_ALIGNMENT } else { CPU_ALIGNMENT };
        (!address.is_multiple_of(align) && (gpu || !allow_copy)).then_some(Misaligned { address, align, gpu })
    }

    /// Where the address is.
    pub(crate) fn got(&self) -> String {
        format!(
            "{:#x} ({} bytes past a {}-byte boundary)",
            self.address,
            self.address % self.align,
            self.align
        )
    }

    /// What XLA takes instead.
    pub(crate) fn needed(&self) -> String {
        if self.gpu {
            format!(
                "{}-byte aligned memory on CUDA (XLA's executables read no other; copy the tensor first)",
                self.align
            )
        } else {
            format!(
                "{}-byte aligned host memory (XLA's CPU client views no other), or a copy: ViewOptions::allow_copy(), \
                 CallOptions::allow_copy()",
                self.align
            )
        }
    }
}

/// Options of [`Client::import_with`].
///
/// ```
/// let o = handoff_xla::ViewOptions::default().allow_copy().watched();
/// assert!(o.allow_copy && o.watch);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ViewOptions {
    /// Copy host memory that XLA cannot view (not 64-byte aligned) instead of
    /// refusing it. The copy is counted in `stats` and marked `IS_COPIED`.
    pub allow_copy: bool,
    /// The device to view the memory on, by index (default: the device the
    /// hand-off names; on CPU device 0).
    pub device: Option<usize>,
    /// Give the view a [`ViewWatch`] ([`Buffer::view_watch`]), which says when PJRT
    /// let go of the memory: one allocation more per view, shared with PJRT's
    /// callback. Without it, the callback releases the hand-off itself.
    pub watch: bool,
}

impl ViewOptions {
    /// Gives the view a [`ViewWatch`].
    pub fn watched(mut self) -> Self {
        self.watch = true;
        self
    }

    /// Allows a copy when a zero-copy view is impossible.
    pub fn allow_copy(mut self) -> Self {
        self.allow_copy = true;
        self
    }

    /// Views the memory on the device at `index`.
    pub fn on_device(mut self, index: usize) -> Self {
        self.device = Some(index);
        self
    }
}

/// Host memory aligned to [`CPU_ALIGNMENT`], owned by a copied import.
pub(crate) struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: plain owned memory.
unsafe impl Send for Aligned {}

impl Aligned {
    fn copy_of(src: *const u8, len: usize) -> Result<Aligned> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), CPU_ALIGNMENT)
            .map_err(|e| XlaError::invalid("copy size", len, e.to_string()))?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(XlaError::invalid("copy size", len, "the allocation failed"));
        }
        // SAFETY: `src` holds `len` readable bytes (a validated host hand-off) and
        // `ptr` has room for them; they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, ptr, len) };
        handoff_runtime::stats::count_copy(len as u64);
        Ok(Aligned { ptr, layout })
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `copy_of`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// What a view's `on_delete_callback` releases, shared with the view's
/// [`ViewWatch`]: the owner of the viewed memory and whether it was released, in one
/// allocation per view.
struct ViewOwner<K> {
    /// Taken and dropped by the callback alone, once.
    keep_alive: UnsafeCell<Option<K>>,
    released: AtomicBool,
}

// SAFETY: `keep_alive` (a `Send` value) is only touched by the callback, once, on
// whatever thread PJRT runs it; everyone else reads `released`, an atomic.
unsafe impl<K: Send> Sync for ViewOwner<K> {}

impl<K: Send> Released for ViewOwner<K> {
    fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }
}

/// PJRT's `on_delete_callback` of a view whose owner is a `K`: releases it. Runs on
/// whatever thread PJRT deletes the buffer on; never unwinds.
unsafe extern "C" fn on_delete<K: Send + 'static>(_data: *mut c_void, user_arg: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if user_arg.is_null() {
            return;
        }
        // SAFETY: `user_arg` is the reference to the `ViewOwner<K>` that `view` gave
        // PJRT, and PJRT calls this exactly once.
        let owner = unsafe { Arc::from_raw(user_arg as *const ViewOwner<K>) };
        // SAFETY: the callback alone touches `keep_alive`, and it runs once.
        drop(unsafe { (*owner.keep_alive.get()).take() });
        owner.released.store(true, Ordering::SeqCst);
    }));
}

/// PJRT's `on_delete_callback` of a view that owns its hand-off directly (a kernel
/// call's input, a view without a watch): releases it as dropping it would. Runs on whatever thread PJRT
/// deletes the buffer on; never unwinds.
unsafe extern "C" fn release_handoff(_data: *mut c_void, user_arg: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if !user_arg.is_null() {
            // SAFETY: `user_arg` is the hand-off `ViewOf::into_raw_view` gave up with
            // `into_raw`, and PJRT calls this exactly once.
            unsafe { Handoff::release_raw(user_arg.cast()) }
        }
    }));
}

impl Client {
    /// Imports a hand-off as a zero-copy PJRT buffer (see [`exchange`]).
    ///
    /// [`exchange`]: crate::exchange
    ///
    /// ```no_run
    /// use handoff_xla::Client;
    /// use handoff_runtime::{Device, Handoff, Ready, Release, Stream, TensorDesc, dtype::DataType};
    /// #[repr(align(64))]
    /// struct Block([f32; 16]);
    /// let client = Client::from_env()?;
    /// let block = Box::new(Block([1.0; 16]));
    /// let h = Handoff::with_keep_alive(block, |b| {
    ///     Ok(TensorDesc::new(b.0.as_ptr() as *mut _, Device::Host, DataType::F32, &[16][..]))
    /// }, &Stream::host(), Ready::Elided, Release::AfterConsumer)?;
    /// let x = client.import(h)?; // a view: no copy
    /// # Ok::<(), handoff_xla::XlaError>(())
    /// ```
    pub fn import(&self, handoff: Handoff) -> Result<Buffer> {
        self.import_with(handoff, ViewOptions::default())
    }

    /// Imports a hand-off, with options (counted in `stats` as an import).
    pub fn import_with(&self, handoff: Handoff, options: ViewOptions) -> Result<Buffer> {
        import(self, handoff, options)
    }

    /// The index of the device a hand-off of `memory` is viewed on: `index` when
    /// given, else the device `memory` names (device 0 for host memory).
    pub(crate) fn device_index_for(
        &self,
        memory: handoff_runtime::Device,
        index: Option<usize>,
    ) -> Result<usize> {
        let i = match (memory, index) {
            (_, Some(i)) => self.checked_index(i)?,
            (handoff_runtime::Device::Host, None) => self.checked_index(0)?,
            (handoff_runtime::Device::Cuda(n), None) => self.index_of_ordinal(n)?,
            (other, None) => {
                return Err(XlaError::invalid(
                    "hand-off device",
                    other,
                    "XLA takes host and CUDA memory only",
                ));
            }
        };
        let want = self.inner.handoff_device(i);
        if memory != want {
            return Err(XlaError::from(handoff_runtime::Error::CrossDevice { from: memory, to: want }));
        }
        Ok(i)
    }
}

/// [`Client::import_with`]: a view of the hand-off's memory (see the module docs),
/// counted in `stats` as an import.
pub(crate) fn import(client: &Client, handoff: Handoff, options: ViewOptions) -> Result<Buffer> {
    let buffer = match prepare(client, handoff, options)? {
        Viewable::Handoff(v) if !options.watch => v.into_raw_view(client).map(|v| v.into_buffer(client)),
        Viewable::Handoff(v) => v.into_buffer(client),
        Viewable::Copy(v) => v.into_buffer(client),
    }?;
    handoff_runtime::stats::count_import();
    Ok(buffer)
}

/// What a view is made of: memory checked and ordered for PJRT to read, and what
/// keeps it alive until PJRT lets go of the view. Made by [`prepare`] alone.
pub(crate) struct ViewOf<K> {
    memory: Memory,
    keep_alive: K,
}

/// The memory of a [`ViewOf`], as PJRT is told of it.
struct Memory {
    device: usize,
    data: *mut c_void,
    dtype: DataType,
    pjrt_type: std::ffi::c_int,
    shape: Dims,
    /// The stream PJRT orders the view's first use after (0 on CPU).
    stream: isize,
    copied: bool,
}

/// A hand-off [`prepare`]d for a view: of its own memory, or of an aligned copy.
pub(crate) enum Viewable {
    Handoff(ViewOf<Handoff>),
    Copy(ViewOf<Aligned>),
}

/// Checks the hand-off for a view by `client` and orders it before XLA's ready
/// stream (GPU); copies host memory XLA cannot view when `options` allow it.
/// Inlined: what it returns is moved straight on to the view's PJRT call, not copied
/// through the stack.
#[inline(always)]
pub(crate) fn prepare(client: &Client, handoff: Handoff, options: ViewOptions) -> Result<Viewable> {
    let dtype = handoff.dtype();
    let t = dtype::to_pjrt(dtype).ok_or_else(|| {
        XlaError::invalid(
            "hand-off dtype",
            handoff_runtime::dtype::name(dtype),
            "PJRT has no buffer type for it",
        )
    })?;
    if !handoff.is_contiguous() {
        return Err(XlaError::invalid(
            "hand-off strides",
            format!("{:?} for shape {:?}", handoff.strides(), handoff.shape()),
            "XLA views take compact row-major memory only; make the tensor contiguous first",
        ));
    }
    let shape = Dims::from(handoff.shape());
    let device = client.device_index_for(handoff.device(), options.device)?;
    let data = handoff.data_ptr();
    let memory = |data: *mut u8, stream, copied| Memory {
        device,
        data: data.cast(),
        dtype,
        pjrt_type: t,
        shape: shape.clone(),
        stream,
        copied,
    };
    if let Some(m) = Misaligned::refused(client, data as usize, options.allow_copy) {
        return Err(XlaError::invalid("hand-off data pointer", m.got(), format!("XLA takes {}", m.needed())));
    }
    if client.is_gpu() {
        // The client is held for the whole import: no handle of the stream is made.
        let ready = cached_ready_stream(client, device)?;
        // The producer made the data ready on the hand-off's consumer stream: order
        // XLA's ready stream after it, unless the producer exported to it directly
        // (then it is already ordered, and `order` is not called a second time).
        if handoff.consumer_stream() != ready {
            handoff_runtime::order(Some(handoff.consumer_stream()), ready)?;
        }
        // The hand-off is validated device memory of `device`, compact, of `shape`
        // and `dtype`, ready before work on `ready`.
        let memory = memory(data, ready.raw() as isize, false);
        return Ok(Viewable::Handoff(ViewOf { memory, keep_alive: handoff }));
    }
    // Host memory for the CPU client: no device work to order (stream 0 on CPU).
    if (data as usize).is_multiple_of(CPU_ALIGNMENT) {
        return Ok(Viewable::Handoff(ViewOf { memory: memory(data, 0, false), keep_alive: handoff }));
    }
    // Not viewable, and a copy allowed (else refused above).
    let copy = Aligned::copy_of(data, handoff.num_bytes())?;
    drop(handoff);
    // `copy` owns `num_bytes` aligned bytes holding the array.
    Ok(Viewable::Copy(ViewOf { memory: memory(copy.ptr, 0, true), keep_alive: copy }))
}

impl Memory {
    /// `PJRT_Client_CreateViewOfDeviceBuffer` of the memory, with `on_delete(ctx)`
    /// called once PJRT lets go of it.
    fn create(
        &self,
        client: &Client,
        on_delete: unsafe extern "C" fn(*mut c_void, *mut c_void),
        ctx: *mut c_void,
    ) -> Result<*mut crate::sys::PJRT_Buffer> {
        // SAFETY: `prepare` checked that `data` is memory of `device` holding a
        // compact array of `shape` and `dtype`, ordered before work on `stream`; the
        // caller keeps it alive (through `ctx`) until `on_delete`.
        unsafe {
            result::client::create_view_of_device_buffer(
                client.inner.api(),
                client.inner.raw,
                client.inner.devices[self.device].raw,
                self.data,
                self.pjrt_type,
                &self.shape,
                self.stream,
                on_delete,
                ctx,
            )
        }
    }
}

impl<K: Send + 'static> ViewOf<K> {
    /// A shared buffer over the memory, whose [`ViewWatch`] says when PJRT let go.
    pub(crate) fn into_buffer(self, client: &Client) -> Result<Buffer> {
        let owner = Arc::new(ViewOwner {
            keep_alive: UnsafeCell::new(Some(self.keep_alive)),
            released: AtomicBool::new(false),
        });
        let watch = ViewWatch(owner.clone());
        let ctx = Arc::into_raw(owner);
        let m = self.memory;
        match m.create(client, on_delete::<K>, ctx as *mut c_void) {
            // SAFETY: an owned buffer of this client, just made with this dtype, shape
            // and device (no need to ask PJRT for them again).
            Ok(raw) => Ok(unsafe {
                Buffer::from_parts(
                    client.inner.clone(),
                    raw,
                    m.dtype,
                    &m.shape,
                    m.device,
                    m.copied,
                    Some(watch),
                )
            }),
            Err(e) => {
                // SAFETY: on error PJRT did not take `ctx`: the reference is still
                // ours, given back once.
                drop(unsafe { Arc::from_raw(ctx) });
                Err(e)
            }
        }
    }
}

impl ViewOf<Handoff> {
    /// A bare view over the hand-off's memory: PJRT's `on_delete_callback` releases
    /// the hand-off itself, with nothing allocated around it (a kernel call's input,
    /// or a shared [`Buffer`] without a watch).
    #[inline(always)]
    pub(crate) fn into_raw_view(self, client: &Client) -> Result<BareView> {
        let ctx = self.keep_alive.into_raw();
        match self.memory.create(client, release_handoff, ctx.cast()) {
            Ok(raw) => Ok(BareView { raw: RawBuffer { api: client.inner.api(), raw }, memory: self.memory }),
            Err(e) => {
                // SAFETY: on error PJRT did not take `ctx`: the hand-off is still ours,
                // released once.
                unsafe { Handoff::release_raw(ctx) };
                Err(e)
            }
        }
    }
}

/// A view PJRT made over a hand-off's memory, owning the hand-off through its
/// callback, with what it was made of.
pub(crate) struct BareView {
    pub(crate) raw: RawBuffer,
    memory: Memory,
}

impl BareView {
    /// The view as a shared buffer, without a watch.
    fn into_buffer(self, client: &Client) -> Buffer {
        let raw = std::mem::ManuallyDrop::new(self.raw).raw;
        let m = self.memory;
        // SAFETY: an owned buffer of this client (taken out of `RawBuffer`, which is
        // not dropped), just made with this dtype, shape and device.
        unsafe { Buffer::from_parts(client.inner.clone(), raw, m.dtype, &m.shape, m.device, m.copied, None) }
    }
}

/// XLA buffers import into a [`Client`]: the value is made ready on the client's
/// [`ready_stream`](Client::ready_stream) for its device and viewed there, without a
/// copy ([`Client::import`]).
///
/// ```no_run
/// use handoff_runtime::transfer_into;
/// use handoff_xla::{Buffer, Client};
/// let (a, b) = (Client::from_env()?, Client::from_env()?);
/// let x = a.buffer_from_host(&a.device(0)?, &[1.0f32, 2.0], &[2])?;
/// let y: Buffer = transfer_into(&x, &b)?; // x's memory, viewed by client b
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl ImportInto<Client> for Buffer {
    fn ready_stream(client: &Client, device: handoff_runtime::Device) -> handoff_runtime::Result<Stream> {
        // By index: an `XlaDevice` would count one more reference to the client.
        Ok(ready_stream_at(client, client.device_index_for(device, None)?)?)
    }

    fn import_into(handoff: Handoff, client: &Client) -> handoff_runtime::Result<Buffer> {
        Ok(client.import(handoff)?)
    }
}
