//! Streams, events and per-device event pools, over a [`Backend`] trait that each
//! kind of device implements (host and mock here; CUDA in its own module).

use crate::device::Device;
use crate::error::{Error, Result};
use crate::stats::{self, Counter};
use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::ThreadId;

/// A backend's raw stream handle (a `CUstream` address, a mock stream index).
pub type RawStream = u64;
/// A backend's raw event handle (a `CUevent` address, a mock event index).
pub type RawEvent = u64;

/// What a graph keeps until it is destroyed (see `handoff_runtime::graph`): the release
/// to do then (dropping a keep-alive at its home, or running a callback a framework
/// enqueued during the capture), run once, on a thread of handoff's.
pub type Kept = Box<dyn FnOnce() + Send>;

/// What a kind of device must do for the protocol: events that record a point in a
/// stream, waits that order one stream after such a point without blocking the host,
/// a non-blocking query, and a blocking synchronize (which callers count).
///
/// One backend value serves all streams of one device, and owns that device's
/// [`EventPool`]. Implementations must not block in any method but `synchronize`.
pub trait Backend: std::any::Any + Send + Sync {
    /// A short name for errors (`host`, `mock`, `cuda`).
    fn name(&self) -> &'static str;
    /// The device whose streams this backend drives.
    fn device(&self) -> Device;
    /// The pool of this device's events.
    fn event_pool(&self) -> &EventPool;
    /// Creates an event (the pool calls it only when it has none free).
    fn create_event(&self) -> Result<RawEvent>;
    /// Destroys an event the pool no longer needs.
    fn destroy_event(&self, event: RawEvent);
    /// Records `event` on `stream`: it completes once all work enqueued there so far has.
    /// Never blocks (the reaper records under its queue lock).
    fn record(&self, event: RawEvent, stream: RawStream) -> Result<()>;
    /// Makes work enqueued on `stream` from now on wait for `event`'s latest record.
    fn wait(&self, stream: RawStream, event: RawEvent) -> Result<()>;
    /// Records `event` on `producer` and makes `consumer` wait for it: what
    /// [`record`](Self::record) then [`wait`](Self::wait) do, which is the default;
    /// a backend may do both for the price of one context switch. Returns whether
    /// the record happened, and how the whole went.
    fn record_and_wait(
        &self,
        event: RawEvent,
        producer: RawStream,
        consumer: RawStream,
    ) -> (bool, Result<()>) {
        if let Err(e) = self.record(event, producer) {
            return (false, Err(e));
        }
        (true, self.wait(consumer, event))
    }
    /// Whether `event` has completed. Never blocks.
    fn query(&self, event: RawEvent) -> Result<bool>;
    /// Blocks the host until `event` has completed. Only called through
    /// [`stats::host_sync`], so every use is counted.
    fn synchronize(&self, event: RawEvent) -> Result<()>;
    /// A name for a raw stream in messages.
    fn describe_stream(&self, stream: RawStream) -> String {
        format!("{}:{stream:#x}", self.device())
    }
    /// Whether `stream` names a different stream on each thread (CUDA's per-thread
    /// default stream): a [`Stream`] of it then belongs to the thread that made it.
    fn is_thread_relative(&self, _stream: RawStream) -> bool {
        false
    }
    /// Whether `stream` is capturing a graph (a CUDA graph): work enqueued there is
    /// recorded into the graph, not run, so no event recorded there can be asked
    /// whether it completed. Never blocks. The default: streams never capture.
    fn is_capturing(&self, _stream: RawStream) -> Result<bool> {
        Ok(false)
    }
    /// Makes the calling thread's event queries never disturb a graph capture that
    /// another thread makes (CUDA: the thread's capture interaction mode, relaxed, as
    /// PyTorch's allocator does around its own queries; a capture in global mode would
    /// otherwise be invalidated by them). Called by handoff's own threads before they
    /// query this backend's events, never on a thread of the program's. Never blocks.
    /// The default: nothing (its streams never capture).
    fn relax_capture_mode(&self) {}
    /// Keeps `keep_alive` until the graph `stream` is capturing is destroyed and every
    /// launch of it is done, then drops it on a thread of handoff's (see
    /// `handoff_runtime::graph`). Called only where [`is_capturing`](Self::is_capturing) said
    /// so; on failure, `keep_alive` comes back (and is leaked, as a replay may use it).
    /// The default cannot: it says so.
    fn keep_with_graph(&self, stream: RawStream, keep_alive: Kept) -> std::result::Result<(), (Error, Kept)> {
        let reason = format!(
            "the {} backend cannot keep memory for a graph of {}",
            self.name(),
            self.describe_stream(stream)
        );
        Err((Error::Backend { backend: self.name(), call: "keep_with_graph", message: reason }, keep_alive))
    }
}

