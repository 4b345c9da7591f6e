//! [`TorchTensor`]: a `tch::Tensor` with its stream, exported with `recordStream` when
//! the consumer works on another stream; and [`CurrentStream`], which lets generic
//! code take and return plain `tch::Tensor`s.

use crate::describe::{Described, describe_for_export, describe_tensor};
use crate::error::TorchError;
use crate::import::{ImportOptions, import, view};
use crate::{current_stream, init};
use handoff_runtime::{
    Device, Export, Exportable, Handoff, Import, ImportInto, Importable, Release, Result, Stream,
    StreamOrdered, TensorDesc,
};

/// A `tch::Tensor` with the stream its pending work is on: what handoff exports and
/// imports for PyTorch.
///
/// ```
/// use handoff_runtime::{Export, Stream, StreamOrdered};
/// use handoff_torch::TorchTensor;
/// let t = TorchTensor::new(tch::Tensor::arange(6, (tch::Kind::Int64, tch::Device::Cpu))).unwrap();
/// assert!(t.stream().is_none()); // CPU: host-ordered
/// let h = t.export(&Stream::host()).unwrap();
/// let back: TorchTensor = h.import().unwrap();
/// assert_eq!(back.tensor().size(), [6]);
/// ```
pub struct TorchTensor {
    tensor: tch::Tensor,
    device: Device,
    stream: Option<Stream>,
    /// The description read when wrapping, for an export that follows at once (so
    /// the tensor is described once per export).
    described: Option<Described>,
    /// Consumers must not write: it came from a `READ_ONLY` hand-off, and its
    /// exports say so too.
    read_only: bool,
}

impl TorchTensor {
    /// Wraps `tensor`, whose pending work is on PyTorch's current stream of its device
    /// (read now). Fails for tensors that cannot be exported ([`check`](crate::check)).
    pub fn new(tensor: tch::Tensor) -> Result<TorchTensor> {
        let mut t = TorchTensor::for_export(tensor)?;
        t.described = None;
        Ok(t)
    }

    /// [`new`](Self::new), keeping the description for the export that follows
    /// immediately (no other code runs on the tensor in between). Inlined, as
    /// `describe_with` is, so that the description is not copied on its way.
    #[inline(always)]
    fn for_export(tensor: tch::Tensor) -> Result<TorchTensor> {
        init();
        // One shim call reads the tensor and, for a CUDA tensor, PyTorch's current stream.
        let described = describe_for_export(&tensor)?;
        let (device, stream) = (described.device, stream_of(&described)?);
        Ok(TorchTensor { tensor, device, stream, described: Some(described), read_only: false })
    }

    /// Wraps `tensor`, whose pending work is on `stream` (a stream of its device).
    pub fn with_stream(tensor: tch::Tensor, stream: Stream) -> Result<TorchTensor> {
        init();
        let device = describe_tensor(&tensor)?.device;
        if stream.device() != device && !stream.is_host() {
            return Err(TorchError::StreamDevice { stream: format!("{stream:?}"), device }.into());
        }
        let stream = if stream.is_host() { None } else { Some(stream) };
        Ok(TorchTensor { tensor, device, stream, described: None, read_only: false })
    }

    /// Views a hand-off with options, keeping its `READ_ONLY` flag (with
    /// [`ImportOptions::read_only_ok`]): a read-only tensor exports as read-only again.
    /// A plain `tch::Tensor` ([`import_with`](crate::import_with)) cannot carry the flag.
    ///
    /// ```
    /// use handoff_runtime::{Device, Export, Handoff, Ready, Release, Stream, TensorDesc, dtype::DataType};
    /// use handoff_torch::{ImportOptions, TorchTensor};
    /// let data = vec![1.0f32, 2.0];
    /// let h = Handoff::with_keep_alive(data, |d| {
    ///     Ok(TensorDesc::new(d.as_ptr() as *mut _, Device::Host, DataType::F32, &[2][..]).read_only())
    /// }, &Stream::host(), Ready::Elided, Release::AfterConsumer).unwrap();
    /// let t = TorchTensor::import_with(h, &ImportOptions::new().read_only_ok()).unwrap();
    /// assert!(t.is_read_only());
    /// assert!(t.export(&Stream::host()).unwrap().is_read_only());
    /// ```
    pub fn import_with(handoff: Handoff, options: &ImportOptions) -> Result<TorchTensor> {
        handoff_runtime::stats::count_import();
        let (device, read_only) = (handoff.device(), handoff.is_read_only());
        let (tensor, stream) = view(handoff, options)?;
        Ok(TorchTensor { tensor, device, stream, described: None, read_only })
    }

