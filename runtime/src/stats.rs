//! Counters of everything a hand-off does on the device and the host (rule 4).
//!
//! Every place handoff or an adapter could block the host goes through
//! [`host_sync`], so `host_syncs` is the number of times the CPU waited for a device.
//! Each thread counts in a block of its own (no locked instruction, no cache line
//! written by two threads); the process-wide counters are the sum over the threads,
//! live and ended. A test can measure a region on its own thread while other tests
//! run:
//!
//! ```
//! use handoff_runtime::stats;
//! let (_, delta) = stats::measure(|| { /* hand-offs */ });
//! assert_eq!(delta.host_syncs, 0);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Counter {
    /// Values exported into a [`crate::Handoff`].
    Exports,
    /// Hand-offs taken in by a consumer (including foreign DLPack imports).
    Imports,
    /// Times the host blocked on a device (through [`host_sync`]).
    HostSyncs,
    /// Events created by the pools (a steady state creates none).
    EventsCreated,
    /// Events recorded on a stream.
    EventsRecorded,
    /// Stream waits enqueued.
    WaitsEnqueued,
    /// Waits not needed (same stream, host memory) and so never enqueued.
    WaitsElided,
    /// Copies made (only ever on request).
    Copies,
    /// Bytes copied by those copies.
    BytesCopied,
    /// Keep-alives released at once (same stream or host consumer).
    ReleasesImmediate,
    /// Keep-alives handed to the reaper behind an event.
    ReleasesDeferred,
    /// Keep-alives whose consumer stream was capturing a graph (a CUDA graph): kept
    /// until that graph is destroyed, since every replay uses their memory. See
    /// [`crate::graph`].
    ReleasesWithGraph,
    /// Keep-alives leaked on purpose, never dropped: the device could not say whether
    /// work using their memory was done (a failed event record, query or
    /// synchronize), the exit drain's deadline passed, or the release was asked for in
    /// a forked child. Freeing such memory could hand it to a new owner while a kernel
    /// still uses it; leaking it is the safe failure. See [`crate::reaper`].
    ReleasesLeaked,
}

const N: usize = Counter::ReleasesLeaked as usize + 1;

/// The slots every thread keeps: the [`Counter`]s, then the CUDA driver calls (which
/// `Stats` does not show; `cuda::driver_calls` reads them).
const SLOTS: usize = N + 1;
/// The slot of the CUDA driver calls.
#[cfg(feature = "cuda")]
pub(crate) const DRIVER_CALLS: usize = N;

/// One thread's counts: written by that thread alone, with a plain load and store
/// (no locked instruction, no cache line shared with another writer), read by any.
struct Block([AtomicU64; SLOTS]);

/// Every live thread's [`Block`], and what threads that ended had counted.
struct Registry {
    live: Mutex<Vec<Arc<Block>>>,
    ended: [AtomicU64; SLOTS],
}

static REGISTRY: Registry =
    Registry { live: Mutex::new(Vec::new()), ended: [const { AtomicU64::new(0) }; SLOTS] };

fn live() -> MutexGuard<'static, Vec<Arc<Block>>> {
    // Nothing panics under the lock; the list is consistent at every unlock.
    REGISTRY.live.lock().unwrap_or_else(|p| p.into_inner())
}

/// The calling thread's block, registered on first use; at thread exit its counts
/// move to `ended`, under the same lock that readers sum under.
struct Local(Arc<Block>);

