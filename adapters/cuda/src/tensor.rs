//! [`CudaTensor`]: a cudarc slice with its stream, shape and strides, exported and
//! imported without a copy.

use crate::context::{context_ref, refuse, stream_of};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use dlpark::DlpackElement;
use handoff_runtime::{
    Device, Error, Export, Handoff, Import, Result, Stream, StreamOrdered, TensorDesc, cuda, order,
};
use handoff_runtime::{Ready, dtype::name as dtype_name};
use std::mem::ManuallyDrop;
use std::sync::{Arc, OnceLock};

/// The tensor is kept within 128 bytes, which the compiler moves inline: a larger one
/// is moved by a call to `memmove` at each step of a hand-off, so the two slices,
/// which a hand-off never reads, are boxed (kept: the same-stream figures of
/// `adapters/cuda/benches/handoff_cuda.rs`; figures in `docs/PERFORMANCE.md`).
enum Storage<T> {
    /// Memory this tensor owns (freed by cudarc, on `release`, when dropped).
    Owned {
        slice: Box<CudaSlice<T>>,
        /// The stream the slice was allocated on, where cudarc frees it.
        release: Stream,
        /// The shape, then the strides: one allocation, and a tensor small enough
        /// that moving it into a hand-off is cheap.
        dims: Box<[i64]>,
    },
    /// A view of another owner's memory: the hand-off itself (its shape, strides and
    /// flags, validated when it was made; dropping it releases in stream order), and
    /// the cudarc slice over it, made on first use.
    Imported { handoff: Handoff, ctx: &'static Arc<CudaContext>, slice: OnceLock<Box<SliceView<T>>> },
}

/// A cudarc slice over memory another owner frees: dropping it leaks the slice
/// (cudarc would free the memory), never frees it.
struct SliceView<T>(ManuallyDrop<CudaSlice<T>>);

impl<T> Drop for SliceView<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.0) };
        // The context has event tracking off, so leaking makes no CUDA call.
        slice.leak();
    }
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
    /// The stream its pending writes are on, when [`set_stream`](Self::set_stream)
    /// moved it: else an owned tensor's own stream (`release`) or an imported one's
    /// hand-off consumer stream, so that neither holds a second handle. Boxed: rarely
    /// set, and a tensor small enough that moving it into a hand-off is cheap.
    stream: Option<Box<Stream>>,
}

// Moved inline, not by a call to `memmove` (see `Storage`).
const _: () = assert!(size_of::<CudaTensor<f32>>() <= 128);

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
        let dims = shape.iter().chain(strides).copied().collect();
        let storage = Storage::Owned { slice: Box::new(slice), release: stream, dims };
        Ok(CudaTensor { storage, ptr, ordinal, stream: None })
    }
}

impl<T> CudaTensor<T> {
    /// The slice: the whole allocation for an owned tensor, the viewed elements for
    /// an imported one (made on first use; it never frees the memory). Pass it to
    /// cudarc's launch builder; enqueue on [`cuda_stream`](Self::cuda_stream) (or
    /// order your stream after it).
    pub fn slice(&self) -> &CudaSlice<T> {
        match &self.storage {
            Storage::Owned { slice, .. } => slice,
            Storage::Imported { handoff, ctx, slice } => {
                &slice
                    .get_or_init(|| {
                        let raw = cuda::raw_stream(handoff.consumer_stream()).map_or(0, |(_, raw)| raw);
                        // SAFETY: the import checked that the consumer stream is a CUDA stream
                        // of this device's primary context, kept alive by the hand-off's
                        // consumer handle (in `handoff`) for as long as this view; the wrapper
                        // is borrowed and never destroys it.
                        let stream = unsafe { ctx.wrap_borrowed_stream(raw as usize as sys::CUstream) };
                        // SAFETY: the hand-off's memory: `num_elements` compact elements of `T`
                        // from `ptr` (checked at import), ready on `stream`, kept alive by
                        // `handoff` for as long as this view; `SliceView` leaks the slice
                        // instead of freeing it. Event tracking is off in this context, so
                        // neither making nor leaking it makes a CUDA call.
                        let slice =
                            unsafe { stream.upgrade_device_ptr::<T>(self.ptr, handoff.num_elements()) };
                        Box::new(SliceView(ManuallyDrop::new(slice)))
                    })
                    .0
            }
        }
    }

    /// The slice, mutably, for an owned tensor (`None` for an imported view, whose
    /// memory belongs to another owner; write through [`device_ptr`](Self::device_ptr)
    /// in your kernels if the hand-off was not read-only).
    pub fn slice_mut(&mut self) -> Option<&mut CudaSlice<T>> {
        match &mut self.storage {
            Storage::Owned { slice, .. } => Some(&mut **slice),
            Storage::Imported { .. } => None,
        }
    }

