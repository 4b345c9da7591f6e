//! # handoff-cuda
//!
//! Buffers for people who write their own CUDA with [`cudarc`]: a [`CudaTensor<T>`]
//! is a `CudaSlice<T>` with its stream, shape and strides. It is
//! [`StreamOrdered`], [`Export`]s to a [`Handoff`] without a copy and [`Import`]s
//! from one without a copy, so it can be handed to and from PyTorch, XLA or any other
//! handoff adapter with the ordering kept on the GPU.
//!
//! - **Export** moves the tensor into the hand-off (it is the keep-alive): the
//!   producer's memory is freed (by cudarc, stream-ordered, on its own stream) only
//!   after the consumer's queued work is done. No CUDA call on the same stream; one
//!   `cuEventRecord` + one `cuStreamWaitEvent` across streams.
//! - **Import** views the foreign memory through dlpark's
//!   [`dlpark::interop::cudarc::ManagedCudaSlice`], which never
//!   frees it: the hand-off (and so the foreign owner) is kept until the view is
//!   dropped, and then released in stream order by the runtime's reaper.
//! - **No hidden syncs.** cudarc's per-slice event tracking records and waits events
//!   on every access and its `new_stream` synchronizes the context once. Imported
//!   views live in a cudarc context with tracking disabled ([`context`]), so building
//!   and dropping them makes no CUDA call; exported slices are described from a
//!   pointer taken once when the tensor is made.
//!
//! ```no_run
//! use handoff_cuda::{CudaTensor, context, stream_of};
//! use handoff_runtime::{Export, stats};
//!
//! let ctx = context(0)?; // cudarc context on the primary context, no event tracking
//! let (producer, consumer) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
//! let x = CudaTensor::new(producer.clone_htod(&[1.0f32, 2.0, 3.0, 4.0]).unwrap(), &[2, 2])?;
//! // ... launch kernels writing x on `producer` ...
//! let (y, delta) = stats::measure(|| -> handoff_runtime::Result<CudaTensor<f32>> {
//!     x.export(&stream_of(&consumer)?)?.import()
//! });
//! let y = y?;
//! assert_eq!((delta.events_recorded, delta.waits_enqueued, delta.host_syncs), (1, 1, 0));
//! // ... launch kernels reading y.slice() on `consumer`; dropping y releases x's
//! // memory only once they are done.
//! # Ok::<(), handoff_runtime::Error>(())
//! ```
#![warn(missing_docs)]

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, result as cu, sys};
use dlpark::TryFromDlpack;
use dlpark::ffi::DLManagedTensorVersioned;
use dlpark::interop::cudarc::{CudaImport, ManagedCudaSlice};
use dlpark::{DlpackElement, Managed};
use handoff_runtime::{
    Device, Error, Export, Handoff, Import, Result, Stream, StreamOrdered, TensorDesc, cuda,
};
use std::sync::{Arc, Mutex, OnceLock};

fn refuse<T>(message: String) -> Result<T> {
    Err(Error::Adapter { adapter: "handoff-cuda", message })
}

static CONTEXTS: OnceLock<Box<[OnceLock<Arc<CudaContext>>]>> = OnceLock::new();
static OPENING: Mutex<()> = Mutex::new(());

