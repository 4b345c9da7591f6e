//! Tests only: a wrapper whose consumer stream is a stream of the runtime's simulated
//! device (`handoff_runtime::mock`), so that the stream-ordered release, the reaper and
//! the GIL rules can be tested on machines without a GPU.
//!
//! `_mock_ordered(obj, busy_us)` (in `ordered`) behaves as `ordered(obj)`, except that
//! the consumer's stream is a simulated one on which `busy_us` microseconds of consumer
//! work are queued when the capsule is made. The release then waits for the simulated
//! clock, which `Ordered._mock_advance(us)` moves (or `flush()`, which waits on the host).
//!
//! Only with the `test-hooks` feature. Without it (the wheel users install)
//! [`MockConsumer`] is a type with no value: `Ordered`'s `mock` is always `None` and the
//! compiler drops every branch on it.

use handoff_runtime::Stream;
#[cfg(feature = "test-hooks")]
use handoff_runtime::mock::{Kernel, Mock};

/// No simulated consumer stream in a build without the `test-hooks` feature.
#[cfg(not(feature = "test-hooks"))]
pub enum MockConsumer {}

#[cfg(not(feature = "test-hooks"))]
impl MockConsumer {
    /// Never called: there is no value.
    pub fn stream(&self) -> &Stream {
        match *self {}
    }

    /// Never called: there is no value.
    pub fn consumer_work(&self) {
        match *self {}
    }
}

/// A simulated consumer stream and the work queued on it per hand-off.
#[cfg(feature = "test-hooks")]
pub struct MockConsumer {
    mock: Mock,
    stream: Stream,
    busy_nanos: u64,
}

#[cfg(feature = "test-hooks")]
impl MockConsumer {
    /// A simulated device's stream on which each hand-off queues `busy_us` microseconds
    /// of consumer work.
    pub fn new(busy_us: u64) -> MockConsumer {
        let mock = Mock::new();
        let stream = mock.stream(0, "python consumer");
        MockConsumer { mock, stream, busy_nanos: busy_us.saturating_mul(1000) }
    }

    /// The simulated consumer stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Queues the consumer's simulated work (after the hand-off was made).
    pub fn consumer_work(&self) {
        self.mock.launch(&self.stream, Kernel::new("consumer reads").nanos(self.busy_nanos));
    }

    /// Moves the simulated clock.
    pub fn advance(&self, micros: u64) {
        self.mock.advance(micros.saturating_mul(1000));
    }
}