    /// The owned slice back, or the tensor itself when it is an imported view.
    pub fn into_slice(self) -> std::result::Result<CudaSlice<T>, Box<CudaTensor<T>>> {
        match self.storage {
            Storage::Owned { slice, .. } => Ok(*slice),
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
        match (&self.stream, &self.storage) {
            (Some(stream), _) => stream,
            (None, Storage::Imported { handoff, .. }) => handoff.consumer_stream(),
            (None, Storage::Owned { release, .. }) => release,
        }
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
        self.stream = Some(Box::new(stream));
        Ok(())
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The extent of each dimension.
    pub fn shape(&self) -> &[i64] {
        match &self.storage {
            Storage::Owned { dims, .. } => &dims[..dims.len() / 2],
            Storage::Imported { handoff, .. } => handoff.shape(),
        }
    }

    /// The strides in elements.
    pub fn strides(&self) -> &[i64] {
        match &self.storage {
            Storage::Owned { dims, .. } => &dims[dims.len() / 2..],
            Storage::Imported { handoff, .. } => handoff.strides(),
        }
    }

    /// The number of elements.
    pub fn num_elements(&self) -> usize {
        self.shape().iter().map(|&d| d as usize).product()
    }

    /// Whether this is a view of another owner's memory.
    pub fn is_imported(&self) -> bool {
        matches!(self.storage, Storage::Imported { .. })
    }

    /// Whether the producer asked consumers not to write (imported views only).
    pub fn is_read_only(&self) -> bool {
        match &self.storage {
            Storage::Owned { .. } => false,
            Storage::Imported { handoff, .. } => handoff.is_read_only(),
        }
    }

    /// The stream the memory goes back after: where cudarc frees an owned slice,
    /// the hand-off's consumer stream for an imported view.
    fn release(&self) -> &Stream {
        match &self.storage {
            Storage::Owned { release, .. } => release,
            Storage::Imported { handoff, .. } => handoff.consumer_stream(),
        }
    }
}

impl<T> std::fmt::Debug for CudaTensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaTensor")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("stream", self.stream())
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("imported", &self.is_imported())
            .finish()
    }
}

impl<T> StreamOrdered for CudaTensor<T> {
    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }
    fn stream(&self) -> Option<Stream> {
        Some(self.stream().clone())
    }
    fn release_stream(&self) -> Option<Stream> {
        Some(self.release().clone())
    }
    fn held_release_stream(&self) -> Option<&Stream> {
        Some(self.release())
    }
    fn ready_on(&self, consumer: &Stream) -> Result<Ready> {
        order(Some(self.stream()), consumer)
    }
}

impl<T: DlpackElement + 'static> Export for CudaTensor<T> {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        let mut desc = TensorDesc::new(
            self.ptr as usize as *mut std::ffi::c_void,
            Device::Cuda(self.ordinal),
            T::DTYPE,
            self.shape(),
        )
        .with_strides(self.strides());
        desc.read_only = self.is_read_only();
        Ok(desc)
    }
}

impl<T: DlpackElement> Import for CudaTensor<T> {
    /// Views the hand-off's memory (compact tensors of element type `T` on a CUDA
    /// device, made ready on a CUDA stream of that device) without a copy and without
    /// a CUDA call. The hand-off was validated when it was made, so the view keeps it
    /// as it is: nothing is copied or checked twice.
    fn from_handoff(handoff: Handoff) -> Result<CudaTensor<T>> {
        let Device::Cuda(ordinal) = handoff.device() else {
            return refuse(format!("a CudaTensor views CUDA memory, not {} memory", handoff.device()));
        };
        let consumer = handoff.consumer_stream();
        let Some((stream_ordinal, _)) = cuda::raw_stream(consumer) else {
            return refuse(format!("the consumer stream {consumer:?} is not a CUDA stream"));
        };
        if stream_ordinal != ordinal {
            return Err(Error::CrossDevice { from: Device::Cuda(ordinal), to: Device::Cuda(stream_ordinal) });
        }
        if handoff.dtype() != T::DTYPE {
            return refuse(format!(
                "dtype is {}, but this CudaTensor holds {}",
                dtype_name(handoff.dtype()),
                dtype_name(T::DTYPE)
            ));
        }
        if !handoff.is_contiguous() {
            return refuse(format!(
                "strides {:?} of shape {:?} are not compact: imports are compact views \
                 (a cudarc slice); make the producer export a compact tensor",
                handoff.strides(),
                handoff.shape()
            ));
        }
        let ctx = context_ref(ordinal)?;
        let ptr = handoff.data_ptr() as usize as u64;
        Ok(CudaTensor {
            storage: Storage::Imported { handoff, ctx, slice: OnceLock::new() },
            ptr,
            ordinal,
            stream: None,
        })
    }
}

/// Compact row-major strides of `shape` (dlpark's rule), refusing negative
/// dimensions and overflow by name.
pub(crate) fn compact_strides(shape: &[i64]) -> Result<Vec<i64>> {
    if let Some((axis, d)) = shape.iter().enumerate().find(|(_, d)| **d < 0) {
        return refuse(format!("shape[{axis}] is {d}: dimensions must be >= 0"));
    }
    dlpark::tensor::compact_strides(shape).or_else(|_| refuse(format!("shape {shape:?} overflows i64")))
}
/// Checks that `shape`/`strides` address only elements `0..len` of the slice.
pub(crate) fn check_layout(shape: &[i64], strides: &[i64], len: usize) -> Result<()> {
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
