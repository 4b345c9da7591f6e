//! Stream-ordered release (rule 3): a keep-alive is dropped only once the work the
//! consumer enqueued before letting go of it has completed.
//!
//! The dropping thread records an event on the consumer stream and queues the
//! keep-alive; a background thread asks, at most once per [`MIN_POLL`], each stream's
//! newest event (events of one stream complete in order, so thousands of pending
//! releases cost one query per stream per sweep), and gives what is done back to the
//! thread that made the hand-off, which drops it at its next release (see
//! [`take_returns`]; a keep-alive that waits there longer than [`STALE`] is dropped by
//! the background thread). It asks with no lock held, and rarely: its queries run in
//! the CUDA driver beside the calling threads' own CUDA and PJRT calls, and slow them.
//! A hand-off dropped on another thread than the one that made it (PJRT lets go of a
//! view on its own thread) goes back the same way, whole: its DLPack tensor, its
//! context and its keep-alive are all freed on the thread that allocated them, and
//! its release (recorded or immediate) starts there.
//!
//! Nobody waits on the device but [`flush`], [`flush_stream`] and [`drain`], which
//! tests and process exit use, and which count their host syncs.
//!
//! # Faults: never free on error
//!
//! Memory that may still be in use is never freed. When the device cannot tell
//! whether the work before a release is done (recording the release event fails,
//! querying it fails, a flush's synchronize on it fails and a query does not say
//! "done" either), the keep-alive is leaked on purpose: never dropped, counted in
//! [`stats()`](crate::stats())`.releases_leaked` (`Stats::releases_leaked`), and
//! reported on stderr the first time (later ones are only counted). A failed query
//! of a stream's newest release, while older ones can still be asked, is not the last
//! word: that release stays queued, and is released once the device says it is done
//! after all (its event or a later release's answers "done", or a flush's
//! synchronize returns), since events of a stream complete in order.
//!
//! No lock is held while waiting on the device: a flush takes the releases it waits
//! for out of the queue first and waits without any lock; the background thread
//! queries with no lock held, and a release only records its event under it, which
//! does not block ([`crate::Backend::query`], [`crate::Backend::record`]). So a
//! stream whose work never completes holds up only the flushes that ask for that stream
//! ([`flush_stream`] of it, or [`flush`]); the background thread and flushes of other
//! streams go on.
//!
//! The queue itself (its lanes of releases per stream, the batches taken out of them,
//! what a sweep asks and takes) is `queue`, with no lock, no thread and no device call;
//! this module takes the lock around each of its calls and asks the device between
//! them, with none held.
//!
//! # Process exit
//!
//! An `atexit` hook (registered when the first release is deferred) does the releases
//! still queued as their events complete, for at most [`EXIT_DRAIN_TIMEOUT`]; what is
//! left then is leaked, counted, and reported on stderr in one line, so process exit
//! never hangs on a device that stopped. [`drain`] is the same with the caller's
//! deadline. The drain polls (non-blocking queries); it never synchronizes.
//!
//! # `fork`
//!
//! A child made by `fork` has no reaper thread (threads do not survive `fork`), and
//! the parent's queue refers to the parent's device memory, which CUDA does not let a
//! child use. On Unix, a `pthread_atfork` hook (registered with the reaper) marks the
//! child, and there the reaper releases nothing: the releases the parent had queued
//! are never done in the child (neither by a flush nor at exit: their keep-alives are
//! not dropped there), flushes and drains return at once, and new deferred releases
//! are leaked and counted (`Stats::releases_leaked`). Immediate releases (host
//! memory, no stream) are unaffected. A child that needs the device must `exec` first,
//! as CUDA requires anyway. A process whose first deferred release comes after the
//! `fork` (the parent never deferred one) starts its own reaper as usual.

