//! A deterministic simulated device, so that the protocol — and your own adapter —
//! can be tested without a GPU.
//!
//! A [`Mock`] world has devices (by ordinal) with named streams, events from a pool,
//! kernels that declare the buffers (or byte ranges) they read and write, and a
//! virtual clock that moves only when the test says so (or a host sync waits).
//! It records happens-before with vector clocks and reports every [`Hazard`]: a read
//! not ordered after the write it must see, a write racing an access, and any access
//! or release racing a release.
//!
//! ```
//! use handoff_runtime::mock::{Kernel, Mock};
//! use handoff_runtime::{Export, Import, Handoff};
//!
//! let mock = Mock::new();
//! let (producer, consumer) = (mock.stream(0, "producer"), mock.stream(0, "consumer"));
//! let x = mock.tensor_f32(&producer, "x", &[4], &[0.0; 4]);
//! let id = x.buffer();
//! mock.launch(&producer, Kernel::new("fill").micros(50).writes(id).run(move |k| k.write_f32(id, &[1.0; 4])));
//!
//! let y: handoff_runtime::mock::MockTensor = x.export(&consumer).unwrap().import().unwrap();
//! mock.launch(&consumer, Kernel::new("use").micros(5).reads(y.buffer()));
//! mock.synchronize();
//! assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
//! assert_eq!(mock.read_f32(&y), vec![1.0; 4]);
//! ```

mod hazard;
mod sim;
mod tensor;

pub use hazard::{Hazard, HazardKind, OpRef};
pub use sim::{Effect, KernelCtx};
pub use tensor::MockTensor;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{Backend, EventPool, RawEvent, RawStream, Stream};
use sim::{Declared, Sim};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

/// A buffer of a mock world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferId(pub(crate) usize);

struct World {
    sim: Mutex<Sim>,
    /// The streams capturing a graph, with what their graph keeps so far.
    captures: Mutex<HashMap<RawStream, Vec<crate::graph::Kept>>>,
}

impl World {
    fn captures(&self) -> MutexGuard<'_, HashMap<RawStream, Vec<crate::graph::Kept>>> {
        self.captures.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sim(&self) -> MutexGuard<'_, Sim> {
        // A panic in a test's kernel effect must not hide later hazards.
        self.sim.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A simulated world: devices, streams, memory and a clock. Clones share the world.
#[derive(Clone)]
pub struct Mock {
    world: Arc<World>,
    backends: Arc<Mutex<HashMap<u32, Arc<MockBackend>>>>,
}

impl Default for Mock {
    fn default() -> Self {
        Mock::new()
    }
}

impl Mock {
    /// A new world at time 0 with no streams.
    pub fn new() -> Mock {
        let world = World { sim: Mutex::new(Sim::default()), captures: Mutex::default() };
        Mock { world: Arc::new(world), backends: Arc::default() }
    }

    fn backend(&self, device: u32) -> Arc<MockBackend> {
        let mut b = self.backends.lock().unwrap_or_else(|p| p.into_inner());
        b.entry(device)
            .or_insert_with(|| {
                Arc::new(MockBackend { world: self.world.clone(), ordinal: device, pool: EventPool::new() })
            })
            .clone()
    }

    /// A new stream on mock device `device`, named for hazard reports.
    pub fn stream(&self, device: u32, name: &str) -> Stream {
        let raw = self.world.sim().add_stream(device, name);
        Stream::new(self.backend(device), raw)
    }

    /// Makes `stream` capture a graph, as `cuStreamBeginCapture` does, for the capture
    /// bookkeeping only ([`crate::graph`]): releases on it are kept with the graph until
    /// [`end_capture`](Self::end_capture)'s graph is dropped. Kernels still run at once.
    pub fn begin_capture(&self, stream: &Stream) {
        self.world.captures().insert(stream.raw(), Vec::new());
    }

    /// Ends `stream`'s capture: the graph, which keeps what releases asked during the
    /// capture until it is dropped. Panics if `stream` was not capturing.
    pub fn end_capture(&self, stream: &Stream) -> MockGraph {
        let kept =
            self.world.captures().remove(&stream.raw()).expect("end_capture: the stream was not capturing");
        MockGraph { kept }
    }