/// Releases kept with graphs and not run yet ([`counted`]).
static KEPT_WITH_GRAPHS: AtomicUsize = AtomicUsize::new(0);

/// `release`, counted in [`kept_with_graphs`] until it has run: what a graph keeps.
pub(crate) fn counted(release: Kept) -> Kept {
    KEPT_WITH_GRAPHS.fetch_add(1, Ordering::SeqCst);
    Box::new(move || {
        release();
        KEPT_WITH_GRAPHS.fetch_sub(1, Ordering::SeqCst);
    })
}

/// How many releases graphs keep and have not run yet: those of live graphs, and those
/// the driver has not yet handed back after a graph was destroyed
/// ([`crate::graph::pending`]).
pub(crate) fn kept_with_graphs() -> usize {
    KEPT_WITH_GRAPHS.load(Ordering::SeqCst)
}

/// Free events of one device, reused so that a steady state creates none.
#[derive(Debug, Default)]
pub struct EventPool {
    free: Mutex<Vec<RawEvent>>,
    created: AtomicU64,
}

impl EventPool {
    /// An empty pool.
    pub const fn new() -> EventPool {
        EventPool { free: Mutex::new(Vec::new()), created: AtomicU64::new(0) }
    }

    /// How many events this pool has created in all.
    pub fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// How many events are free in the pool now.
    pub fn free(&self) -> usize {
        self.free.lock().map(|f| f.len()).unwrap_or(0)
    }

    fn take(&self, backend: &dyn Backend) -> Result<RawEvent> {
        if let Some(e) = self.free.lock().ok().and_then(|mut f| f.pop()) {
            return Ok(e);
        }
        let e = backend.create_event()?;
        self.created.fetch_add(1, Ordering::Relaxed);
        stats::count(Counter::EventsCreated, 1);
        Ok(e)
    }

    fn put(&self, backend: &dyn Backend, event: RawEvent) {
        self.put_all(backend, &[event]);
    }

    /// Moves up to `into.len()` free events into `into` under one lock; returns how
    /// many (none when the pool has none free).
    fn take_free(&self, into: &mut [RawEvent]) -> usize {
        let Ok(mut f) = self.free.lock() else { return 0 };
        let n = into.len().min(f.len());
        let from = f.len() - n;
        into[..n].copy_from_slice(&f[from..]);
        f.truncate(from);
        n
    }

    /// Gives `events` back under one lock (destroys them if the pool is poisoned).
    fn put_all(&self, backend: &dyn Backend, events: &[RawEvent]) {
        match self.free.lock() {
            Ok(mut f) => f.extend_from_slice(events),
            Err(_) => events.iter().for_each(|&e| backend.destroy_event(e)),
        }
    }
}

/// A cheap, clonable handle to a stream of some backend. Two handles to the same
/// stream compare equal. handoff never destroys a stream: it borrows streams owned
/// by PyTorch, XLA, cudarc or the mock device, and keeps the owner alive when it is
/// given one ([`Stream::with_owner`]).
///
/// A handle that names a different stream on each thread (CUDA's per-thread default
/// stream, DLPack's stream value 2) is the stream of the thread that made the
/// `Stream`: such streams of two threads are different streams, and using one on
/// another thread is refused ([`Error::WrongThread`]).
///
/// ```
/// use handoff_runtime::{Device, Stream};
/// let host = Stream::host();
/// assert_eq!(host, Stream::host());
/// assert_eq!(host.device(), Device::Host);
/// ```
#[derive(Clone)]
pub struct Stream {
    backend: BackendRef,
    raw: RawStream,
    /// The thread a thread-relative handle belongs to.
    thread: Option<ThreadId>,
    /// What keeps the raw stream alive, when it was given.
    owner: Option<Arc<dyn Any + Send + Sync>>,
}

/// How a stream or an event holds its backend: a backend that lives as long as the
/// process (CUDA's per device, the host's) is borrowed, so that the streams and events
/// every hand-off makes and drops touch no count shared with other threads (the
/// reaper's); any other is shared.
#[derive(Clone)]
enum BackendRef {
    Process(&'static dyn Backend),
    Shared(Arc<dyn Backend>),
}

impl BackendRef {
    /// The backend's address: its identity.
    #[inline]
    fn addr(&self) -> *const () {
        &**self as *const dyn Backend as *const ()
    }