use crate::stats::{self, Counter};
use crate::stream::{Event, EventProbe, Stream};
use queue::{LaneAnswer, Pending, Queue, Spares, StreamKey, Taken};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long the drain at process exit waits for queued releases before it leaks what
/// is left (see the [module docs](self)).
pub const EXIT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the background thread goes on polling after the queue emptied before it
/// waits to be woken: releases that come while it polls wake nobody (no system call
/// on the releasing thread), so a program that releases steadily never pays for a
/// wake-up, and an idle one costs no wake-ups once this has passed.
const LINGER: Duration = Duration::from_millis(200);

/// The shortest time between two sweeps of the background thread, so a release
/// happens up to this long after the work before it completed (up to `MAX_POLL`,
/// 500 µs, once releases pause). Sweeping more often slows the threads that make
/// hand-offs, whose calls run in the driver beside the sweep's queries (kept: the
/// `releasing both` and `execute alone` rows of `examples/benches/pipeline_gpu.rs`;
/// figures in `docs/PERFORMANCE.md`). The environment variable
/// `HANDOFF_REAPER_POLL_US` (microseconds, read once) sets another.
pub const MIN_POLL: Duration = Duration::from_micros(200);

/// The longest the background thread sleeps between two sweeps: how much later than
/// its event a release may happen while the thread polls.
const MAX_POLL: Duration = Duration::from_micros(500);

/// A queued or posted keep-alive, its type erased (in place when small).
type KeepAlive = erased::Erased;

/// What the reaper's lock guards: the queue, and how the threads that use it wait.
#[derive(Default)]
struct State {
    queue: Queue<Event>,
    shutdown: bool,
    /// The background thread waits on `wake` (it found nothing queued for
    /// [`LINGER`]): the next release wakes it. Otherwise it polls and finds releases
    /// by itself, and a release makes no system call.
    parked: bool,
    /// Flushes waiting on `done` for batches others took: a finished batch wakes
    /// them, and makes no system call when there are none.
    waiting: usize,
}

/// A batch of releases taken out of one lane, and what to do with each.
struct Batch {
    id: queue::BatchId,
    items: Vec<(Pending<Event>, Outcome)>,
}

enum Outcome {
    /// The event completed: drop the keep-alive.
    Release,
    /// The device could not tell: leak it, and report why if it is the first leak.
    Leak(String),
    /// Leak it; the caller reports (the exit drain's one line).
    LeakQuietly,
}

struct Reaper {
    state: Mutex<State>,
    /// Wakes the background thread: a release was queued, or shutdown.
    wake: Condvar,
    /// Wakes flushes: a batch of taken releases is done.
    done: Condvar,
    pending: AtomicUsize,
    released: AtomicU64,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

/// Set in a child made by `fork` after the reaper started (see the module docs).
static FORKED: AtomicBool = AtomicBool::new(false);

fn reaper() -> &'static Reaper {
    REAPER.get_or_init(|| {
        std::thread::Builder::new()
            .name("handoff-reaper".into())
            .spawn(run)
            .expect("handoff: cannot start the reaper thread");
        // The two hooks are C calls, which Miri (the unsafe code's checker) cannot
        // make: under it there is no exit drain and no fork guard.
        #[cfg(not(miri))]
        // SAFETY: `drain_at_exit` is a plain `extern "C"` function that catches
        // every panic; registering it has no other precondition.
        unsafe {
            atexit(drain_at_exit)
        };
        #[cfg(all(unix, not(miri)))]
        // SAFETY: the child handler only stores to an atomic, which is
        // async-signal-safe as a handler run in a fork child must be; the other two
        // handlers are null, which `pthread_atfork` allows.
        unsafe {
            pthread_atfork(None, None, Some(mark_forked_child))
        };
        Reaper {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            done: Condvar::new(),
            pending: AtomicUsize::new(0),
            released: AtomicU64::new(0),
        }
    })
}

/// The reaper, when it was started in this process: not before a `fork`.
fn live() -> Option<&'static Reaper> {
    if FORKED.load(Ordering::Relaxed) { None } else { REAPER.get() }
}

