//! XLA's ready stream of each device: the stream a producer makes data ready on
//! before XLA reads it ([`Client::ready_stream`]), asked of PJRT once per device and
//! cached in the client.

use crate::client::{Client, XlaDevice};
use crate::error::Result;
#[cfg(not(feature = "cuda"))]
use crate::error::XlaError;
use crate::result;
use handoff_runtime::Stream;

impl Client {
    /// The stream a producer must make its data ready on before XLA reads it on
    /// `device` (CUDA: the stream extension's `get_stream_for_external_ready_events`,
    /// asked of PJRT once per device). Export a value to this stream to hand it to
    /// [`Client::import`] with no extra wait. On CPU it is the host stream.
    pub fn ready_stream(&self, device: &XlaDevice) -> Result<Stream> {
        ready_stream(self, device)
    }
}

/// [`Client::ready_stream`]: the stream XLA reads hand-offs on for `device`, asked of
/// PJRT once per device and cached in the client.
pub(crate) fn ready_stream(client: &Client, device: &XlaDevice) -> Result<Stream> {
    ready_stream_at(client, device.index)
}

/// [`ready_stream`] of the client's device `index`.
pub(super) fn ready_stream_at(client: &Client, index: usize) -> Result<Stream> {
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
pub(super) fn cached_ready_stream(client: &Client, device: usize) -> Result<&Stream> {
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
