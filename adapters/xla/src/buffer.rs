//! Device buffers and PJRT events (RAII: each destroyed exactly once).

use crate::client::{Client, ClientInner, XlaDevice};
use crate::dtype;
use crate::error::{Result, XlaError};
use crate::result::{self, Api};
use crate::sys;
use handoff_runtime::dtype::{DataType, Element};
use handoff_runtime::stats;
use std::sync::Arc;

/// A PJRT event, destroyed on drop.
pub struct PjrtEvent {
    api: Api,
    raw: *mut sys::PJRT_Event,
}

// SAFETY: PJRT events are thread-safe handles.
unsafe impl Send for PjrtEvent {}
// SAFETY: as above.
unsafe impl Sync for PjrtEvent {}

impl PjrtEvent {
    /// Takes ownership of a raw event (null gives `None`).
    ///
    /// # Safety
    /// `raw` must be null or an owned event of `api`'s plugin.
    pub(crate) unsafe fn from_raw(api: Api, raw: *mut sys::PJRT_Event) -> Option<PjrtEvent> {
        (!raw.is_null()).then_some(PjrtEvent { api, raw })
    }

    /// Whether it is ready. Never blocks.
    pub fn is_ready(&self) -> Result<bool> {
        // SAFETY: live until drop.
        unsafe { result::event::is_ready(self.api, self.raw) }
    }

    /// Blocks the host until it is ready (a counted host sync) and returns its status.
    pub fn wait(&self) -> Result<()> {
        // SAFETY: live until drop.
        stats::host_sync(|| unsafe { result::event::wait(self.api, self.raw) })
    }

    /// Its status, if ready: `None` while pending. Never blocks.
    pub fn status(&self) -> Result<Option<Result<()>>> {
        if !self.is_ready()? {
            return Ok(None);
        }
        // SAFETY: live and ready.
        Ok(Some(unsafe { result::event::error(self.api, self.raw) }))
    }
}

impl Drop for PjrtEvent {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once.
        if let Err(e) = unsafe { result::event::destroy(self.api, self.raw) } {
            eprintln!("handoff-xla: destroying a PJRT event failed: {e}");
        }
    }
}

/// Whether a view's foreign memory has been given back by PJRT (its
/// `on_delete_callback` ran and the owner was released).
#[derive(Clone)]
pub struct ViewWatch(pub(crate) Arc<dyn Released>);

/// What a [`ViewWatch`] asks of the view's owner.
pub(crate) trait Released: Send + Sync {
    fn is_released(&self) -> bool;
}

impl ViewWatch {
    /// Whether PJRT has called `on_delete_callback` and the owner was released.
    pub fn is_released(&self) -> bool {
        self.0.is_released()
    }
}

impl std::fmt::Debug for ViewWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewWatch").field("released", &self.is_released()).finish()
    }
}

pub(crate) struct BufferInner {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut sys::PJRT_Buffer,
    pub(crate) device: usize,
    pub(crate) dtype: DataType,
    pub(crate) shape: handoff_runtime::Dims,
    pub(crate) copied: bool,
    pub(crate) view: Option<ViewWatch>,
    /// Serializes the external-reference count changes of this buffer: the C API
    /// keeps them in a plain list per `PJRT_Buffer`, and exports (on the caller's
    /// thread) and releases (on the reaper's) of one buffer can overlap.
    pub(crate) external_refs: std::sync::Mutex<()>,
}

// SAFETY: PJRT buffers are thread-safe handles; the external-reference list, which
// is not, is only changed under `external_refs`.
unsafe impl Send for BufferInner {}
// SAFETY: as above.
unsafe impl Sync for BufferInner {}

impl Drop for BufferInner {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once; exported hand-offs hold this Arc, so their
        // external references were all given back before.
        if let Err(e) = unsafe { result::buffer::destroy(self.client.api(), self.raw) } {
            eprintln!("handoff-xla: destroying a PJRT buffer failed: {e}");
        }
    }
}

/// A PJRT buffer on one device. Cheap to clone (shared); destroyed when the last
/// clone, and the last hand-off exported from it, are gone.
///
/// ```no_run
/// use handoff_xla::Client;
/// use handoff_runtime::dtype::DataType;
/// let client = Client::from_env()?;
/// let x = client.buffer_from_host(&client.device(0)?, &[1.0f32, 2.0, 3.0], &[3])?;
/// assert_eq!(x.dtype(), DataType::F32);
/// assert_eq!(x.to_vec::<f32>()?, [1.0, 2.0, 3.0]);
/// # Ok::<(), handoff_xla::XlaError>(())
/// ```
#[derive(Clone)]
pub struct Buffer {
    pub(crate) inner: Arc<BufferInner>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer({}{:?} on {:?})",
            handoff_runtime::dtype::name(self.dtype()),
            self.shape(),
            self.device()
        )
    }
}