    /// A free event: from the calling thread's spares when the backend lives as long
    /// as the process (no lock), else from the pool.
    fn take_event(&self) -> Result<RawEvent> {
        match self {
            BackendRef::Process(b) => spare::take(*b),
            BackendRef::Shared(b) => b.event_pool().take(&**b),
        }
    }

    /// Gives an event back, to the calling thread's spares when it can keep it.
    fn put_event(&self, event: RawEvent) {
        match self {
            BackendRef::Process(b) => spare::put(*b, event),
            BackendRef::Shared(b) => b.event_pool().put(&**b, event),
        }
    }
}

/// A few free events of one process-lived backend (CUDA's, the host's) that each
/// thread keeps, so that ordering and releasing take and give back their event
/// without the pool's lock, which the reaper's thread takes too. A thread that runs
/// out refills half its room from the pool, and one with no room left gives half back,
/// each under one lock: a thread that releases (takes events) while the reaper gives
/// them back touches the pool once per few events, not once per event. They go back
/// to the pool when the thread ends.
mod spare {
    use super::{Backend, RawEvent};
    use crate::error::Result;
    use std::cell::RefCell;

    const KEPT: usize = 8;
    /// How many events a refill takes and a spill gives back at once.
    const BATCH: usize = KEPT / 2;

    struct Spares {
        backend: Option<&'static dyn Backend>,
        events: [RawEvent; KEPT],
        len: usize,
    }

    impl Drop for Spares {
        fn drop(&mut self) {
            if let Some(b) = self.backend {
                b.event_pool().put_all(b, &self.events[..self.len]);
            }
        }
    }

    thread_local! {
        static SPARES: RefCell<Spares> = const { RefCell::new(Spares { backend: None, events: [0; KEPT], len: 0 }) };
    }

    fn same(a: Option<&'static dyn Backend>, b: &'static dyn Backend) -> bool {
        a.is_some_and(|a| std::ptr::addr_eq(a as *const dyn Backend, b as *const dyn Backend))
    }

    pub(super) fn take(b: &'static dyn Backend) -> Result<RawEvent> {
        let kept = SPARES
            .try_with(|s| {
                let mut s = s.borrow_mut();
                if s.len == 0 {
                    // Refill from the pool (one lock), for this backend.
                    let n = b.event_pool().take_free(&mut s.events[..BATCH]);
                    if n == 0 {
                        return None;
                    }
                    s.backend = Some(b);
                    s.len = n;
                }
                same(s.backend, b).then(|| {
                    s.len -= 1;
                    s.events[s.len]
                })
            })
            .ok()
            .flatten();
        match kept {
            Some(e) => Ok(e),
            None => b.event_pool().take(b),
        }
    }

    pub(super) fn put(b: &'static dyn Backend, event: RawEvent) {
        let kept = SPARES
            .try_with(|s| {
                let mut s = s.borrow_mut();
                if s.len == 0 {
                    s.backend = Some(b);
                }
                if !same(s.backend, b) {
                    return false;
                }
                if s.len == KEPT {
                    // Full: the older half goes back to the pool (one lock).
                    b.event_pool().put_all(b, &s.events[..BATCH]);
                    s.events.copy_within(BATCH.., 0);
                    s.len -= BATCH;
                }
                let n = s.len;
                s.events[n] = event;
                s.len += 1;
                true
            })
            .unwrap_or(false);
        if !kept {
            b.event_pool().put(b, event);
        }
    }
}

impl std::ops::Deref for BackendRef {
    type Target = dyn Backend;
    fn deref(&self) -> &(dyn Backend + 'static) {
        match self {
            BackendRef::Process(b) => *b,
            BackendRef::Shared(b) => &**b,
        }
    }
}

impl Stream {
    /// A stream of `backend` named by its raw handle (of the calling thread, for a
    /// thread-relative handle).
    pub fn new(backend: Arc<dyn Backend>, raw: RawStream) -> Stream {
        Stream::with_backend(BackendRef::Shared(backend), raw)
    }