fn lock(r: &Reaper) -> MutexGuard<'_, State> {
    // Nothing panics while holding the lock (keep-alives are dropped outside it and
    // queries are caught), and the queue is consistent at every unlock anyway.
    r.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Releases `keep_alive` once all work enqueued on `after` so far has completed,
/// without blocking: at once when `after` is `None` or the host stream, otherwise
/// behind an event recorded on `after` now.
///
/// Adapters call this when their own memory must outlive a consumer's queued work.
/// The calling thread is its home: once the work is done, the background thread
/// gives it back there, and this thread drops it at its next release (or the
/// background thread does, once it waited [`STALE`]). Every call first drops what was
/// given back to this thread ([`take_returns`]).
/// When the event cannot be recorded (or in a child made by `fork`), `keep_alive` is
/// leaked on purpose and counted (`Stats::releases_leaked`); see the
/// [module docs](self).
///
/// ```
/// use handoff_runtime::{reaper, Stream};
/// let memory = vec![0u8; 16];
/// reaper::release_after(Some(&Stream::host()), memory); // host: dropped at once
/// ```
pub fn release_after<K: Send + 'static>(after: Option<&Stream>, keep_alive: K) {
    release_for(home_here(), after, keep_alive)
}

/// [`release_after`] for a keep-alive whose hand-off `home`'s thread made: where it is
/// dropped on another thread than that one, it is given back there ([`home`]).
pub(crate) fn release_for<K: Send + 'static>(
    home: Option<home::Home>,
    after: Option<&Stream>,
    keep_alive: K,
) {
    // What other threads let go of this thread's earlier hand-offs is dropped here,
    // among its own releases.
    take_returns();
    let Some(stream) = after.filter(|s| !s.is_host()) else {
        stats::count(Counter::ReleasesImmediate, 1);
        // At home, dropped in place: the immediate path allocates nothing there.
        give_home(home, keep_alive);
        return;
    };
    if FORKED.load(Ordering::Relaxed) {
        leak(keep_alive);
        report_leak(|| {
            format!(
                "a release behind {stream:?} was asked for in a child process made by fork, which has no reaper"
            )
        });
        return;
    }
    if let Ok(true) = stream.is_capturing() {
        keep_with_graph(stream, home, keep_alive);
        return;
    }
    if let Err((e, keep_alive)) = defer(stream, keep_alive, home) {
        leak(keep_alive);
        report_leak(|| format!("recording a release event on {stream:?} failed ({e})"));
    }
}

/// Keeps `keep_alive` with the graph `stream` is capturing, to be given back to its
/// home once the graph is destroyed ([`crate::graph`]); leaks it if the backend cannot.
fn keep_with_graph<K: Send + 'static>(stream: &Stream, home: Option<home::Home>, keep_alive: K) {
    match stream.keep_with_graph(Box::new(move || give_home(home, keep_alive))) {
        Ok(()) => stats::count(Counter::ReleasesWithGraph, 1),
        Err((e, release)) => {
            leak(release);
            report_leak(|| format!("keeping a release with the graph {stream:?} captures failed ({e})"));
        }
    }
}

/// Records the release event on `stream` and queues `keep_alive` behind it, both under
/// the queue's lock: a lane's events are then queued in the order they were recorded,
/// which [`settle`] relies on when it waits for the last one only (two threads that
/// recorded, then locked, could queue theirs out of order, and a flush would drop the
/// newer keep-alive once the older event completed). Recording never blocks.
fn defer<K: Send + 'static>(
    stream: &Stream,
    keep_alive: K,
    home: Option<home::Home>,
) -> Result<(), (crate::error::Error, K)> {
    let r = reaper();
    let parked = {
        let mut s = lock(r);
        let event = match stream.record() {
            Ok(event) => event,
            Err(e) => return Err((e, keep_alive)),
        };
        stats::count(Counter::ReleasesDeferred, 1);
        let parked = std::mem::take(&mut s.parked);
        s.queue.push(StreamKey::of(stream), stream, event, KeepAlive::new(keep_alive), home);
        r.pending.fetch_add(1, Ordering::Relaxed);
        parked
    };
    // The background thread parks under the lock, so it either saw this release
    // before parking or said it parked; otherwise it is polling and will find it.
    if parked {
        r.wake.notify_one();
    }
    Ok(())
}

