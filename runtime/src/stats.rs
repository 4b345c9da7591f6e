//! Counters of everything a hand-off does on the device and the host (rule 4).
//!
//! Every place handoff or an adapter could block the host goes through
//! [`host_sync`], so `host_syncs` is the number of times the CPU waited for a device.
//! Counters are process-wide (atomics kept in parts, one per group of threads, so
//! that threads counting at once do not contend for one cache line), mirrored per
//! thread so a test can measure a region on its own thread while other tests run:
//!
//! ```
//! use handoff_runtime::stats;
//! let (_, delta) = stats::measure(|| { /* hand-offs */ });
//! assert_eq!(delta.host_syncs, 0);
//! ```

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
    /// Keep-alives leaked on purpose, never dropped: the device could not say whether
    /// work using their memory was done (a failed event record, query or
    /// synchronize), the exit drain's deadline passed, or the release was asked for in
    /// a forked child. Freeing such memory could hand it to a new owner while a kernel
    /// still uses it; leaking it is the safe failure. See [`crate::reaper`].
    ReleasesLeaked,
}

const N: usize = Counter::ReleasesLeaked as usize + 1;

static GLOBAL: Sharded<N> = Sharded::new();

/// How many shards a [`Sharded`] counter has.
const SHARDS: usize = 16;

/// One thread group's copy of the counters, on cache lines of its own.
#[repr(align(128))]
struct Shard<const K: usize>([AtomicU64; K]);

/// `K` process-wide counters, each kept in [`SHARDS`] parts: a thread adds to the part
/// of its shard (threads take shards in turn), so the hand-off path and the reaper
/// thread never write one cache line; a read sums the parts.
pub(crate) struct Sharded<const K: usize>([Shard<K>; SHARDS]);

impl<const K: usize> Sharded<K> {
    pub(crate) const fn new() -> Self {
        Sharded([const { Shard([const { AtomicU64::new(0) }; K]) }; SHARDS])
    }

    /// Adds `n` to counter `i`.
    #[inline]
    pub(crate) fn add(&self, i: usize, n: u64) {
        self.0[shard()].0[i].fetch_add(n, Ordering::Relaxed);
    }

    /// Counter `i`, summed over the shards.
    pub(crate) fn get(&self, i: usize) -> u64 {
        self.0.iter().map(|s| s.0[i].load(Ordering::Relaxed)).sum()
    }
}

/// The calling thread's shard.
#[inline]
fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    // A thread being torn down counts in shard 0.
    MINE.try_with(|s| *s).unwrap_or(0)
}

thread_local! {
    static LOCAL: [Cell<u64>; N] = const { [const { Cell::new(0) }; N] };
}

/// Adds `n` to a counter, process-wide and on this thread. Only the runtime counts;
/// adapters reach the few counts they need through named functions (`adapter_counts`).
#[inline]
pub(crate) fn count(counter: Counter, n: u64) {
    GLOBAL.add(counter as usize, n);
    // A thread being torn down has no locals any more; the global count is kept.
    let _ = LOCAL.try_with(|l| {
        let c = &l[counter as usize];
        c.set(c.get() + n);
    });
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
             events created {}, host syncs {}, copies {} ({} bytes), releases immediate {}, deferred {}, leaked {}",
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
            self.releases_leaked
        )
    }
}

/// The process-wide counters.
pub fn stats() -> Stats {
    Stats::from_fn(|i| GLOBAL.get(i))
}

/// The counters of the calling thread only.
pub fn thread_stats() -> Stats {
    LOCAL.with(|l| Stats::from_fn(|i| l[i].get()))
}

/// Runs `f` and returns what it did on this thread.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Stats) {
    let before = thread_stats();
    let r = f();
    (r, thread_stats().since(&before))
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
}

/// The counts handoff's adapters make where the runtime cannot see the event (an
/// import that does not go through `Handoff::import`, a wait PJRT enqueues, a copy).
/// Reached through the hidden `handoff_runtime::__private`: not public API.
pub(crate) mod adapter_counts {
    use super::{Counter, count};

    /// One import.
    pub fn counted_import() {
        count(Counter::Imports, 1);
    }

    /// One wait enqueued on a consumer stream by a framework's own call.
    pub fn counted_wait_enqueued() {
        count(Counter::WaitsEnqueued, 1);
    }

    /// One wait found unnecessary.
    pub fn counted_wait_elided() {
        count(Counter::WaitsElided, 1);
    }

    /// One copy of `bytes` bytes.
    pub fn counted_copy(bytes: u64) {
        count(Counter::Copies, 1);
        count(Counter::BytesCopied, bytes);
    }
}
