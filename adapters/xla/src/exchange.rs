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

use crate::buffer::{Buffer, OutputBuffer, RawBuffer, Released, ViewWatch, ready_event_of};
use crate::client::{Client, ClientInner, XlaDevice};
use crate::dtype;
use crate::error::{Result, XlaError};
use crate::result;
use handoff_runtime::dtype::DataType;
use handoff_runtime::{
    Dims, Export, Exportable, Handoff, ImportInto, Ready, Release, Stream, StreamOrdered, TensorDesc,
};
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
    /// The stream a producer must make its data ready on before XLA reads it on
    /// `device` (CUDA: the stream extension's `get_stream_for_external_ready_events`,
    /// asked of PJRT once per device). Export a value to this stream to hand it to
    /// [`Client::import`] with no extra wait. On CPU it is the host stream.
    pub fn ready_stream(&self, device: &XlaDevice) -> Result<Stream> {
        ready_stream(self, device)
    }

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

/// [`Client::ready_stream`]: the stream XLA reads hand-offs on for `device`, asked of
/// PJRT once per device and cached in the client.
pub(crate) fn ready_stream(client: &Client, device: &XlaDevice) -> Result<Stream> {
    ready_stream_at(client, device.index)
}

/// [`ready_stream`] of the client's device `index`.
fn ready_stream_at(client: &Client, index: usize) -> Result<Stream> {
    let ready = cached_ready_stream(client, index)?;
    if ready.is_host() {
        return Ok(ready.clone());
    }
    // Each handle given out keeps the client, which owns the stream, through a holder
    // of its own: cloning the handle (as every hand-off to it does) counts on the
    // holder, not on the client, whose count every buffer's birth and death touch.
    let holder: std::sync::Arc<std::sync::Arc<crate::client::ClientInner>> =
        std::sync::Arc::new(client.inner.clone());
    Ok(ready.clone().with_owner(holder))
}

/// The cached ready stream of `device`, without an owner (the cache cannot hold the
/// client: that would keep it alive forever): for use while the caller holds the
/// client. The host stream when the plugin has no stream extension (CPU).
fn cached_ready_stream(client: &Client, device: usize) -> Result<&Stream> {
    static HOST: std::sync::OnceLock<Stream> = std::sync::OnceLock::new();
    let Some(ext) = client.plugin().stream_extension() else { return Ok(HOST.get_or_init(Stream::host)) };
    let cache = &client.inner.ready_streams[device];
    if let Some(s) = cache.get() {
        return Ok(s);
    }
    let raw_device = client.inner.devices[device].raw;
    // SAFETY: this plugin's stream extension and a live device.
    let raw =
        unsafe { result::stream::get_stream_for_external_ready_events(client.inner.api(), ext, raw_device)? };
    let stream = cuda_stream(client.inner.ordinal(device), raw as u64)?;
    Ok(cache.get_or_init(|| stream))
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

/// The keep-alive of an exported buffer: an external reference, given back on drop.
struct ExternalRef {
    buffer: Buffer,
}

impl Drop for ExternalRef {
    fn drop(&mut self) {
        let inner = &self.buffer.inner;
        let _serial = inner.external_refs.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the reference was increased in `Export::export`, and the buffer is
        // alive (held here), so the decrease matches it exactly once.
        let decreased =
            unsafe { result::buffer::decrease_external_reference_count(inner.client.api(), inner.raw) };
        if let Err(e) = decreased {
            eprintln!("handoff-xla: giving back an external reference failed: {e}");
        }
    }
}

/// Makes the data of `raw` (a live buffer of `client` on its device `device`)
/// visible to work enqueued on `consumer` from now on. CUDA: the stream extension's
/// `wait_until_buffer_ready_on_stream` (no host wait), then, when `consumer` captures
/// a graph, the capture settled (`crate::capture`). CPU (`consumer` the host): nothing
/// if the data is ready, else a counted host wait. Also says whether `consumer`
/// captures: the caller then keeps the buffer with the graph.
fn ready_on(
    client: &ClientInner,
    raw: *mut crate::sys::PJRT_Buffer,
    device: usize,
    consumer: &Stream,
) -> handoff_runtime::Result<(Ready, bool)> {
    let api = client.api();
    match client.plugin.stream_extension() {
        Some(ext) => {
            let stream = consumer_raw(consumer, client, device)?;
            // SAFETY: this plugin's extension, a live buffer and a stream of its device.
            unsafe { result::stream::wait_until_buffer_ready_on_stream(api, ext, raw, stream as isize)? };
            handoff_runtime::stats::count_wait_enqueued();
            #[cfg(feature = "cuda")]
            let captured = crate::capture::settle(client, device, consumer)?;
            #[cfg(not(feature = "cuda"))]
            let captured = false;
            Ok((Ready::Waited, captured))
        }
        None => {
            if !consumer.is_host() {
                return Err(handoff_runtime::Error::CrossDevice {
                    from: handoff_runtime::Device::Host,
                    to: consumer.device(),
                });
            }
            // SAFETY: a live buffer of this client's plugin.
            let ev = unsafe { ready_event_of(api, raw) }?;
            match ev.status()? {
                Some(status) => {
                    handoff_runtime::stats::count_wait_elided();
                    status?;
                    Ok((Ready::Elided, false))
                }
                None => {
                    ev.wait()?;
                    Ok((Ready::HostSynced, false))
                }
            }
        }
    }
}

/// The memory of `raw` (a live buffer of `client` on its device `device`): PJRT's
/// device pointer, compact row-major. Never `IS_COPIED`: the memory is the buffer's.
fn describe<'a>(
    client: &ClientInner,
    raw: *mut crate::sys::PJRT_Buffer,
    device: usize,
    dtype: DataType,
    shape: &'a [i64],
) -> handoff_runtime::Result<TensorDesc<'a>> {
    // SAFETY: a live buffer (the caller's).
    let data = unsafe { result::buffer::opaque_device_memory_data_pointer(client.api(), raw) }?;
    Ok(TensorDesc::new(data, client.handoff_device(device), dtype, shape))
}