/// A cudarc [`CudaContext`] on the primary context of device `ordinal`, with
/// cudarc's event tracking **disabled**, cached for the process.
///
/// handoff orders work between streams itself, so cudarc's own tracking is not
/// needed and would add hidden CUDA calls (and one `cuCtxSynchronize` in the first
/// `new_stream`). Streams and slices made from this context make none. It is the
/// context imported views live in, and a good one for your own producers. Making it
/// leaves the calling thread's current context as it was.
///
/// # Errors
/// [`Error::CudaUnavailable`] without a usable driver or device `ordinal`;
/// [`Error::Backend`] if the driver refuses the context.
pub fn context(ordinal: u32) -> Result<Arc<CudaContext>> {
    // The runtime probes libcuda without panicking; cudarc is safe to call after.
    let devices = cuda::device_count()?;
    let cells = CONTEXTS.get_or_init(|| (0..devices).map(|_| OnceLock::new()).collect());
    let Some(cell) = cells.get(ordinal as usize) else {
        return Err(Error::CudaUnavailable {
            reason: format!(
                "device ordinal {ordinal} does not exist: this machine has {devices} CUDA device(s)"
            ),
        });
    };
    if let Some(c) = cell.get() {
        return Ok(c.clone());
    }
    let _opening = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = cell.get() {
        return Ok(c.clone());
    }
    let driver = |call: &'static str| {
        move |e: cu::DriverError| Error::Backend {
            backend: "cuda",
            call,
            message: format!("{e} (cuda:{ordinal})"),
        }
    };
    let before = cu::ctx::get_current().map_err(driver("cuCtxGetCurrent"))?;
    let ctx = CudaContext::new(ordinal as usize).map_err(driver("cuDevicePrimaryCtxRetain"))?;
    // SAFETY: no slice has been made from this context yet, so none is tracked.
    unsafe { ctx.disable_event_tracking() };
    if before != Some(ctx.cu_ctx()) {
        // SAFETY: restores the context (or none) that was current before.
        unsafe { cu::ctx::set_current(before.unwrap_or(std::ptr::null_mut())) }
            .map_err(driver("cuCtxSetCurrent"))?;
    }
    Ok(cell.get_or_init(|| ctx).clone())
}

/// The handoff [`Stream`] of a cudarc stream. The `Stream` (and every clone) keeps
/// the `CudaStream` alive, so a release recorded on it later never meets a
/// destroyed stream.
///
/// # Errors
/// [`Error::Adapter`] when the stream belongs to a non-primary context (handoff
/// orders work on primary contexts, which PyTorch and XLA share);
/// [`Error::CudaUnavailable`] as [`cuda::stream`].
pub fn stream_of(stream: &Arc<CudaStream>) -> Result<Stream> {
    let ctx = stream.context();
    if !ctx.is_primary() {
        return refuse(format!(
            "stream {:p} belongs to a non-primary context of cuda:{}: handoff orders work on primary \
             contexts only (make it with CudaContext::new or handoff_cuda::context)",
            stream.cu_stream(),
            ctx.ordinal()
        ));
    }
    let ordinal = u32::try_from(ctx.ordinal())
        .or_else(|_| refuse(format!("device ordinal {} does not fit in u32", ctx.ordinal())))?;
    // SAFETY: a stream of the primary context of `ordinal`, kept alive by the owner
    // attached to the result.
    let borrowed = unsafe { cuda::stream(ordinal, stream.cu_stream() as usize as u64) }?;
    Ok(borrowed.with_owner(stream.clone()))
}

enum Storage<T> {
    /// Memory this tensor owns (freed by cudarc, on its stream, when dropped).
    Owned(CudaSlice<T>),
    /// A view of another owner's memory, keeping its hand-off until dropped.
    Imported(ManagedCudaSlice<DLManagedTensorVersioned, T>),
}

/// A `CudaSlice<T>` with its stream, shape and strides: a stream-ordered tensor that
/// exports to and imports from a [`Handoff`] without a copy.
///
/// Its pending writes are on [`stream`](Self::stream): the slice's own stream for a
/// tensor made with [`new`](Self::new), the consumer stream of the hand-off for an
/// imported one.
///
/// ```no_run
/// use handoff_cuda::{CudaTensor, context};
/// let ctx = context(0)?;
/// let s = ctx.new_stream().unwrap();
/// let t = CudaTensor::with_strides(s.alloc_zeros::<f32>(6).unwrap(), &[2, 3], &[1, 2])?;
/// assert_eq!((t.shape(), t.strides()), (&[2i64, 3][..], &[1i64, 2][..]));
/// # Ok::<(), handoff_runtime::Error>(())
/// ```
pub struct CudaTensor<T> {
    storage: Storage<T>,
    ptr: sys::CUdeviceptr,
    ordinal: u32,
    stream: Stream,
    /// Where the memory goes back: the slice's own stream (cudarc frees there), or
    /// for an import the consumer stream its hand-off releases after.
    release: Stream,
    shape: Vec<i64>,
    strides: Vec<i64>,
    read_only: bool,
}

