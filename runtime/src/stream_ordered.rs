//! The `StreamOrdered` trait: how a value's pending writes become visible on a
//! consumer stream without blocking the host (rules 1 and 2).

use crate::device::Device;
use crate::error::{Error, Result};
use crate::stats::{self, Counter};
use crate::stream::Stream;

/// What making a value ready on a consumer stream took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Nothing: the same stream, or memory with no pending device work.
    Elided,
    /// One event recorded on the producer stream and one wait enqueued on the consumer.
    Waited,
    /// The consumer is the host, so the host waited for the producer (counted).
    HostSynced,
}

/// A value whose memory is written in stream order: it knows its device and the
/// stream its pending writes are on.
///
/// The provided [`ready_on`](StreamOrdered::ready_on) does the protocol: record a
/// pooled event on the producer stream and enqueue a wait on the consumer; nothing
/// at all when both are the same stream or the value has no stream.
///
/// ```
/// use handoff_runtime::{Device, Ready, Stream, StreamOrdered};
/// struct HostBytes(Vec<u8>);
/// impl StreamOrdered for HostBytes {
///     fn device(&self) -> Device { Device::Host }
///     fn stream(&self) -> Option<Stream> { None }
/// }
/// assert_eq!(HostBytes(vec![1]).ready_on(&Stream::host()).unwrap(), Ready::Elided);
/// ```
pub trait StreamOrdered {
    /// Where the memory lives.
    fn device(&self) -> Device;

    /// The stream the value's pending writes are on; `None` when there are none
    /// (host memory written by the host).
    fn stream(&self) -> Option<Stream>;

    /// The stream the value's memory goes back on when the value is dropped: a
    /// stream-ordered free there (cudarc's `cuMemFreeAsync`, the mock's) waits for the
    /// work enqueued on that stream, and for no other. A consumer on this very stream
    /// may let the value go as soon as it drops its view ([`Release::Immediately`]);
    /// any other consumer's release waits for its queued work (the reaper).
    ///
    /// Default: [`stream`](Self::stream). Types whose stream can change after the
    /// memory was allocated (`set_stream`) return the allocation stream.
    ///
    /// [`Release::Immediately`]: crate::Release::Immediately
    fn release_stream(&self) -> Option<Stream> {
        self.stream()
    }

    /// Whether the value's memory goes back on `consumer` itself
    /// ([`release_stream`](Self::release_stream) is `consumer`), so that a consumer
    /// there may let it go as soon as it drops its view. Default: compares the
    /// [`held_release_stream`](Self::held_release_stream) when there is one (no
    /// `Stream` made), else the `release_stream`.
    fn releases_on(&self, consumer: &Stream) -> bool {
        match self.held_release_stream() {
            Some(held) => held == consumer,
            None => self.release_stream().as_ref() == Some(consumer),
        }
    }

    /// The handle of [`release_stream`](Self::release_stream) that the value itself
    /// holds for as long as it lives, if it holds one. A hand-off to that very stream
    /// then keeps a pointer to the value's handle instead of a clone of its own, one
    /// atomic increment and decrement less per same-stream hand-off. Default: `None`
    /// (the hand-off clones the consumer's handle).
    fn held_release_stream(&self) -> Option<&Stream> {
        None
    }

    /// Makes the value's pending writes visible to work enqueued on `consumer` from
    /// now on, without blocking the host (unless `consumer` is the host itself).
    fn ready_on(&self, consumer: &Stream) -> Result<Ready> {
        order(self.stream().as_ref(), consumer)
    }
}

/// Orders work enqueued on `consumer` from now on after all work enqueued so far on
/// `producer`: the default of [`StreamOrdered::ready_on`], for adapters that
/// override it but keep the rule.
#[inline]
pub fn order(producer: Option<&Stream>, consumer: &Stream) -> Result<Ready> {
    let producer = match producer {
        // The cheap comparison first: `is_host` asks the backend.
        Some(p) if p != consumer && !p.is_host() => p,
        _ => {
            stats::count(Counter::WaitsElided, 1);
            return Ok(Ready::Elided);
        }
    };
    if consumer.is_host() {
        producer.synchronize()?;
        return Ok(Ready::HostSynced);
    }
    if producer.device() != consumer.device() {
        return Err(Error::CrossDevice { from: producer.device(), to: consumer.device() });
    }
    consumer.wait_for(producer)?;
    Ok(Ready::Waited)
}