    /// A stream of a backend that lives as long as the process (a `static`, or a
    /// leaked box), as CUDA's does: its streams and events are made and dropped
    /// without touching a count shared with other threads, and each thread keeps a
    /// few of its free events, so ordering on it and releasing after it take no lock.
    ///
    /// ```
    /// use handoff_runtime::testing::NoopBackend; // (feature `testing`)
    /// use handoff_runtime::{Device, Stream};
    /// /// A device whose work is always done (a real backend calls its driver).
    /// static INSTANT: NoopBackend = NoopBackend::new(Device::Cuda(0));
    /// let (a, b) = (Stream::new_static(&INSTANT, 1), Stream::new_static(&INSTANT, 2));
    /// assert_ne!(a, b);
    /// assert_eq!(a, Stream::new_static(&INSTANT, 1));
    /// assert_eq!(handoff_runtime::order(Some(&a), &b).unwrap(), handoff_runtime::Ready::Waited);
    /// ```
    pub fn new_static(backend: &'static dyn Backend, raw: RawStream) -> Stream {
        Stream::with_backend(BackendRef::Process(backend), raw)
    }

    fn with_backend(backend: BackendRef, raw: RawStream) -> Stream {
        let thread = backend.is_thread_relative(raw).then(|| std::thread::current().id());
        Stream { backend, raw, thread, owner: None }
    }

    /// The same stream, keeping `owner` (what owns the raw stream: a cudarc
    /// `CudaStream`, an XLA client) alive for as long as any clone of it lives.
    pub fn with_owner(mut self, owner: Arc<dyn Any + Send + Sync>) -> Stream {
        self.owner = Some(owner);
        self
    }

    /// The host "stream": work on it is done when the call that does it returns.
    pub fn host() -> Stream {
        static HOST: OnceLock<HostBackend> = OnceLock::new();
        let backend = HOST.get_or_init(|| HostBackend { pool: EventPool::new() });
        Stream { backend: BackendRef::Process(backend), raw: 0, thread: None, owner: None }
    }

    /// Whether this is the host stream.
    #[inline]
    pub fn is_host(&self) -> bool {
        self.backend.device() == Device::Host
    }

    /// The device of this stream.
    #[inline]
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// The backend's raw handle of this stream.
    #[inline]
    pub fn raw(&self) -> RawStream {
        self.raw
    }

    /// For a thread-relative handle (CUDA's per-thread default stream), the thread
    /// whose stream it is; `None` for every other stream.
    pub fn thread(&self) -> Option<ThreadId> {
        self.thread
    }

    /// Whether the raw handle names this stream on the calling thread (always, but
    /// for another thread's per-thread default stream).
    #[inline]
    pub fn is_usable_here(&self) -> bool {
        self.thread.is_none_or(|t| t == std::thread::current().id())
    }

    fn check_thread(&self) -> Result<()> {
        match self.thread {
            Some(owner) if owner != std::thread::current().id() => Err(Error::WrongThread {
                stream: format!("{self:?}"),
                owner: format!("{owner:?}"),
                here: format!("{:?}", std::thread::current().id()),
            }),
            _ => Ok(()),
        }
    }

    /// The backend behind this stream.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Records a pooled event on this stream (counted).
    pub fn record(&self) -> Result<Event> {
        self.check_thread()?;
        let raw = self.backend.take_event()?;
        let event = Event { backend: self.backend.clone(), raw };
        self.backend.record(raw, self.raw)?;
        stats::count(Counter::EventsRecorded, 1);
        Ok(event)
    }

    /// Makes work enqueued on this stream from now on wait for all work enqueued on
    /// `producer` so far: one pooled event recorded there and waited for here (both
    /// counted), in one [`Backend::record_and_wait`]. The host does not wait.
    pub(crate) fn wait_for(&self, producer: &Stream) -> Result<()> {
        if self.backend.addr() != producer.backend.addr() {
            return Err(incompatible(&*producer.backend, &*self.backend));
        }
        producer.check_thread()?;
        self.check_thread()?;
        let event = Event { backend: producer.backend.clone(), raw: producer.backend.take_event()? };
        let (recorded, waited) = producer.backend.record_and_wait(event.raw, producer.raw, self.raw);
        if recorded {
            stats::count(Counter::EventsRecorded, 1);
        }
        waited?;
        stats::count(Counter::WaitsEnqueued, 1);
        Ok(())
    }

    /// Makes work enqueued on this stream from now on wait for `event` (counted).
    /// The host does not wait. An event of another device is refused.
    pub fn wait(&self, event: &Event) -> Result<()> {
        if self.backend.addr() != event.backend.addr() {
            return Err(incompatible(&*event.backend, &*self.backend));
        }
        self.check_thread()?;
        self.backend.wait(self.raw, event.raw)?;
        stats::count(Counter::WaitsEnqueued, 1);
        Ok(())
    }

