//! The end of a process, or of the reaper's use: a bounded drain, the at-exit hook,
//! and the `fork` guard.

use super::*;

unsafe extern "C" {
    pub(super) fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
    #[cfg(unix)]
    pub(super) fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> std::ffi::c_int;
}

#[cfg(unix)]
pub(super) extern "C" fn mark_forked_child() {
    FORKED.store(true, Ordering::Relaxed);
}

pub(super) extern "C" fn drain_at_exit() {
    let _ = catch_unwind(|| {
        let Some(r) = live() else { return };
        drain(EXIT_DRAIN_TIMEOUT);
        lock(r).shutdown = true;
        r.wake.notify_all();
    });
}

/// What [`drain`] left undone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Releases still queued at the deadline, now leaked on purpose (never dropped;
    /// counted in `Stats::releases_leaked`).
    pub leaked: usize,
    /// Releases another thread had taken out of the queue and was still waiting on at
    /// the deadline (a [`flush`] of a stream that never completes); left to it.
    pub in_flight: usize,
}

impl Drained {
    /// Whether every release queued before the drain was done.
    pub fn is_complete(&self) -> bool {
        *self == Drained::default()
    }
}

/// Does the queued releases as their events complete, for at most `timeout`, then
/// leaks what is left (counted in `Stats::releases_leaked`, reported on stderr in
/// one line) and returns. Never synchronizes: it polls, and counts one host sync.
/// Process exit runs this with [`EXIT_DRAIN_TIMEOUT`], so exit never hangs on a device
/// that stopped.
///
/// ```
/// use std::time::Duration;
/// let left = handoff_runtime::reaper::drain(Duration::from_millis(100));
/// assert!(left.is_complete());
/// ```
pub fn drain(timeout: Duration) -> Drained {
    let Some(r) = live() else { return Drained::default() };
    stats::host_sync(|| {
        let deadline = Instant::now() + timeout;
        let mut backoff = Duration::from_micros(5);
        let mut spares = Spares::default();
        loop {
            sweep(r, Deliver::Here, &mut spares);
            home::take_all_now();
            let idle = lock(r).queue.is_idle();
            let now = Instant::now();
            if idle {
                return Drained::default();
            }
            if now >= deadline {
                break;
            }
            std::thread::sleep(backoff.min(deadline - now));
            backoff = (backoff * 2).min(Duration::from_millis(1));
        }
        // The deadline passed: leak what is still queued.
        let flushed = lock(r).queue.take_queued(|_| true);
        let in_flight: usize = flushed.earlier.iter().map(|b| b.len).sum();
        let streams: Vec<String> = flushed.batches.iter().map(|b| format!("{:?}", b.stream)).collect();
        let mut leaked = 0;
        for lane in flushed.batches {
            leaked += lane.items.len();
            let items = lane.items.into_iter().map(|p| (p, Outcome::LeakQuietly)).collect();
            perform(r, Batch { id: lane.batch, items }, Deliver::Here);
        }
        if leaked > 0 {
            eprintln!(
                "handoff: {leaked} release(s) behind {} did not complete within {timeout:?}; their memory is \
                 leaked on purpose (a kernel may still use it) so that this wait ends",
                streams.join(", ")
            );
        }
        if in_flight > 0 {
            eprintln!(
                "handoff: {in_flight} release(s) are still waited on by another thread (a flush of a stream \
                 that did not complete within {timeout:?}); left to it"
            );
        }
        Drained { leaked, in_flight }
    })
}