    /// The event pool of a mock device.
    pub fn event_pool_created(&self, device: u32) -> u64 {
        self.backend(device).pool.created()
    }

    /// Allocates `len` zeroed bytes on a device. A block freed earlier with the same
    /// size is reused first, as caching allocators do.
    pub fn alloc(&self, device: u32, name: &str, len: usize) -> BufferId {
        BufferId(self.world.sim().alloc(device, name, len, None))
    }

    /// A tensor of `f32` on `stream`'s device, filled from the host (a host write,
    /// ordered before everything enqueued afterwards).
    pub fn tensor_f32(&self, stream: &Stream, name: &str, shape: &[i64], values: &[f32]) -> MockTensor {
        MockTensor::new_f32(self, stream, name, shape, values)
    }

    /// Enqueues a kernel on `stream`.
    ///
    /// # Panics
    /// If `stream` is not a stream of this world.
    pub fn launch(&self, stream: &Stream, kernel: Kernel) {
        assert!(self.owns(stream), "{stream:?} is not a stream of this mock world");
        self.world.sim().launch(stream.raw(), &kernel.name, kernel.duration, kernel.accesses, kernel.effect);
    }

    /// Whether `stream` belongs to this world.
    pub fn owns(&self, stream: &Stream) -> bool {
        stream.device() != Device::Host && {
            let b = self.backends.lock().unwrap_or_else(|p| p.into_inner());
            b.values().any(|m| crate::stream::is_backend_of(&**m, stream))
        }
    }

    /// Moves the virtual clock forward, running the effects of kernels that complete.
    pub fn advance(&self, nanos: u64) {
        let mut s = self.world.sim();
        let t = s.now + nanos;
        s.advance_to(t);
    }

    /// Waits on the host for every stream of the world, as a device synchronize does:
    /// the clock moves until all work is done, the host then knows it is, and the
    /// world's host-sync count goes up by one.
    pub fn synchronize(&self) {
        let mut s = self.world.sim();
        let t = s.idle_time();
        s.advance_to(t);
        s.host_knows_all();
    }

    /// Moves the clock until every enqueued kernel has completed. The host learns
    /// nothing from it: only a query or a synchronize tells the host work is done.
    pub fn run_until_idle(&self) {
        let mut s = self.world.sim();
        let t = s.idle_time();
        s.advance_to(t);
    }

    /// The virtual time, in nanoseconds.
    pub fn now(&self) -> u64 {
        self.world.sim().now
    }

    /// Every hazard seen so far.
    pub fn hazards(&self) -> Vec<Hazard> {
        self.world.sim().hazards.clone()
    }

    /// How many times the host waited for this world's devices.
    pub fn host_syncs(&self) -> u64 {
        self.world.sim().host_syncs
    }