impl StreamOrdered for Buffer {
    fn device(&self) -> handoff_runtime::Device {
        self.inner.client.handoff_device(self.inner.device)
    }

    /// `None`: PJRT does not name the stream an execution writes on; [`ready_on`]
    /// asks PJRT itself to order the consumer after the buffer's definition.
    ///
    /// [`ready_on`]: StreamOrdered::ready_on
    fn stream(&self) -> Option<Stream> {
        None
    }

    /// Makes the buffer's data visible to work enqueued on `consumer` from now on.
    /// CUDA: the stream extension's `wait_until_buffer_ready_on_stream` (no host
    /// wait). CPU (`consumer` the host): nothing if the data is ready, else a counted
    /// host wait.
    /// When `consumer` captures a graph, a share of the buffer is kept with the graph.
    fn ready_on(&self, consumer: &Stream) -> handoff_runtime::Result<Ready> {
        let (ready, captured) = ready_on(&self.inner.client, self.inner.raw, self.inner.device, consumer)?;
        if captured {
            handoff_runtime::graph::keep(consumer, self.clone())?;
        }
        Ok(ready)
    }
}

impl Export for Buffer {
    /// The buffer's memory: PJRT's device pointer, compact row-major. Its memory is
    /// shared with the buffer (and other exports), so it is never marked `IS_COPIED`,
    /// even for a buffer made from a copy.
    fn describe(&self) -> handoff_runtime::Result<TensorDesc<'_>> {
        let b = &self.inner;
        describe(&b.client, b.raw, b.device, b.dtype, &b.shape)
    }

    /// Exports the buffer as a zero-copy [`Handoff`] made ready on `consumer` (see
    /// the module docs). The buffer's memory is kept (an external reference and a
    /// share of the buffer) until the consumer's queued work is done.
    ///
    /// ```no_run
    /// use handoff_runtime::{Export, Stream};
    /// let client = handoff_xla::Client::from_env()?;
    /// let x = client.buffer_from_host(&client.device(0)?, &[1.0f32, 2.0], &[2])?;
    /// let h = x.clone().export(&Stream::host())?;
    /// assert_eq!(h.data_ptr() as *mut _, x.device_pointer()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn export(self, consumer: &Stream) -> handoff_runtime::Result<Handoff> {
        let ready = self.ready_on(consumer)?;
        self.export_ready(consumer, ready)
    }
}