/// Leaks a keep-alive on purpose: its memory may be in use, so it is never dropped.
fn leak<K>(keep_alive: K) {
    std::mem::forget(keep_alive);
    stats::count(Counter::ReleasesLeaked, 1);
}

/// Says on stderr why memory is leaked, the first time only (the counter has them all).
fn report_leak(why: impl FnOnce() -> String) {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    if !REPORTED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "handoff: {}; the memory is leaked on purpose, as a kernel may still use it \
             (further leaks are only counted: stats().releases_leaked)",
            why()
        );
    }
}

/// Drops a keep-alive where it is (boxed or not), reporting a panic instead of
/// unwinding.
fn drop_quietly<K>(keep_alive: K) {
    if catch_unwind(AssertUnwindSafe(move || drop(keep_alive))).is_err() {
        eprintln!("handoff: a keep-alive panicked while being released");
    }
}

/// Whether `event` has completed, with a failure or a panic of the backend as text. The
/// query must not invalidate a graph another thread captures: this thread's capture
/// mode is relaxed first ([`crate::Backend::relax_capture_mode`]).
fn query(event: &Event) -> Result<bool, String> {
    answer(|| {
        event.relax_capture_mode();
        event.query()
    })
}

/// [`query`] through a probe.
fn query_probe(probe: &EventProbe) -> Result<bool, String> {
    answer(|| {
        probe.relax_capture_mode();
        probe.query()
    })
}

/// A query's answer, with a failure or a panic of the backend as text.
fn answer(query: impl FnOnce() -> crate::error::Result<bool>) -> Result<bool, String> {
    match catch_unwind(AssertUnwindSafe(query)) {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the backend panicked".into()),
    }
}

/// Mirrors `Queue::parked` for [`keep_polling`], which must not take the lock to read it.
static PARKED: AtomicBool = AtomicBool::new(false);

/// Makes sure the background thread polls (a home holds something): wakes it if it
/// parked. It sets [`PARKED`] before it checks the homes' flags one last time, and
/// the caller flagged its home before this reads [`PARKED`] (both sequentially
/// consistent), so one of the two sees the other.
fn keep_polling() {
    let r = reaper();
    if PARKED.load(Ordering::SeqCst) {
        let _q = lock(r);
        r.wake.notify_one();
    }
}

/// The background thread's sweeps, at most one per this interval (default
/// [`MIN_POLL`], or `HANDOFF_REAPER_POLL_US` microseconds, read once).
fn min_poll() -> Duration {
    static MIN: OnceLock<Duration> = OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("HANDOFF_REAPER_POLL_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .map_or(MIN_POLL, Duration::from_micros)
    })
}

fn run() {
    let r = reaper();
    let mut spares = Spares::default();
    let mut backoff = min_poll();
    let mut last_work = Instant::now();
    loop {
        {
            let mut s = lock(r);
            if s.shutdown && !s.queue.has_queued() {
                return;
            }
            if !s.queue.has_queued() && !home::any_waiting() && last_work.elapsed() >= LINGER {
                s.parked = true;
                PARKED.store(true, Ordering::SeqCst);
                while s.parked && !s.queue.has_queued() && !s.shutdown && !home::any_waiting() {
                    s = r.wake.wait(s).unwrap_or_else(|p| p.into_inner());
                }
                s.parked = false;
                PARKED.store(false, Ordering::SeqCst);
                last_work = Instant::now();
                continue;
            }
        }
        // Deferred releases go to their homes; what waited there too long is dropped here.
        if sweep(r, Deliver::Home, &mut spares) + home::take_all(home::STALE) == 0 {
            backoff = (backoff * 2).min(MAX_POLL.max(min_poll()));
        } else {
            last_work = Instant::now();
            backoff = min_poll();
        }
        // Even after a sweep that found work: sweeps (their queries in the driver, their
        // wake-ups) slow the threads that make hand-offs, so they stay `MIN_POLL` apart.
        std::thread::sleep(backoff);
    }
}