impl Buffer {
    /// Takes ownership of a raw buffer of `client` whose element type, dimensions and
    /// device the caller knows (it made the buffer, or they are the program's output
    /// signature): no PJRT query.
    ///
    /// # Safety
    /// `raw` must be an owned, live buffer of `client` of that dtype and shape on the
    /// client's device at `device`.
    pub(crate) unsafe fn from_parts(
        client: Arc<ClientInner>,
        raw: *mut sys::PJRT_Buffer,
        dtype: DataType,
        shape: &[i64],
        device: usize,
        copied: bool,
        view: Option<ViewWatch>,
    ) -> Buffer {
        Buffer {
            inner: Arc::new(BufferInner {
                client,
                raw,
                device,
                dtype,
                shape: shape.into(),
                copied,
                view,
                external_refs: std::sync::Mutex::new(()),
            }),
        }
    }

    pub(crate) fn api(&self) -> Api {
        self.inner.client.api()
    }

    /// The raw handle (owned by `self`).
    pub(crate) fn raw(&self) -> *mut sys::PJRT_Buffer {
        self.inner.raw
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.inner.dtype
    }

    /// The dimensions.
    pub fn shape(&self) -> &[i64] {
        &self.inner.shape
    }

    /// The number of elements.
    pub fn num_elements(&self) -> usize {
        self.inner.shape.iter().map(|&d| d as usize).product()
    }

    /// The bytes of the dense array.
    pub fn num_bytes(&self) -> usize {
        (self.num_elements() * self.dtype().bits as usize).div_ceil(8)
    }

    /// The device it is on.
    pub fn device(&self) -> XlaDevice {
        XlaDevice { client: self.inner.client.clone(), index: self.inner.device }
    }

    /// The client.
    pub fn client(&self) -> Client {
        Client { inner: self.inner.client.clone() }
    }

    /// Whether the buffer was made from a copy of foreign memory (an import that
    /// asked for one); its hand-offs then carry DLPack `IS_COPIED`.
    pub fn is_copied(&self) -> bool {
        self.inner.copied
    }

    /// For a view of foreign memory imported with [`ViewOptions::watched`]
    /// (or a copy of it): a handle telling whether PJRT gave it back.
    ///
    /// [`ViewOptions::watched`]: crate::ViewOptions::watched
    pub fn view_watch(&self) -> Option<ViewWatch> {
        self.inner.view.clone()
    }

    /// The buffer's ready event (the caller owns it).
    pub fn ready_event(&self) -> Result<PjrtEvent> {
        // SAFETY: a live buffer of this plugin.
        unsafe { ready_event_of(self.api(), self.raw()) }
    }

    /// Whether the buffer's data is ready. Never blocks.
    pub fn is_ready(&self) -> Result<bool> {
        self.ready_event()?.is_ready()
    }

    /// Blocks the host until the data is ready (a counted host sync).
    pub fn block_until_ready(&self) -> Result<()> {
        self.ready_event()?.wait()
    }

    /// PJRT's opaque device pointer of the data. It stays valid only while an
    /// external reference is held (an exported hand-off holds one).
    pub fn device_pointer(&self) -> Result<*mut std::ffi::c_void> {
        // SAFETY: live buffer.
        unsafe { result::buffer::opaque_device_memory_data_pointer(self.api(), self.raw()) }
    }

    /// The bytes the buffer takes on its device.
    pub fn on_device_size(&self) -> Result<usize> {
        // SAFETY: live buffer.
        unsafe { result::buffer::on_device_size_in_bytes(self.api(), self.raw()) }
    }

    /// Copies the data to the host (waits for it: a counted host sync).
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.on_device_size()?.max(self.num_bytes())];
        // SAFETY: live buffer; `out` outlives the wait below.
        let raw = unsafe { result::buffer::to_host_buffer(self.api(), self.raw(), &mut out)? };
        // SAFETY: an owned event of this plugin.
        if let Some(ev) = unsafe { PjrtEvent::from_raw(self.api(), raw) } {
            ev.wait()?;
        }
        out.truncate(self.num_bytes());
        Ok(out)
    }

    /// Copies the data to a host vector of `T` (a counted host sync).
    pub fn to_vec<T: Element + Copy + Default>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(XlaError::invalid(
                "to_vec element type",
                handoff_runtime::dtype::name(T::DTYPE),
                format!("the buffer holds {}", handoff_runtime::dtype::name(self.dtype())),
            ));
        }
        let bytes = self.to_host_bytes()?;
        let mut out = vec![T::default(); self.num_elements()];
        let n = std::mem::size_of_val(out.as_slice()).min(bytes.len());
        // SAFETY: `out` has room for `n` bytes; T is plain data of the buffer's type.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr() as *mut u8, n) };
        Ok(out)
    }
}

