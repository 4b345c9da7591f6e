//! Test doubles for code built on the runtime (cargo feature `testing`; the runtime's
//! own unit tests use them too): [`NoopBackend`], a device [`Backend`] whose every call
//! succeeds at once and does nothing, and [`Calls`], what reached it when it counts.
//!
//! For tests and benchmarks that need device streams and events but no device: what
//! is left is the runtime's own work. A model of a device that completes late, fails
//! or captures is a backend of its own (see [`crate::mock`] for a simulated one).
//!
//! Enable it from another crate's tests and benchmarks:
//!
//! ```toml
//! [dev-dependencies]
//! handoff-runtime = { version = "0.1", features = ["testing"] }
//! ```
//!
//! ```
//! use handoff_runtime::testing::NoopBackend;
//! use handoff_runtime::{Device, Ready, Stream, order};
//! use std::sync::Arc;
//!
//! let device = Arc::new(NoopBackend::new(Device::Cuda(0)));
//! let (a, b) = (Stream::new(device.clone(), 1), Stream::new(device, 2));
//! assert_eq!(order(Some(&a), &b).unwrap(), Ready::Waited);
//! assert!(a.record().unwrap().query().unwrap(), "its work is always done");
//! ```

use crate::device::Device;
use crate::error::Result;
use crate::stream::{Backend, EventPool, RawEvent, RawStream};
use std::sync::atomic::{AtomicU64, Ordering};

/// A device backend whose calls all succeed and do nothing: records and waits are
/// free, every event has completed, a synchronize returns at once, and no stream
/// captures a graph. Its events are numbered from 1, one per event the pool creates
/// (its [`EventPool::created`] counts them).
///
/// Made in a `const` context, so that a `static` one gives streams of a backend that
/// lives as long as the process ([`Stream::new_static`](crate::Stream::new_static)),
/// as CUDA's does. It counts the calls that reach it only when made
/// [`counted`](Self::counted), so that a benchmark of the runtime's host cost over it
/// times nothing else.
///
/// ```
/// use handoff_runtime::testing::NoopBackend;
/// use handoff_runtime::{Backend, Device, Stream};
///
/// static DEVICE: NoopBackend = NoopBackend::new(Device::Cuda(0));
/// let s = Stream::new_static(&DEVICE, 0x1000);
/// assert_eq!(s.device(), Device::Cuda(0));
/// s.synchronize().unwrap();
/// assert_eq!(DEVICE.event_pool().created(), 1);
/// ```
#[derive(Debug)]
pub struct NoopBackend {
    device: Device,
    pool: EventPool,
    /// The handle of the last event created.
    last_event: AtomicU64,
    thread_relative: Option<RawStream>,
    counts: Option<Counts>,
}

/// The counters of a [`counted`](NoopBackend::counted) backend.
#[derive(Debug)]
struct Counts {
    records: AtomicU64,
    waits: AtomicU64,
    queries: AtomicU64,
    synchronizes: AtomicU64,
}

/// How many calls of each kind reached a [`counted`](NoopBackend::counted)
/// [`NoopBackend`] ([`NoopBackend::calls`]). A record and wait in one
/// ([`Backend::record_and_wait`]) counts as one of each.
///
/// ```
/// use handoff_runtime::testing::{Calls, NoopBackend};
/// use handoff_runtime::Device;
///
/// let device = NoopBackend::new(Device::Mock(0)).counted();
/// assert_eq!(device.calls(), Calls::default());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls {
    /// [`Backend::record`]s.
    pub records: u64,
    /// [`Backend::wait`]s.
    pub waits: u64,
    /// [`Backend::query`]s.
    pub queries: u64,
    /// [`Backend::synchronize`]s.
    pub synchronizes: u64,
}

impl NoopBackend {
    /// A backend of `device` whose streams are one stream on every thread, and which
    /// counts nothing.
    ///
    /// ```
    /// use handoff_runtime::testing::NoopBackend;
    /// use handoff_runtime::{Device, Stream};
    /// use std::sync::Arc;
    ///
    /// let s = Stream::new(Arc::new(NoopBackend::new(Device::Mock(3))), 1);
    /// assert_eq!(format!("{s:?}"), "Stream(mock:3:0x1)");
    /// ```
    pub const fn new(device: Device) -> NoopBackend {
        NoopBackend {
            device,
            pool: EventPool::new(),
            last_event: AtomicU64::new(0),
            thread_relative: None,
            counts: None,
        }
    }