impl<T: DlpackElement> CudaTensor<T> {
    /// A compact row-major tensor of `shape` over all or the start of `slice`.
    ///
    /// # Errors
    /// As [`with_strides`](Self::with_strides).
    pub fn new(slice: CudaSlice<T>, shape: &[i64]) -> Result<CudaTensor<T>> {
        let strides = compact_strides(shape)?;
        Self::with_strides(slice, shape, &strides)
    }

    /// A 1-D tensor of the whole slice.
    ///
    /// # Errors
    /// As [`with_strides`](Self::with_strides).
    pub fn from_slice(slice: CudaSlice<T>) -> Result<CudaTensor<T>> {
        let n = i64::try_from(slice.len())
            .or_else(|_| refuse(format!("slice length {} overflows i64", slice.len())))?;
        Self::new(slice, &[n])
    }

    /// A tensor of `shape` with `strides` (in elements) over `slice`.
    ///
    /// The device pointer is taken once here (through cudarc's `device_ptr`, which
    /// with event tracking on enqueues a wait and records an event on the slice's own
    /// stream); hand-offs later make no cudarc call.
    ///
    /// # Errors
    /// [`Error::Adapter`] when a dimension or stride is negative, `strides` does not
    /// have one entry per dimension, the elements reach past `slice.len()`, or the
    /// slice's context is not a primary context; [`Error::CudaUnavailable`] as
    /// [`cuda::stream`].
    pub fn with_strides(slice: CudaSlice<T>, shape: &[i64], strides: &[i64]) -> Result<CudaTensor<T>> {
        check_layout(shape, strides, slice.len())?;
        let stream = stream_of(slice.stream())?;
        let (ptr, record) = slice.device_ptr(slice.stream());
        drop(record);
        let ordinal = slice.ordinal() as u32;
        Ok(CudaTensor {
            storage: Storage::Owned(slice),
            ptr,
            ordinal,
            release: stream.clone(),
            stream,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            read_only: false,
        })
    }
}

impl<T> CudaTensor<T> {
    /// The slice: the whole allocation for an owned tensor, the viewed elements for
    /// an imported one. Pass it to cudarc's launch builder; enqueue on
    /// [`cuda_stream`](Self::cuda_stream) (or order your stream after it).
    pub fn slice(&self) -> &CudaSlice<T> {
        match &self.storage {
            Storage::Owned(s) => s,
            Storage::Imported(m) => m,
        }
    }

    /// The slice, mutably, for an owned tensor (`None` for an imported view, whose
    /// memory belongs to another owner; write through [`device_ptr`](Self::device_ptr)
    /// in your kernels if the hand-off was not read-only).
    pub fn slice_mut(&mut self) -> Option<&mut CudaSlice<T>> {
        match &mut self.storage {
            Storage::Owned(s) => Some(s),
            Storage::Imported(_) => None,
        }
    }

    /// The owned slice back, or the tensor itself when it is an imported view.
    pub fn into_slice(self) -> std::result::Result<CudaSlice<T>, Box<CudaTensor<T>>> {
        match self.storage {
            Storage::Owned(s) => Ok(s),
            storage => Err(Box::new(CudaTensor { storage, ..self })),
        }
    }

    /// The device address of the first element (`CUdeviceptr`).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The cudarc stream the slice is bound to: its own for an owned tensor; a
    /// borrowed wrapper of the consumer stream for an imported one.
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        self.slice().stream()
    }

    /// The handoff stream its pending writes are on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Moves the tensor to `stream` (same device): later hand-offs order after work
    /// on it. The caller orders the switch (for instance with
    /// [`handoff_runtime::order`]). Its memory still goes back on the stream it was
    /// allocated on (cudarc frees there), so hand-offs to `stream` release after
    /// their consumer's work, not at once.
    ///
    /// # Errors
    /// [`Error::CrossDevice`] when `stream` is of another device.
    pub fn set_stream(&mut self, stream: Stream) -> Result<()> {
        if stream.device() != Device::Cuda(self.ordinal) {
            return Err(Error::CrossDevice { from: Device::Cuda(self.ordinal), to: stream.device() });
        }
        self.stream = stream;
        Ok(())
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The extent of each dimension.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The strides in elements.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// The number of elements.
    pub fn num_elements(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// Whether this is a view of another owner's memory.
    pub fn is_imported(&self) -> bool {
        matches!(self.storage, Storage::Imported(_))
    }

    /// Whether the producer asked consumers not to write (imported views only).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }
}

impl<T> std::fmt::Debug for CudaTensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaTensor")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("stream", &self.stream)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("imported", &self.is_imported())
            .finish()
    }
}