/// The ready event of a raw buffer (the caller owns it).
///
/// # Safety
/// `raw` must be a live buffer of `api`'s plugin.
pub(crate) unsafe fn ready_event_of(api: Api, raw: *mut sys::PJRT_Buffer) -> Result<PjrtEvent> {
    // SAFETY: forwarded; the returned event is ours.
    let event = unsafe { result::buffer::ready_event(api, raw)? };
    // SAFETY: an owned event of this plugin.
    unsafe { PjrtEvent::from_raw(api, event) }.ok_or_else(|| {
        XlaError::invalid("PJRT_Buffer_ReadyEvent.event", "null", "the plugin returned no event")
    })
}

/// The element type, dimensions and device index of a raw buffer, asked of PJRT.
///
/// # Safety
/// `raw` must be a live buffer of `client`.
pub(crate) unsafe fn query_parts(
    client: &ClientInner,
    raw: *mut sys::PJRT_Buffer,
) -> Result<(DataType, Vec<i64>, usize)> {
    let api = client.api();
    // SAFETY: live buffer (forwarded); the dims are copied out.
    let (t, shape) =
        unsafe { (result::buffer::element_type(api, raw)?, result::buffer::dimensions(api, raw)?) };
    let dtype = dtype::from_pjrt(t).ok_or_else(|| {
        XlaError::invalid("PJRT_Buffer_ElementType", t, "this element type has no DLPack code")
    })?;
    // SAFETY: live buffer; the device lives as long as the client.
    let dev = unsafe { result::buffer::device(api, raw)? };
    let index = client.devices.iter().position(|d| d.raw == dev).unwrap_or(0);
    Ok((dtype, shape, index))
}

/// A PJRT buffer with nothing around it, destroyed on drop: a kernel call's view of
/// an input, kept for the one execution (and the floor benchmark's bare buffers).
pub struct RawBuffer {
    pub(crate) api: Api,
    pub(crate) raw: *mut sys::PJRT_Buffer,
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once.
        if let Err(e) = unsafe { result::buffer::destroy(self.api, self.raw) } {
            eprintln!("handoff-xla: destroying a PJRT buffer failed: {e}");
        }
    }
}

/// One output of an execution, owned by the caller alone: what a kernel call's
/// [`Output`](crate::Output)s are made from. Turn it into a shared [`Buffer`]
/// ([`into_buffer`](Self::into_buffer)), or hand it off as it is: its export needs no
/// external reference (nothing else holds the buffer), and the buffer itself is
/// destroyed once the consumer's queued work is done.
///
/// ```no_run
/// use handoff_xla::{Buffer, Client, Kernel, OutputBuffers, Outputs};
/// /// A call's outputs as shared buffers, whatever their number.
/// struct All(Vec<Buffer>);
/// impl Outputs<()> for All {
///     const COUNT: Option<usize> = None;
///     fn from_outputs(outputs: OutputBuffers, _: &handoff_runtime::Stream) -> handoff_xla::Result<All> {
///         Ok(All(outputs.map(|o| o.into_buffer()).collect()))
///     }
/// }
/// ```
pub struct OutputBuffer {
    owned: Owned,
    dtype: DataType,
    shape: handoff_runtime::Dims,
    device: usize,
}

/// A raw buffer of a client and the client, destroyed on drop: what an exported
/// [`OutputBuffer`] keeps until its consumer is done.
pub(crate) struct Owned {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut sys::PJRT_Buffer,
}

// SAFETY: PJRT buffers are thread-safe handles, and this one is owned by one value.
unsafe impl Send for Owned {}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once (`OutputBuffer::into_buffer` skips this drop).
        if let Err(e) = unsafe { result::buffer::destroy(self.client.api(), self.raw) } {
            eprintln!("handoff-xla: destroying a PJRT buffer failed: {e}");
        }
    }
}

impl OutputBuffer {
    /// An execution's output, owned.
    ///
    /// # Safety
    /// `owned` must be a live buffer of that dtype and shape on its client's device at
    /// `device`.
    pub(crate) unsafe fn from_owned(
        owned: Owned,
        dtype: DataType,
        shape: &[i64],
        device: usize,
    ) -> OutputBuffer {
        OutputBuffer { owned, dtype, shape: shape.into(), device }
    }