    /// Keeps `release` with the graph this stream captures, to run once the graph is
    /// destroyed ([`Backend::keep_with_graph`]), counted in [`kept_with_graphs`] until it
    /// has run. On failure what comes back is to be leaked (a replay may use what it
    /// holds), and stays counted.
    pub(crate) fn keep_with_graph(&self, release: Kept) -> std::result::Result<(), (Error, Kept)> {
        self.backend.keep_with_graph(self.raw, counted(release))
    }

    /// Whether this stream is capturing a graph (see [`Backend::is_capturing`]); the
    /// host stream never is.
    pub fn is_capturing(&self) -> Result<bool> {
        if self.is_host() {
            return Ok(false);
        }
        self.backend.is_capturing(self.raw)
    }

    /// Blocks the host until all work enqueued on this stream so far is done
    /// (a counted host sync). Not used on any hand-off path.
    pub fn synchronize(&self) -> Result<()> {
        if self.is_host() {
            return Ok(());
        }
        self.record()?.synchronize()
    }

    #[inline]
    fn key(&self) -> (*const (), RawStream, Option<ThreadId>) {
        (self.backend.addr(), self.raw, self.thread)
    }
}

/// Whether `backend` is the one behind `stream`.
pub(crate) fn is_backend_of(backend: &dyn Backend, stream: &Stream) -> bool {
    std::ptr::addr_eq(backend as *const dyn Backend, stream.backend() as *const dyn Backend)
}

pub(crate) fn incompatible(producer: &dyn Backend, consumer: &dyn Backend) -> Error {
    let (p, c) = (producer.device(), consumer.device());
    if p != c && producer.name() == consumer.name() {
        Error::CrossDevice { from: p, to: c }
    } else {
        Error::IncompatibleStreams {
            producer: producer.name(),
            consumer: consumer.name(),
            reason: format!("an event of {p} cannot be waited on by a stream of {c}"),
        }
    }
}

impl PartialEq for Stream {
    #[inline]
    fn eq(&self, other: &Stream) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Stream {}
impl Hash for Stream {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}
impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.thread {
            Some(t) => write!(f, "Stream({} of {t:?})", self.backend.describe_stream(self.raw)),
            None => write!(f, "Stream({})", self.backend.describe_stream(self.raw)),
        }
    }
}

/// A recorded point in a stream, from its device's pool; returned to the pool on drop.
pub struct Event {
    backend: BackendRef,
    raw: RawEvent,
}

impl Event {
    /// Whether the work before the record has completed. Never blocks.
    pub fn query(&self) -> Result<bool> {
        self.backend.query(self.raw)
    }

    /// Blocks the host until the event has completed (a counted host sync).
    pub fn synchronize(&self) -> Result<()> {
        stats::host_sync(|| self.backend.synchronize(self.raw))
    }

    /// The device of the stream it was recorded on.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// The backend's raw handle.
    pub fn raw(&self) -> RawEvent {
        self.raw
    }

    /// [`Backend::relax_capture_mode`] of its backend, on this thread.
    pub(crate) fn relax_capture_mode(&self) {
        self.backend.relax_capture_mode();
    }

    /// A handle that asks about this event without owning it, for the reaper, which
    /// asks with no lock held while the event's owner stays in its queue.
    pub(crate) fn probe(&self) -> EventProbe {
        EventProbe { backend: self.backend.clone(), raw: self.raw }
    }
}

/// Asks about an [`Event`] it does not own ([`Event::probe`]). Once the event's owner
/// gave it back to the pool, another record may reuse it: the answer is then about
/// that record, which the reaper's use allows for (see `reaper::sweep`).
pub(crate) struct EventProbe {
    backend: BackendRef,
    raw: RawEvent,
}

impl EventProbe {
    /// [`Event::query`], of the event's latest record. Never blocks.
    pub(crate) fn query(&self) -> Result<bool> {
        self.backend.query(self.raw)
    }