    /// The same backend, whose handle `stream` names a different stream on each
    /// thread, as CUDA's per-thread default stream does ([`Backend::is_thread_relative`]).
    ///
    /// ```
    /// use handoff_runtime::testing::NoopBackend;
    /// use handoff_runtime::{Device, Stream};
    /// use std::sync::Arc;
    ///
    /// let device = Arc::new(NoopBackend::new(Device::Cuda(0)).thread_relative(2));
    /// let here = Stream::new(device.clone(), 2);
    /// let d = device.clone();
    /// let there = std::thread::spawn(move || Stream::new(d, 2)).join().unwrap();
    /// assert_ne!(here, there);
    /// assert!(there.record().is_err(), "another thread's stream");
    /// ```
    pub const fn thread_relative(mut self, stream: RawStream) -> NoopBackend {
        self.thread_relative = Some(stream);
        self
    }

    /// The same backend, counting the records, waits, queries and synchronizes that
    /// reach it ([`calls`](Self::calls)).
    ///
    /// ```
    /// use handoff_runtime::testing::NoopBackend;
    /// use handoff_runtime::{Device, Stream, order};
    /// use std::sync::Arc;
    ///
    /// let device = Arc::new(NoopBackend::new(Device::Cuda(0)).counted());
    /// let (a, b) = (Stream::new(device.clone(), 1), Stream::new(device.clone(), 2));
    /// order(Some(&a), &b).unwrap();
    /// order(Some(&b), &b).unwrap(); // the same stream: elided, no call
    /// let calls = device.calls();
    /// assert_eq!((calls.records, calls.waits, calls.synchronizes), (1, 1, 0));
    /// ```
    pub const fn counted(mut self) -> NoopBackend {
        self.counts = Some(Counts {
            records: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            queries: AtomicU64::new(0),
            synchronizes: AtomicU64::new(0),
        });
        self
    }

    /// How many calls of each kind reached this backend so far.
    ///
    /// # Panics
    ///
    /// If the backend was not made [`counted`](Self::counted): it would say nothing
    /// happened.
    ///
    /// ```
    /// use handoff_runtime::testing::NoopBackend;
    /// use handoff_runtime::{Device, Stream};
    /// use std::sync::Arc;
    ///
    /// let device = Arc::new(NoopBackend::new(Device::Cuda(0)).counted());
    /// Stream::new(device.clone(), 1).synchronize().unwrap();
    /// assert_eq!((device.calls().records, device.calls().synchronizes), (1, 1));
    /// ```
    pub fn calls(&self) -> Calls {
        let c = self.counts.as_ref().expect("NoopBackend::calls of a backend not made `counted()`");
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        Calls {
            records: load(&c.records),
            waits: load(&c.waits),
            queries: load(&c.queries),
            synchronizes: load(&c.synchronizes),
        }
    }

    #[inline]
    fn count(&self, which: fn(&Counts) -> &AtomicU64) {
        if let Some(c) = &self.counts {
            which(c).fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Backend for NoopBackend {
    fn name(&self) -> &'static str {
        "noop"
    }
    fn device(&self) -> Device {
        self.device
    }
    fn event_pool(&self) -> &EventPool {
        &self.pool
    }
    fn create_event(&self) -> Result<RawEvent> {
        Ok(self.last_event.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn destroy_event(&self, _: RawEvent) {}
    fn record(&self, _: RawEvent, _: RawStream) -> Result<()> {
        self.count(|c| &c.records);
        Ok(())
    }
    fn wait(&self, _: RawStream, _: RawEvent) -> Result<()> {
        self.count(|c| &c.waits);
        Ok(())
    }
    fn query(&self, _: RawEvent) -> Result<bool> {
        self.count(|c| &c.queries);
        Ok(true)
    }
    fn synchronize(&self, _: RawEvent) -> Result<()> {
        self.count(|c| &c.synchronizes);
        Ok(())
    }
    fn is_thread_relative(&self, stream: RawStream) -> bool {
        self.thread_relative == Some(stream)
    }
}