impl<T> StreamOrdered for CudaTensor<T> {
    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }
    fn stream(&self) -> Option<Stream> {
        Some(self.stream.clone())
    }
    fn release_stream(&self) -> Option<Stream> {
        Some(self.release.clone())
    }
}

impl<T: DlpackElement + 'static> Export for CudaTensor<T> {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        let mut desc = TensorDesc::new(
            self.ptr as usize as *mut std::ffi::c_void,
            Device::Cuda(self.ordinal),
            T::DTYPE,
            &self.shape[..],
        )
        .with_strides(&self.strides[..]);
        desc.read_only = self.read_only;
        Ok(desc)
    }
}

impl<T: DlpackElement> Import for CudaTensor<T> {
    /// Views the hand-off's memory (compact tensors of element type `T` on a CUDA
    /// device, made ready on a CUDA stream of that device) without a copy and without
    /// a CUDA call.
    fn from_handoff(handoff: Handoff) -> Result<CudaTensor<T>> {
        let Device::Cuda(ordinal) = handoff.device() else {
            return refuse(format!("a CudaTensor views CUDA memory, not {} memory", handoff.device()));
        };
        let consumer = handoff.consumer_stream().clone();
        let Some((stream_ordinal, raw)) = cuda::raw_stream(&consumer) else {
            return refuse(format!("the consumer stream {consumer:?} is not a CUDA stream"));
        };
        if stream_ordinal != ordinal {
            return Err(Error::CrossDevice { from: Device::Cuda(ordinal), to: Device::Cuda(stream_ordinal) });
        }
        if handoff.dtype() != T::DTYPE {
            return refuse(format!(
                "dtype is {}, but this CudaTensor holds {}",
                handoff_runtime::dtype::name(handoff.dtype()),
                handoff_runtime::dtype::name(T::DTYPE)
            ));
        }
        if !handoff.is_contiguous() {
            return refuse(format!(
                "strides {:?} of shape {:?} are not compact: imports are compact views \
                 (dlpark's ManagedCudaSlice); make the producer export a compact tensor",
                handoff.strides(),
                handoff.shape()
            ));
        }
        let (shape, strides, read_only) =
            (handoff.shape().to_vec(), handoff.strides().to_vec(), handoff.is_read_only());
        let ptr = handoff.data_ptr() as usize as u64;
        let ctx = context(ordinal)?;
        // SAFETY: `raw` is a stream of this device's primary context (a CUDA stream of
        // the runtime), kept alive by its owner as the runtime's Stream requires; the
        // wrapper is borrowed and never destroys it.
        let cuda_stream = unsafe { ctx.wrap_borrowed_stream(raw as usize as sys::CUstream) };
        // SAFETY: into_raw gives up an owned, valid, versioned managed tensor.
        let managed = unsafe { Managed::from_raw(handoff.into_raw()) }
            .or_else(|e| refuse(format!("the hand-off's DLPack tensor was refused: {e}")))?;
        // SAFETY: the tensor was validated by the runtime and its data is ready on
        // `cuda_stream` (the hand-off's consumer stream). The view's context has
        // event tracking disabled, so making and dropping it makes no CUDA call, and
        // it never frees the memory (ManagedCudaSlice leaks its slice on drop, then
        // drops the managed tensor, whose deleter releases in stream order).
        let view = unsafe { ManagedCudaSlice::try_from_dlpack(managed, CudaImport::ready_on(cuda_stream)) }
            .or_else(|e| refuse(format!("dlpark refused the CUDA view: {e}")))?;
        Ok(CudaTensor {
            storage: Storage::Imported(view),
            ptr,
            ordinal,
            release: consumer.clone(),
            stream: consumer,
            shape,
            strides,
            read_only,
        })
    }
}