    /// [`Backend::relax_capture_mode`] of its backend, on this thread.
    pub(crate) fn relax_capture_mode(&self) {
        self.backend.relax_capture_mode();
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        self.backend.put_event(self.raw);
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event({}, {:#x})", self.backend.device(), self.raw)
    }
}

/// Host memory has no stream: work on it is complete when the call returns.
struct HostBackend {
    pool: EventPool,
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }
    fn device(&self) -> Device {
        Device::Host
    }
    fn event_pool(&self) -> &EventPool {
        &self.pool
    }
    fn create_event(&self) -> Result<RawEvent> {
        Ok(0)
    }
    fn destroy_event(&self, _: RawEvent) {}
    fn record(&self, _: RawEvent, _: RawStream) -> Result<()> {
        Ok(())
    }
    fn wait(&self, _: RawStream, _: RawEvent) -> Result<()> {
        Ok(())
    }
    fn query(&self, _: RawEvent) -> Result<bool> {
        Ok(true)
    }
    fn synchronize(&self, _: RawEvent) -> Result<()> {
        Ok(())
    }
    fn describe_stream(&self, _: RawStream) -> String {
        "host".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream_ordered::{Ready, order};
    use crate::testing::NoopBackend;

    #[test]
    fn a_thread_keeps_a_few_spare_events_and_gives_them_back_when_it_ends() {
        // Process-lived, as CUDA's backends are.
        static LASTING: NoopBackend = NoopBackend::new(Device::Mock(7));
        let s = Stream::with_backend(BackendRef::Process(&LASTING), 1);
        let s2 = s.clone();
        let pool = LASTING.event_pool();
        std::thread::spawn(move || {
            // One event, reused through this thread's spares: none created again, and
            // none went back to the pool meanwhile.
            for _ in 0..10 {
                drop(s.record().unwrap());
            }
            assert_eq!(pool.created(), 1);
            assert_eq!(pool.free(), 0);
            // Ten at once: eight stay with the thread; the ninth finds no room, and the
            // older half (four) goes back to the pool in one go.
            let held: Vec<Event> = (0..10).map(|_| s.record().unwrap()).collect();
            drop(held);
            assert_eq!(pool.free(), 4);
        })
        .join()
        .unwrap();
        // The thread ended: its spares went back.
        assert_eq!(pool.free(), 10);
        assert_eq!(pool.created(), 10);
        // A thread that runs out takes half its room from the pool at once.
        std::thread::spawn(move || {
            let e = s2.record().unwrap();
            assert_eq!(pool.free(), 6);
            drop(e);
            assert_eq!(pool.free(), 6);
        })
        .join()
        .unwrap();
        assert_eq!(pool.free(), 10);
        assert_eq!(pool.created(), 10, "none created: all came from the pool");
    }

    #[test]
    fn a_thread_relative_handle_is_the_stream_of_the_thread_that_made_it() {
        // Handle 2 means "the calling thread's stream", as CUDA's per-thread default
        // stream does.
        let device = Arc::new(NoopBackend::new(Device::Mock(7)).thread_relative(2).counted());
        let backend: Arc<dyn Backend> = device.clone();
        let here = Stream::new(backend.clone(), 2);
        let b = backend.clone();
        let there = std::thread::spawn(move || Stream::new(b, 2)).join().unwrap();
        // Two streams: equal and hashed alike, a hand-off between the two threads'
        // streams would elide its wait.
        assert_ne!(here, there);
        assert_eq!(here, Stream::new(backend.clone(), 2));
        assert!(here.is_usable_here() && !there.is_usable_here());
        assert!(format!("{there:?}").contains("ThreadId"), "{there:?}");
        match order(Some(&there), &here) {
            Err(Error::WrongThread { stream, .. }) => assert!(stream.contains("mock:7"), "{stream}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(here.wait(&here.record().unwrap()), Ok(())));
        let records = device.calls().records;
        assert!(matches!(there.record(), Err(Error::WrongThread { .. })));
        assert_eq!(device.calls().records, records, "a refused record reached the device");
        // Other handles of the backend are one stream on every thread.
        let b = backend.clone();
        let plain_there = std::thread::spawn(move || Stream::new(b, 5)).join().unwrap();
        assert_eq!(plain_there, Stream::new(backend.clone(), 5));
        assert_eq!(order(Some(&plain_there), &here).unwrap(), Ready::Waited);
    }

    #[test]
    fn an_owner_is_kept_alive_by_every_clone() {
        let owner = Arc::new(5u32);
        let s = Stream::host().with_owner(owner.clone());
        let c = s.clone();
        drop(s);
        assert_eq!(Arc::strong_count(&owner), 2);
        assert_eq!(c, Stream::host(), "the owner is not part of the stream's identity");
        drop(c);
        assert_eq!(Arc::strong_count(&owner), 1);
    }
}