    /// Whether consumers must not write (it came from a `READ_ONLY` hand-off).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The tensor.
    pub fn tensor(&self) -> &tch::Tensor {
        &self.tensor
    }

    /// The tensor, unwrapped.
    pub fn into_tensor(self) -> tch::Tensor {
        self.tensor
    }
}

impl std::ops::Deref for TorchTensor {
    type Target = tch::Tensor;
    fn deref(&self) -> &tch::Tensor {
        &self.tensor
    }
}

impl std::fmt::Debug for TorchTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchTensor")
            .field("device", &self.device)
            .field("stream", &self.stream)
            .field("size", &self.tensor.size())
            .finish()
    }
}

impl StreamOrdered for TorchTensor {
    fn device(&self) -> Device {
        self.device
    }
    fn stream(&self) -> Option<Stream> {
        self.stream.clone()
    }
}

impl Export for TorchTensor {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        let mut desc = match &self.described {
            Some(d) => d.desc(),
            None => describe_tensor(&self.tensor)?.into_desc(),
        };
        desc.read_only = self.read_only;
        Ok(desc)
    }

    /// Makes the tensor ready on `consumer`; when that is another CUDA stream, tells the
    /// caching allocator (`recordStream`) so that the block outlives the consumer's
    /// queued work, or else leaves the release to the reaper.
    fn export(self, consumer: &Stream) -> Result<Handoff> {
        // `new` checked the tensor; it is read again here and refused if it changed
        // since (unless it was wrapped for this export). Fields are borrowed where
        // they are, not moved out.
        let read_now;
        let described = match &self.described {
            Some(d) => d,
            None => {
                read_now = describe_tensor(&self.tensor)?;
                &read_now
            }
        };
        export_described(self.tensor, described, self.stream.as_ref(), self.read_only, consumer)
    }
}

/// The stream a tensor's pending work is on, from its description: PyTorch's current
/// stream of its CUDA device, read in the same shim call; none on the host.
#[inline(always)]
fn stream_of(described: &Described) -> Result<Option<Stream>> {
    match (described.device, described.current_stream) {
        #[cfg(feature = "cuda")]
        (Device::Cuda(ordinal), Some(raw)) => {
            // SAFETY: PyTorch's current stream of the tensor's device, of the primary
            // context, alive as `cuda::current_stream` documents.
            Ok(Some(unsafe { handoff_runtime::cuda::stream(ordinal, raw) }?))
        }
        (device, _) => current_stream(device),
    }
}

/// Every torch export: `tensor`, described by `described`, its pending work on
/// `stream`, made ready on `consumer` and handed off keeping the tensor handle alone
/// (not its description). It takes the description and stream by reference, so that
/// neither a `TorchTensor` (264 bytes) nor its description is moved (a value over 128
/// bytes is moved by a call to `memmove`) on the way to the hand-off.
#[inline(always)]
fn export_described(
    tensor: tch::Tensor,
    described: &Described,
    stream: Option<&Stream>,
    read_only: bool,
    consumer: &Stream,
) -> Result<Handoff> {
    let ready = handoff_runtime::order(stream, consumer)?;
    // Even on the tensor's own stream: its block may have been allocated on another
    // stream, where the caching allocator would reuse it at once.
    let release = release_for(&tensor, described.device, consumer)?;
    let mut desc = described.desc();
    desc.read_only = read_only;
    Handoff::from_desc(tensor, &desc, consumer, ready, release)
}

/// How a tensor exported to a consumer is released: at once when the caching
/// allocator was told of the consumer's stream (`recordStream`, a no-op when the
/// block was allocated there), else after the consumer's queued work (the reaper).
fn release_for(tensor: &tch::Tensor, device: Device, consumer: &Stream) -> Result<Release> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(ordinal) = device
        && let Some((c_ordinal, raw)) = handoff_runtime::cuda::raw_stream(consumer)
        && c_ordinal == ordinal
    {
        let mut recorded = 0i32;
        // SAFETY: a live `at::Tensor*` and a live stream of its device; the shim
        // catches every exception.
        crate::ffi::check("recordStream", unsafe {
            crate::ffi::hf_cuda_record_stream(
                tensor.as_ptr() as *const std::ffi::c_void,
                ordinal as i32,
                raw,
                &mut recorded,
            )
        })?;
        if recorded == 1 {
            return Ok(Release::Immediately);
        }
    }
    let _ = (tensor, device, consumer);
    Ok(Release::AfterConsumer)
}