impl Local {
    fn register() -> Local {
        let block = Arc::new(Block([const { AtomicU64::new(0) }; SLOTS]));
        live().push(block.clone());
        Local(block)
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let mut live = live();
        for (ended, mine) in REGISTRY.ended.iter().zip(&self.0.0) {
            ended.fetch_add(mine.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        live.retain(|b| !Arc::ptr_eq(b, &self.0));
    }
}

thread_local! {
    static LOCAL: Local = Local::register();
}

/// Adds `n` to slot `i` of the calling thread (of `ended` for a thread being torn
/// down, whose block is gone).
#[inline]
pub(crate) fn add(i: usize, n: u64) {
    if LOCAL
        .try_with(|l| {
            let c = &l.0.0[i];
            // Only this thread writes its block: a load and a store cannot lose a count.
            c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        })
        .is_err()
    {
        REGISTRY.ended[i].fetch_add(n, Ordering::Relaxed);
    }
}

/// Every slot over the whole process, summed under one lock (one snapshot).
fn totals() -> [u64; SLOTS] {
    let live = live();
    std::array::from_fn(|i| {
        REGISTRY.ended[i].load(Ordering::Relaxed)
            + live.iter().map(|b| b.0[i].load(Ordering::Relaxed)).sum::<u64>()
    })
}

/// Slot `i` over the whole process.
#[cfg(feature = "cuda")]
pub(crate) fn total(i: usize) -> u64 {
    totals()[i]
}

/// Slot `i` of the calling thread (0 for a thread being torn down).
pub(crate) fn of_this_thread(i: usize) -> u64 {
    LOCAL.try_with(|l| l.0.0[i].load(Ordering::Relaxed)).unwrap_or(0)
}

/// Adds `n` to a counter, on this thread (and so process-wide). Only the runtime
/// counts; adapters reach the few counts they need through named functions
/// (`adapter_counts`).
#[inline]
pub(crate) fn count(counter: Counter, n: u64) {
    add(counter as usize, n);
}

/// Runs a call that blocks the host until a device has done some work, and counts
/// it. This is the only way handoff and its adapters block on a device.
#[inline]
pub fn host_sync<R>(f: impl FnOnce() -> R) -> R {
    count(Counter::HostSyncs, 1);
    f()
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// See `Exports`.
    pub exports: u64,
    /// See `Imports`.
    pub imports: u64,
    /// See `HostSyncs`.
    pub host_syncs: u64,
    /// See `EventsCreated`.
    pub events_created: u64,
    /// See `EventsRecorded`.
    pub events_recorded: u64,
    /// See `WaitsEnqueued`.
    pub waits_enqueued: u64,
    /// See `WaitsElided`.
    pub waits_elided: u64,
    /// See `Copies`.
    pub copies: u64,
    /// See `BytesCopied`.
    pub bytes_copied: u64,
    /// See `ReleasesImmediate`.
    pub releases_immediate: u64,
    /// See `ReleasesDeferred`.
    pub releases_deferred: u64,
    /// See `ReleasesWithGraph`.
    pub releases_with_graph: u64,
    /// See `Stats::releases_leaked`.
    pub releases_leaked: u64,
}

impl Stats {
    fn from_fn(mut get: impl FnMut(usize) -> u64) -> Stats {
        Stats {
            exports: get(Counter::Exports as usize),
            imports: get(Counter::Imports as usize),
            host_syncs: get(Counter::HostSyncs as usize),
            events_created: get(Counter::EventsCreated as usize),
            events_recorded: get(Counter::EventsRecorded as usize),
            waits_enqueued: get(Counter::WaitsEnqueued as usize),
            waits_elided: get(Counter::WaitsElided as usize),
            copies: get(Counter::Copies as usize),
            bytes_copied: get(Counter::BytesCopied as usize),
            releases_immediate: get(Counter::ReleasesImmediate as usize),
            releases_deferred: get(Counter::ReleasesDeferred as usize),
            releases_with_graph: get(Counter::ReleasesWithGraph as usize),
            releases_leaked: get(Counter::ReleasesLeaked as usize),
        }
    }

    fn fields(&self) -> [u64; N] {
        [
            self.exports,
            self.imports,
            self.host_syncs,
            self.events_created,
            self.events_recorded,
            self.waits_enqueued,
            self.waits_elided,
            self.copies,
            self.bytes_copied,
            self.releases_immediate,
            self.releases_deferred,
            self.releases_with_graph,
            self.releases_leaked,
        ]
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Stats) -> Stats {
        let (now, then) = (self.fields(), earlier.fields());
        Stats::from_fn(|i| now[i].saturating_sub(then[i]))
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exports {}, imports {}, waits enqueued {}, waits elided {}, events recorded {}, \
             events created {}, host syncs {}, copies {} ({} bytes), releases immediate {}, deferred {}, with a graph {}, leaked {}",
            self.exports,
            self.imports,
            self.waits_enqueued,
            self.waits_elided,
            self.events_recorded,
            self.events_created,
            self.host_syncs,
            self.copies,
            self.bytes_copied,
            self.releases_immediate,
            self.releases_deferred,
            self.releases_with_graph,
            self.releases_leaked
        )
    }
}

/// The process-wide counters.
pub fn stats() -> Stats {
    let totals = totals();
    Stats::from_fn(|i| totals[i])
}

/// The counters of the calling thread only.
pub fn thread_stats() -> Stats {
    Stats::from_fn(of_this_thread)
}

/// Runs `f` and returns what it did on this thread.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Stats) {
    let before = thread_stats();
    let r = f();
    (r, thread_stats().since(&before))
}

// What an adapter counts itself, where the runtime cannot see the event: an import that
// does not go through `Handoff::import`, a wait a framework's own call enqueues, a copy.

/// Counts one import an adapter made without [`Handoff::import`](crate::Handoff::import)
/// (a framework's own call took the memory in). Adapters call it; users read
/// [`Stats::imports`].
///
/// ```
/// use handoff_runtime::stats;
/// let (_, d) = stats::measure(stats::count_import);
/// assert_eq!(d.imports, 1);
/// ```
pub fn count_import() {
    count(Counter::Imports, 1);
}

/// Counts one wait on a consumer stream that a framework's own call enqueued (for an
/// adapter whose framework orders the hand-off itself).
pub fn count_wait_enqueued() {
    count(Counter::WaitsEnqueued, 1);
}

/// Counts one wait an adapter found unnecessary (producer and consumer on one stream).
pub fn count_wait_elided() {
    count(Counter::WaitsElided, 1);
}

/// Counts one copy of `bytes` bytes an adapter made (where the protocol allows one: it
/// was asked for, or the consumer's own convention copies).
///
/// ```
/// use handoff_runtime::stats;
/// let (_, d) = stats::measure(|| stats::count_copy(1024));
/// assert_eq!((d.copies, d.bytes_copied), (1, 1024));
/// ```
pub fn count_copy(bytes: u64) {
    count(Counter::Copies, 1);
    count(Counter::BytesCopied, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_locally_and_globally() {
        let g0 = stats();
        let ((), d) = measure(|| {
            count(Counter::Copies, 2);
            host_sync(|| ());
        });
        assert_eq!(d.copies, 2);
        assert_eq!(d.host_syncs, 1);
        assert_eq!(d.exports, 0);
        assert!(stats().since(&g0).copies >= 2);
        let other = std::thread::spawn(|| measure(|| ()).1).join().unwrap();
        assert_eq!(other, Stats::default());
    }

    #[test]
    fn an_ended_threads_counts_stay_in_the_process_totals() {
        let before = stats().bytes_copied;
        let block = std::thread::spawn(|| {
            count(Counter::BytesCopied, 1 << 40);
            LOCAL.with(|l| Arc::downgrade(&l.0))
        })
        .join()
        .unwrap();
        // Its block is gone with it (the registry let go of it too); its counts moved
        // to `ended`.
        assert!(block.upgrade().is_none(), "the ended thread's block is still registered");
        assert!(stats().bytes_copied - before >= 1 << 40);
    }
}