fn compact_strides(shape: &[i64]) -> Result<Vec<i64>> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for (axis, &d) in shape.iter().enumerate().rev() {
        if d < 0 {
            return refuse(format!("shape[{axis}] is {d}: dimensions must be >= 0"));
        }
        strides[axis] = acc;
        acc =
            acc.checked_mul(d.max(1)).map_or_else(|| refuse(format!("shape {shape:?} overflows i64")), Ok)?;
    }
    Ok(strides)
}

/// Checks that `shape`/`strides` address only elements `0..len` of the slice.
fn check_layout(shape: &[i64], strides: &[i64], len: usize) -> Result<()> {
    if shape.len() != strides.len() {
        return refuse(format!("shape has {} dimensions but strides has {}", shape.len(), strides.len()));
    }
    let mut last: i128 = 0;
    let mut empty = false;
    for (axis, (&d, &s)) in shape.iter().zip(strides).enumerate() {
        if d < 0 {
            return refuse(format!("shape[{axis}] is {d}: dimensions must be >= 0"));
        }
        if s < 0 {
            return refuse(format!("strides[{axis}] is {s}: negative strides are not supported"));
        }
        empty |= d == 0;
        last += (d as i128 - 1).max(0) * s as i128;
    }
    if !empty && last >= len as i128 {
        return refuse(format!(
            "shape {shape:?} with strides {strides:?} reaches element {last}, past the slice's {len} elements"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_checked_against_the_slice() {
        assert_eq!(compact_strides(&[2, 3, 4]).unwrap(), vec![12, 4, 1]);
        assert_eq!(compact_strides(&[]).unwrap(), Vec::<i64>::new());
        assert_eq!(compact_strides(&[0, 3]).unwrap(), vec![3, 1]);
        check_layout(&[2, 3], &[3, 1], 6).unwrap();
        check_layout(&[2, 3], &[1, 2], 6).unwrap();
        check_layout(&[0, 3], &[100, 100], 0).unwrap();
        check_layout(&[], &[], 1).unwrap();
        for (shape, strides, len, needle) in [
            (&[2i64, 3][..], &[3i64, 1][..], 5usize, "reaches element 5"),
            (&[2, 3], &[1], 6, "strides has 1"),
            (&[-1], &[1], 6, "shape[0] is -1"),
            (&[2], &[-1], 6, "strides[0] is -1"),
        ] {
            match check_layout(shape, strides, len) {
                Err(Error::Adapter { message, .. }) => assert!(message.contains(needle), "{message}"),
                other => panic!("{shape:?} {strides:?}: {other:?}"),
            }
        }
        assert!(matches!(compact_strides(&[2, -3]), Err(Error::Adapter { .. })));
    }

    #[test]
    fn without_cuda_the_context_is_cuda_unavailable() {
        if cuda::is_available() {
            println!("SKIPPED: a CUDA device is present; the no-CUDA path is tested on machines without one");
            return;
        }
        assert!(matches!(context(0), Err(Error::CudaUnavailable { .. })));
    }
}

fn probe() -> Vec<handoff_runtime::registry::Probe> {
    use handoff_runtime::registry::Probe;
    vec![match handoff_runtime::cuda::device_count() {
        Ok(n) => {
            Probe::found("CUDA devices", format!("{} loaded, {n} device(s)", handoff_runtime::cuda::LIBRARY))
        }
        Err(e) => Probe::not_found("CUDA devices", e.to_string()),
    }]
}

// The registry takes one Rust type per direction: f32 buffers, the common case.
// Other element types exchange through `CudaTensor<T>`'s `Export`/`Import` directly.
handoff_runtime::registry::submit! {
    handoff_runtime::registry::Adapter::new("cuda", env!("CARGO_PKG_VERSION"))
        .about("cudarc CudaSlice<f32> buffers with their stream, shape and strides")
        .devices(&[handoff_runtime::registry::DeviceKind::Cuda])
        .dtypes(&[handoff_runtime::dtype::DataType::F32])
        .exports::<CudaTensor<f32>>()
        .imports::<CudaTensor<f32>>()
        .probe(probe)
}
