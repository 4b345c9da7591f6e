//! [`CudaTensor`]: a cudarc slice with its stream, shape and strides, exported and
//! imported without a copy.

use crate::context::{context, refuse, stream_of};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, sys};
use dlpark::TryFromDlpack;
use dlpark::ffi::DLManagedTensorVersioned;
use dlpark::interop::cudarc::{CudaImport, ManagedCudaSlice};
use dlpark::{DlpackElement, Managed};
use handoff_runtime::{
    Device, Error, Export, Handoff, Import, Result, Stream, StreamOrdered, TensorDesc, cuda,
};
use std::sync::Arc;

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