/// Takes out of the queue every release whose event has completed (and every one whose
/// query failed, to leak it), and does them. Returns how many it took. Never blocks.
///
/// Each lane's newest release is asked first (events of a stream complete in order: if
/// it is done, all are), then, if it is not, its oldest ones in order until one is not
/// done ([`queue::LaneAsk::ask`]); an answer covers only releases still queued
/// ([`Queue::take_answered`]).
fn sweep(r: &Reaper, deliver: Deliver, spares: &mut Spares<Event>) -> usize {
    // The lock is taken three times around the queries, which run with none held, so
    // that a thread queueing a release (it records its event under the lock) never
    // waits for one: to read what to ask, to take what was answered, and in `perform`
    // to finish each batch once done.
    let asks = lock(r).queue.asks(Event::probe);
    if asks.is_empty() {
        return 0;
    }
    let answers: Vec<LaneAnswer> =
        asks.into_iter().map(|a| a.ask(query_probe)).filter(|a| !a.answer.is_empty()).collect();
    // Taken with as few moves as can be (into spare queues): a thread queueing a
    // release meanwhile waits for that alone. Their outcomes are written with no lock.
    let taken: Vec<Taken<Event>> = {
        let mut s = lock(r);
        answers.into_iter().filter_map(|a| s.queue.take_answered(a, || spares.take())).collect()
    };
    let batches: Vec<Batch> = taken
        .into_iter()
        .map(|mut t| {
            let items = t
                .items
                .drain(..)
                .map(|p| {
                    let outcome = match t.answer.failure(p.seq) {
                        Some(e) => Outcome::Leak(format!(
                            "querying the release event {:?} on {} failed ({e})",
                            p.event, t.stream
                        )),
                        None => Outcome::Release,
                    };
                    (p, outcome)
                })
                .collect();
            spares.keep(t.items);
            Batch { id: t.batch, items }
        })
        .collect();
    let n = batches.iter().map(|b| b.items.len()).sum();
    for b in batches {
        perform(r, b, deliver);
    }
    n
}

/// Where a done release's keep-alive is dropped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Deliver {
    /// At its home ([`home`]): the background thread's releases.
    Home,
    /// On the calling thread, now: a flush's and a drain's, which return only once
    /// their releases happened.
    Here,
}

/// Does a batch taken out of the queue (with no lock held), then marks it done.
fn perform(r: &Reaper, batch: Batch, deliver: Deliver) {
    let n = batch.items.len();
    let mut released = 0;
    for (p, outcome) in batch.items {
        drop(p.event);
        match outcome {
            Outcome::Release => {
                match deliver {
                    Deliver::Home => home::give_erased(p.home, p.keep_alive),
                    Deliver::Here => drop_quietly(p.keep_alive),
                }
                released += 1;
            }
            Outcome::Leak(why) => {
                leak(p.keep_alive);
                report_leak(|| why);
            }
            Outcome::LeakQuietly => leak(p.keep_alive),
        }
    }
    r.pending.fetch_sub(n, Ordering::Relaxed);
    r.released.fetch_add(released, Ordering::Relaxed);
    let waiting = {
        let mut s = lock(r);
        s.queue.finish(batch.id);
        s.waiting
    };
    // A flush counts itself under the lock before it waits, so it cannot miss this.
    if waiting > 0 {
        r.done.notify_all();
    }
}