/// Hands a PyTorch tensor to a consumer working on `consumer`, without a copy: its
/// pending work is on PyTorch's current stream of its device (CPU tensors: none).
/// The hand-off holds a shallow clone, so `tensor` stays usable.
///
/// ```
/// let x = tch::Tensor::zeros([3, 4], (tch::Kind::BFloat16, tch::Device::Cpu));
/// let h = handoff_torch::export(&x.narrow(1, 1, 2), &handoff_runtime::Stream::host()).unwrap();
/// assert_eq!(h.data_ptr() as usize, x.data_ptr() as usize + 2);
/// ```
pub fn export(tensor: &tch::Tensor, consumer: &Stream) -> Result<Handoff> {
    init();
    // What `TorchTensor::for_export(..).export(..)` does, without the `TorchTensor`.
    let described = describe_for_export(tensor)?;
    let stream = stream_of(&described)?;
    export_described(tensor.shallow_clone(), &described, stream.as_ref(), false, consumer)
}

/// Hands a PyTorch tensor whose pending work is on `producer` to a consumer on `consumer`.
pub fn export_from(tensor: &tch::Tensor, producer: &Stream, consumer: &Stream) -> Result<Handoff> {
    TorchTensor::with_stream(tensor.shallow_clone(), producer.clone())?.export(consumer)
}

impl Import for TorchTensor {
    fn from_handoff(handoff: Handoff) -> Result<TorchTensor> {
        let device = handoff.device();
        let (tensor, stream) = view(handoff, &ImportOptions::new())?;
        Ok(TorchTensor { tensor, device, stream, described: None, read_only: false })
    }
}

/// PyTorch's current stream: the context `tch` tensors import into (with
/// [`transfer_into`](handoff_runtime::transfer_into)), and the marker of this crate's
/// [`Exportable`] and [`Importable`] impls for `tch::Tensor`, which let generic code
/// (`handoff::transfer`, an XLA kernel call) take and return plain `tch::Tensor`s.
///
/// ```
/// use handoff_runtime::{Stream, transfer, transfer_into};
/// use handoff_torch::CurrentStream;
/// let x = tch::Tensor::from_slice(&[1.0f32, 2.0]);
/// let y: tch::Tensor = transfer(&x, &Stream::host()).unwrap(); // a view of x's memory
/// let z: tch::Tensor = transfer_into(&y, &CurrentStream).unwrap();
/// assert_eq!(z.data_ptr(), x.data_ptr());
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct CurrentStream;

/// A borrowed tensor exports a shallow clone: the same memory, on PyTorch's current stream.
impl Exportable<CurrentStream> for &tch::Tensor {
    type Value = TorchTensor;

    fn into_exportable(self) -> Result<TorchTensor> {
        TorchTensor::for_export(self.shallow_clone())
    }
}

/// A tensor exports itself, on PyTorch's current stream.
impl Exportable<CurrentStream> for tch::Tensor {
    type Value = TorchTensor;

    fn into_exportable(self) -> Result<TorchTensor> {
        TorchTensor::for_export(self)
    }
}

/// A hand-off imports as a plain tensor, as [`import`] does.
impl Importable<CurrentStream> for tch::Tensor {
    fn import_handoff(handoff: Handoff) -> Result<tch::Tensor> {
        Ok(handoff.import::<TorchTensor>()?.into_tensor())
    }
}

impl ImportInto<CurrentStream> for tch::Tensor {
    fn ready_stream(_: &CurrentStream, device: Device) -> Result<Stream> {
        Ok(current_stream(device)?.unwrap_or_else(Stream::host))
    }

    fn import_into(handoff: Handoff, _: &CurrentStream) -> Result<tch::Tensor> {
        import(handoff)
    }
}

impl ImportInto<CurrentStream> for TorchTensor {
    fn ready_stream(_: &CurrentStream, device: Device) -> Result<Stream> {
        Ok(current_stream(device)?.unwrap_or_else(Stream::host))
    }

    fn import_into(handoff: Handoff, _: &CurrentStream) -> Result<TorchTensor> {
        handoff.import()
    }
}
