//! Stream-ordered release (rule 3): a keep-alive is dropped only once the work the
//! consumer enqueued before letting go of it has completed.
//!
//! The dropping thread records an event on the consumer stream and queues the
//! keep-alive; a background thread polls the oldest event of each stream (events of
//! one stream complete in order, so thousands of pending releases cost one query per
//! stream per sweep) and drops what is done. Nobody waits on the device but
//! [`flush`], which tests and process exit use, and which counts its host syncs.

use crate::stats::{self, Counter};
use crate::stream::{Event, Stream};
use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

type KeepAlive = Box<dyn Send>;
type StreamKey = (usize, u64);

struct Pending {
    event: Event,
    keep_alive: KeepAlive,
}

#[derive(Default)]
struct Queue {
    by_stream: HashMap<StreamKey, VecDeque<Pending>>,
    shutdown: bool,
}

struct Reaper {
    queue: Mutex<Queue>,
    /// Held by whoever is taking releases out of the queue and performing them (the
    /// reaper thread's sweep, a flush), from taking to done: so that a flush that
    /// finds a stream's queue empty knows the releases taken before it have happened,
    /// not merely left the queue. Lock order: `busy`, then `queue`.
    busy: Mutex<()>,
    wake: Condvar,
    pending: AtomicUsize,
    released: AtomicU64,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

fn reaper() -> &'static Reaper {
    REAPER.get_or_init(|| {
        std::thread::Builder::new()
            .name("handoff-reaper".into())
            .spawn(run)
            .expect("handoff: cannot start the reaper thread");
        // SAFETY: `drain_at_exit` is a plain `extern "C"` function that catches
        // every panic; registering it has no other precondition.
        unsafe { atexit(drain_at_exit) };
        Reaper {
            queue: Mutex::new(Queue::default()),
            busy: Mutex::new(()),
            wake: Condvar::new(),
            pending: AtomicUsize::new(0),
            released: AtomicU64::new(0),
        }
    })
}

unsafe extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn drain_at_exit() {
    let _ = catch_unwind(|| {
        flush();
        if let Some(r) = REAPER.get() {
            if let Ok(mut q) = r.queue.lock() {
                q.shutdown = true;
            }
            r.wake.notify_all();
        }
    });
}

/// Releases `keep_alive` once all work enqueued on `after` so far has completed,
/// without blocking: at once when `after` is `None` or the host stream, otherwise
/// behind an event recorded on `after` now.
///
/// Adapters call this when their own memory must outlive a consumer's queued work.
pub fn release_after<K: Send + 'static>(after: Option<&Stream>, keep_alive: K) {
    let after = after.filter(|s| !s.is_host());
    let Some(stream) = after else {
        stats::count(Counter::ReleasesImmediate, 1);
        // Dropped in place: the immediate path allocates nothing.
        if catch_unwind(AssertUnwindSafe(move || drop(keep_alive))).is_err() {
            eprintln!("handoff: a keep-alive panicked while being released");
        }
        return;
    };
    match stream.record() {
        Ok(event) => {
            stats::count(Counter::ReleasesDeferred, 1);
            defer(stream, event, Box::new(keep_alive));
        }
        Err(e) => {
            // Freeing now could hand memory to a new owner while a kernel still reads
            // it; keeping it is the safe failure.
            eprintln!("handoff: cannot record a release event on {stream:?} ({e}); the memory is kept");
            std::mem::forget(keep_alive);
        }
    }
}

fn defer(stream: &Stream, event: Event, keep_alive: KeepAlive) {
    let r = reaper();
    let key = stream_key(stream);
    match r.queue.lock() {
        Ok(mut q) => {
            q.by_stream.entry(key).or_default().push_back(Pending { event, keep_alive });
            r.pending.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            std::mem::forget(keep_alive);
            return;
        }
    }
    r.wake.notify_one();
}

fn drop_quietly(keep_alive: KeepAlive) {
    if catch_unwind(AssertUnwindSafe(move || drop(keep_alive))).is_err() {
        eprintln!("handoff: a keep-alive panicked while being released");
    }
}

fn run() {
    let r = reaper();
    let mut backoff = Duration::from_micros(5);
    loop {
        {
            let Ok(mut q) = r.queue.lock() else { return };
            while q.by_stream.is_empty() && !q.shutdown {
                q = match r.wake.wait(q) {
                    Ok(q) => q,
                    Err(_) => return,
                };
            }
            if q.shutdown && q.by_stream.is_empty() {
                return;
            }
        }
        let mut done = Vec::new();
        // Held until the releases taken are done (see `Reaper::busy`).
        let busy = r.busy.lock().unwrap_or_else(|p| p.into_inner());
        {
            let Ok(mut q) = r.queue.lock() else { return };
            q.by_stream.retain(|_, fifo| {
                // A failed query means the device is gone; nothing runs there any more.
                while fifo.front().is_some_and(|p| p.event.query().unwrap_or(true)) {
                    done.extend(fifo.pop_front());
                }
                !fifo.is_empty()
            });
        }
        if done.is_empty() {
            drop(busy);
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_micros(500));
            continue;
        }
        backoff = Duration::from_micros(5);
        finish(r, done);
        drop(busy);
    }
}

fn finish(r: &Reaper, done: Vec<Pending>) {
    let n = done.len();
    for p in done {
        drop(p.event);
        drop_quietly(p.keep_alive);
    }
    r.pending.fetch_sub(n, Ordering::Relaxed);
    r.released.fetch_add(n as u64, Ordering::Relaxed);
}

/// Blocks until every release queued before the call has happened, waiting on the
/// device (one counted host sync per stream with pending releases). For tests and
/// shutdown; never called on a hand-off path.
pub fn flush() {
    flush_where(|_| true)
}

/// Like [`flush`], for the releases queued behind work on `stream` only.
pub fn flush_stream(stream: &Stream) {
    let key = stream_key(stream);
    flush_where(|k| *k == key)
}

fn stream_key(stream: &Stream) -> StreamKey {
    (std::sync::Arc::as_ptr(stream.backend()) as *const () as usize, stream.raw())
}

fn flush_where(select: impl Fn(&StreamKey) -> bool) {
    let Some(r) = REAPER.get() else { return };
    // Waits for a sweep of the reaper thread that may hold releases of `select`ed
    // streams it has taken out of the queue but not yet performed.
    let _busy = r.busy.lock().unwrap_or_else(|p| p.into_inner());
    let taken: Vec<VecDeque<Pending>> = match r.queue.lock() {
        Ok(mut q) => {
            let keys: Vec<StreamKey> = q.by_stream.keys().filter(|k| select(k)).copied().collect();
            keys.iter().filter_map(|k| q.by_stream.remove(k)).collect()
        }
        Err(_) => return,
    };
    for fifo in taken {
        if let Some(Err(e)) = fifo.back().map(|last| last.event.synchronize()) {
            eprintln!("handoff: waiting for a release event failed ({e}); releasing anyway");
        }
        finish(r, fifo.into_iter().collect());
    }
}

/// How many releases are queued and not yet done.
pub fn pending() -> usize {
    REAPER.get().map_or(0, |r| r.pending.load(Ordering::Relaxed))
}

/// How many deferred releases have been done since the process started.
pub fn released() -> u64 {
    REAPER.get().map_or(0, |r| r.released.load(Ordering::Relaxed))
}