impl Buffer {
    /// [`Export::export`] once the buffer is ready on `consumer` (`ready` says how).
    fn export_ready(self, consumer: &Stream, ready: Ready) -> handoff_runtime::Result<Handoff> {
        {
            let _serial = self.inner.external_refs.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: live buffer; matched by `ExternalRef`'s drop.
            unsafe { result::buffer::increase_external_reference_count(self.api(), self.raw()) }?;
        }
        let keep = ExternalRef { buffer: self };
        Handoff::with_keep_alive(keep, |k| k.buffer.describe(), consumer, ready, Release::AfterConsumer)
    }
}

impl StreamOrdered for OutputBuffer {
    fn device(&self) -> handoff_runtime::Device {
        self.client().handoff_device(self.device_index())
    }

    /// `None`, as for a [`Buffer`].
    fn stream(&self) -> Option<Stream> {
        None
    }

    /// As [`Buffer`]'s, but it keeps nothing with a graph: the output's export does.
    fn ready_on(&self, consumer: &Stream) -> handoff_runtime::Result<Ready> {
        ready_on(self.client(), self.raw(), self.device_index(), consumer).map(|(ready, _)| ready)
    }
}

impl Export for OutputBuffer {
    /// The output's memory, as [`Buffer`]'s.
    fn describe(&self) -> handoff_runtime::Result<TensorDesc<'_>> {
        describe(self.client(), self.raw(), self.device_index(), self.dtype(), self.shape())
    }

    /// Exports the output as a zero-copy [`Handoff`] made ready on `consumer`. It is
    /// the buffer's one owner, so no external reference is taken: the hand-off owns
    /// the buffer, destroyed once the consumer's queued work is done. When `consumer`
    /// captures a graph, the output becomes a shared [`Buffer`], one
    /// share kept with the graph (every replay writes it) and one exported.
    fn export(self, consumer: &Stream) -> handoff_runtime::Result<Handoff> {
        let (ready, captured) = ready_on(self.client(), self.raw(), self.device_index(), consumer)?;
        if captured {
            let shared = self.into_buffer();
            handoff_runtime::graph::keep(consumer, shared.clone())?;
            return shared.export_ready(consumer, ready);
        }
        // The hand-off keeps the raw buffer and its client alone, not the description.
        let (owned, dtype, shape, device) = self.into_parts();
        let desc = describe(&owned.client, owned.raw, device, dtype, &shape)?;
        Handoff::from_desc(owned, &desc, consumer, ready, Release::AfterConsumer)
    }
}

/// The marker of handoff-xla's [`Exportable`] impl for `&Buffer` (inferred, never written).
pub enum Borrowed {}

/// A borrowed buffer exports a shared handle of itself (nothing is copied).
impl Exportable<Borrowed> for &Buffer {
    type Value = Buffer;

    fn into_exportable(self) -> handoff_runtime::Result<Buffer> {
        Ok(self.clone())
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

/// A stream PJRT gave for a device (callers attach the client that owns it).
#[cfg(feature = "cuda")]
fn cuda_stream(ordinal: u32, raw: u64) -> Result<Stream> {
    // SAFETY: a stream of the device's primary context (XLA's CUDA plugin uses it),
    // owned by the client, which every handle given out keeps alive.
    Ok(unsafe { handoff_runtime::cuda::stream(ordinal, raw) }?)
}

#[cfg(not(feature = "cuda"))]
fn cuda_stream(ordinal: u32, raw: u64) -> Result<Stream> {
    Err(XlaError::invalid(
        "CUDA stream",
        format!("cuda:{ordinal} {raw:#x}"),
        "handoff-xla was built without its `cuda` feature, which GPU hand-offs need",
    ))
}

#[cfg(feature = "cuda")]
fn consumer_raw(consumer: &Stream, client: &ClientInner, device: usize) -> Result<u64> {
    match handoff_runtime::cuda::raw_stream(consumer) {
        Some((ordinal, raw)) if ordinal == client.ordinal(device) => Ok(raw),
        _ => Err(XlaError::from(handoff_runtime::Error::CrossDevice {
            from: client.handoff_device(device),
            to: consumer.device(),
        })),
    }
}

#[cfg(not(feature = "cuda"))]
fn consumer_raw(consumer: &Stream, client: &ClientInner, device: usize) -> Result<u64> {
    Err(XlaError::invalid(
        "consumer stream",
        format!("{consumer:?}"),
        format!("exporting from {:?} needs handoff-xla's `cuda` feature", client.handoff_device(device)),
    ))
}