    /// A shared buffer of it.
    pub fn into_buffer(self) -> Buffer {
        let owned = std::mem::ManuallyDrop::new(self.owned);
        // SAFETY: `owned` is never dropped, so the client is moved out once and the raw
        // buffer is owned by the `Buffer` alone.
        let client = unsafe { std::ptr::read(&owned.client) };
        // SAFETY: an owned buffer of this client, of these parts.
        unsafe { Buffer::from_parts(client, owned.raw, self.dtype, &self.shape, self.device, false, None) }
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The dimensions.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    pub(crate) fn client(&self) -> &ClientInner {
        &self.owned.client
    }

    pub(crate) fn raw(&self) -> *mut sys::PJRT_Buffer {
        self.owned.raw
    }

    pub(crate) fn device_index(&self) -> usize {
        self.device
    }

    /// Its parts: the raw buffer with its client (what an export keeps until its
    /// consumer is done), the element type, the dimensions and the device index.
    pub(crate) fn into_parts(self) -> (Owned, DataType, handoff_runtime::Dims, usize) {
        (self.owned, self.dtype, self.shape, self.device)
    }
}

impl std::fmt::Debug for OutputBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OutputBuffer({}{:?})", handoff_runtime::dtype::name(self.dtype), self.shape())
    }
}

/// A scalar `i32` buffer holding `index` on `device`: the platform-index argument of
/// a multi-platform `jax.export` artifact. Made from static memory, which outlives any
/// transfer, so nothing waits for the copy.
pub(crate) fn platform_index_buffer(client: &Client, device: &XlaDevice, index: usize) -> Result<Buffer> {
    static INDICES: [i32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
    let value = INDICES
        .get(index)
        .ok_or_else(|| XlaError::invalid("platform index", index, "artifacts name at most 8 platforms"))?;
    // SAFETY: `value` is static, so it outlives the transfer whenever it completes;
    // a scalar has no dimensions. Dropping the done event does not wait.
    let (buffer, _done) =
        unsafe { upload(client, device, value as *const i32 as *const _, DataType::I32, &[]) }?;
    Ok(buffer)
}

impl Client {
    /// Copies a host array to a new buffer on `device` (waits for the copy to be
    /// done with `data`: a counted host sync).
    pub fn buffer_from_host<T: Element + Copy>(
        &self,
        device: &XlaDevice,
        data: &[T],
        shape: &[i64],
    ) -> Result<Buffer> {
        from_host(self, device, data, shape)
    }
}

/// [`Client::buffer_from_host`]: copies a host array to a new buffer on `device`
/// (waits for the copy to be done with `data`: a counted host sync).
pub(crate) fn from_host<T: Element + Copy>(
    client: &Client,
    device: &XlaDevice,
    data: &[T],
    shape: &[i64],
) -> Result<Buffer> {
    let elements: i64 = shape.iter().product();
    if shape.iter().any(|&d| d < 0) || elements as usize != data.len() {
        return Err(XlaError::invalid(
            "shape",
            format!("{shape:?}"),
            format!("it must be non-negative and hold the {} elements given", data.len()),
        ));
    }
    // SAFETY: `data` holds the dense array of `shape` and outlives the wait for the
    // done event below.
    let (buffer, done) = unsafe { upload(client, device, data.as_ptr() as *const _, T::DTYPE, shape) }?;
    if let Some(Err(e)) = done.map(|d| d.wait()) {
        // `buffer` is dropped (destroyed) on this error path.
        return Err(e);
    }
    Ok(buffer)
}

/// `PJRT_Client_BufferFromHostBuffer` of the dense `dtype` array of `shape` at `data`
/// into a new buffer on `device`, built from what the caller gave (no PJRT query),
/// with the event that says when PJRT is done reading `data`.
///
/// # Safety
/// `data` must hold the dense array and stay valid until that event completes.
unsafe fn upload(
    client: &Client,
    device: &XlaDevice,
    data: *const std::ffi::c_void,
    dtype: DataType,
    shape: &[i64],
) -> Result<(Buffer, Option<PjrtEvent>)> {
    let t = dtype::to_pjrt(dtype).ok_or_else(|| {
        XlaError::invalid("dtype", handoff_runtime::dtype::name(dtype), "PJRT has no buffer type for it")
    })?;
    let api = client.inner.api();
    // SAFETY: live client and device; `data` as the caller promises.
    let (raw, done) = unsafe {
        result::client::buffer_from_host_buffer(api, client.inner.raw, device.raw(), data, t, shape)?
    };
    // SAFETY: an owned event of this plugin.
    let done = unsafe { PjrtEvent::from_raw(api, done) };
    // SAFETY: an owned, live buffer of this client, just made with this dtype, shape
    // and device.
    let buffer =
        unsafe { Buffer::from_parts(client.inner.clone(), raw, dtype, shape, device.index, false, None) };
    Ok((buffer, done))
}