/// Blocks until every release queued before the call has happened, waiting on the
/// device (one counted host sync per stream with pending releases), and drops what
/// waits to be given back to any thread ([`take_returns`]). For tests and shutdown;
/// never called on a hand-off path.
///
/// A stream whose work never completes makes this wait forever (use [`drain`] for a
/// bounded wait, or [`flush_stream`] for the streams you expect to finish); it does not
/// hold up releases on other streams meanwhile. Releases whose wait fails are leaked,
/// never freed (see the [module docs](self)).
pub fn flush() {
    flush_where(|_| true)
}

/// Like [`flush`], for the releases queued behind work on `stream` only.
///
/// ```
/// use handoff_runtime::{mock::Mock, reaper};
/// let mock = Mock::new();
/// let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
/// reaper::release_after(Some(&b), vec![1u8; 4]);
/// mock.run_until_idle();
/// reaper::flush_stream(&b);
/// reaper::flush_stream(&a); // nothing queued there: returns at once
/// ```
pub fn flush_stream(stream: &Stream) {
    let key = StreamKey::of(stream);
    flush_where(|k| *k == key)
}

fn flush_where(select: impl Fn(&StreamKey) -> bool) {
    let Some(r) = live() else { return };
    // Hand-offs let go on other threads wait at their homes: dropped now, they queue
    // their releases, which this flush then does.
    home::take_all_now();
    // Take what is queued for the selected streams, and note the batches others
    // (the background thread, another flush, a drain) took before this call.
    let flushed = lock(r).queue.take_queued(select);
    // Wait on the device with no lock held.
    for lane in flushed.batches {
        let items = settle(&lane.stream, lane.items);
        perform(r, Batch { id: lane.batch, items }, Deliver::Here);
    }
    {
        let mut s = lock(r);
        s.waiting += 1;
        while flushed.earlier.iter().any(|b| s.queue.is_open(b.id)) {
            s = r.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.waiting -= 1;
    }
    // What the background thread gave back to the homes is done here too.
    home::take_all_now();
}

/// Waits for the last of one stream's releases (events of a stream complete in
/// order). When that wait fails, each event is asked instead, and the releases it
/// does not say are done are leaked.
fn settle(stream: &Stream, items: Vec<Pending<Event>>) -> Vec<(Pending<Event>, Outcome)> {
    let waited = match items.last() {
        Some(last) => match catch_unwind(AssertUnwindSafe(|| last.event.synchronize())) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the backend panicked".into()),
        },
        None => Ok(()),
    };
    match waited {
        Ok(()) => items.into_iter().map(|p| (p, Outcome::Release)).collect(),
        Err(e) => items
            .into_iter()
            .map(|p| {
                let outcome = match query(&p.event) {
                    Ok(true) => Outcome::Release,
                    Ok(false) => Outcome::Leak(format!(
                        "waiting for the release event {:?} on {stream:?} failed ({e}), and it has not completed",
                        p.event
                    )),
                    Err(q) => Outcome::Leak(format!(
                        "waiting for the release event {:?} on {stream:?} failed ({e}), and so did querying it ({q})",
                        p.event
                    )),
                };
                (p, outcome)
            })
            .collect(),
    }
}

/// How many releases are queued and not yet done (nor leaked).
pub fn pending() -> usize {
    REAPER.get().map_or(0, |r| r.pending.load(Ordering::Relaxed))
}

/// How many deferred releases have been done since the process started.
pub fn released() -> u64 {
    REAPER.get().map_or(0, |r| r.released.load(Ordering::Relaxed))
}

mod erased;
mod exit;
mod home;
mod queue;
#[cfg(test)]
mod tests;

pub(crate) use home::Home;
pub use home::{STALE, take_returns};
pub(crate) use home::{give_home, home_here};

use exit::atexit;
use exit::drain_at_exit;
pub use exit::{Drained, drain};
#[cfg(unix)]
use exit::{mark_forked_child, pthread_atfork};
