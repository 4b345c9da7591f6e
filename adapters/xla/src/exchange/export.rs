//! Out of XLA: PJRT buffers handed off. [`Buffer`] and [`OutputBuffer`] are
//! `StreamOrdered` and [`Export`]: the consumer's stream waits for the buffer, and the
//! hand-off keeps its memory (a shared buffer through an external reference, an
//! execution's output as its one owner).

use crate::buffer::{Buffer, OutputBuffer, ready_event_of};
use crate::client::ClientInner;
use crate::error::{Result, XlaError};
use crate::result;
use handoff_runtime::dtype::DataType;
use handoff_runtime::{Export, Exportable, Handoff, Ready, Release, Stream, StreamOrdered, TensorDesc};

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