    /// Reads a tensor from the host (checked like any access: the host must know the
    /// last write is done).
    pub fn read_f32(&self, tensor: &MockTensor) -> Vec<f32> {
        let bytes = self.world.sim().host_read(tensor.buffer().0);
        let n = tensor.num_elements();
        bytes.chunks_exact(4).take(n).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    /// Writes a buffer from the host (checked).
    pub fn write_bytes(&self, buffer: BufferId, bytes: &[u8]) {
        self.world.sim().host_write(buffer.0, bytes)
    }

    /// Whether a buffer has been released.
    pub fn is_released(&self, buffer: BufferId) -> bool {
        self.world.sim().is_released(buffer.0)
    }
}

/// A kernel to launch: a name, a duration, declared accesses and an optional effect
/// on the data.
pub struct Kernel {
    name: String,
    duration: u64,
    accesses: Vec<Declared>,
    effect: Option<Effect>,
}

impl Kernel {
    /// A kernel of zero duration that touches nothing.
    pub fn new(name: &str) -> Kernel {
        Kernel { name: name.into(), duration: 0, accesses: Vec::new(), effect: None }
    }
    /// Its duration in nanoseconds.
    pub fn nanos(mut self, n: u64) -> Kernel {
        self.duration = n;
        self
    }
    /// Its duration in microseconds.
    pub fn micros(self, us: u64) -> Kernel {
        self.nanos(us * 1_000)
    }
    /// It reads all of `buffer`.
    pub fn reads(mut self, buffer: BufferId) -> Kernel {
        self.accesses.push(Declared { buffer: buffer.0, range: None, write: false });
        self
    }
    /// It writes all of `buffer`.
    pub fn writes(mut self, buffer: BufferId) -> Kernel {
        self.accesses.push(Declared { buffer: buffer.0, range: None, write: true });
        self
    }
    /// It reads bytes `range` of `buffer`.
    pub fn reads_range(mut self, buffer: BufferId, range: Range<usize>) -> Kernel {
        self.accesses.push(Declared { buffer: buffer.0, range: Some(range), write: false });
        self
    }
    /// It writes bytes `range` of `buffer`.
    pub fn writes_range(mut self, buffer: BufferId, range: Range<usize>) -> Kernel {
        self.accesses.push(Declared { buffer: buffer.0, range: Some(range), write: true });
        self
    }
    /// What it does to the data, when it completes.
    pub fn run(mut self, effect: impl FnOnce(&mut KernelCtx<'_>) + Send + 'static) -> Kernel {
        self.effect = Some(Box::new(effect));
        self
    }
}

struct MockBackend {
    world: Arc<World>,
    ordinal: u32,
    pool: EventPool,
}

impl MockBackend {
    fn own(&self, stream: RawStream) -> Result<()> {
        match self.world.sim().stream_device(stream) {
            Some(d) if d == self.ordinal => Ok(()),
            _ => Err(Error::Backend {
                backend: "mock",
                call: "stream",
                message: format!("{stream} is not a stream of mock:{}", self.ordinal),
            }),
        }
    }
}

impl Backend for MockBackend {
    fn name(&self) -> &'static str {
        "mock"
    }
    fn device(&self) -> Device {
        Device::Mock(self.ordinal)
    }
    fn event_pool(&self) -> &EventPool {
        &self.pool
    }
    fn create_event(&self) -> Result<RawEvent> {
        Ok(self.world.sim().new_event())
    }
    fn destroy_event(&self, _: RawEvent) {}
    fn record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        self.own(stream)?;
        self.world.sim().record(event, stream);
        Ok(())
    }
    fn wait(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        self.own(stream)?;
        self.world.sim().wait(stream, event);
        Ok(())
    }
    fn query(&self, event: RawEvent) -> Result<bool> {
        Ok(self.world.sim().query(event))
    }
    fn synchronize(&self, event: RawEvent) -> Result<()> {
        self.world.sim().synchronize(event);
        Ok(())
    }
    fn describe_stream(&self, stream: RawStream) -> String {
        self.world.sim().stream_name(stream)
    }
    fn is_capturing(&self, stream: RawStream) -> Result<bool> {
        Ok(self.world.captures().contains_key(&stream))
    }
    fn keep_with_graph(
        &self,
        stream: RawStream,
        keep_alive: crate::graph::Kept,
    ) -> std::result::Result<(), (Error, crate::graph::Kept)> {
        match self.world.captures().get_mut(&stream) {
            Some(kept) => {
                kept.push(keep_alive);
                Ok(())
            }
            None => Err((
                Error::Backend {
                    backend: "mock",
                    call: "keep_with_graph",
                    message: format!("{stream} is not capturing"),
                },
                keep_alive,
            )),
        }
    }
}

/// A graph a mock stream captured ([`Mock::end_capture`]): it keeps what releases
/// asked during the capture, and does those releases when dropped.
pub struct MockGraph {
    kept: Vec<crate::graph::Kept>,
}

impl MockGraph {
    /// How many releases the graph keeps.
    pub fn kept(&self) -> usize {
        self.kept.len()
    }
}

impl Drop for MockGraph {
    fn drop(&mut self) {
        for release in self.kept.drain(..) {
            release();
        }
    }
}

// The mock device is an adapter like any other: values move to and from it by name.
crate::registry::submit! {
    crate::registry::Adapter::new("mock", env!("CARGO_PKG_VERSION"))
        .about("handoff's simulated device with a hazard checker (handoff::mock::MockTensor)")
        .devices(&[crate::registry::DeviceKind::Mock])
        .dtypes(crate::dtype::ALL)
        .exports::<crate::mock::MockTensor>()
        .imports::<crate::mock::MockTensor>()
}
