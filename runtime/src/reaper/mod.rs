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
use crate::stream::{Event, EventProbe, RawStream, Stream};
use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;
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
/// A stream's backend, raw handle, and for a thread-relative handle (CUDA's
/// per-thread default stream) its thread: two threads' such streams are different
/// streams, and their events must not share one in-order lane.
type StreamKey = (usize, RawStream, Option<ThreadId>);

/// Hashes a [`StreamKey`] (a backend's address, a stream handle, a thread id) with a
/// rotate, xor and multiply per word: each release looks its lane up, and SipHash's
/// defence against chosen keys buys nothing for keys the process makes itself.
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}
type BatchId = u64;

struct Pending {
    event: Event,
    /// When it was queued: later releases have larger numbers, in every lane and
    /// across a lane's removal and re-creation, so that an answer about older
    /// releases never covers newer ones.
    seq: u64,
    keep_alive: KeepAlive,
    /// The thread whose hand-off it was ([`home`]).
    home: Option<home::Home>,
}

/// The releases queued behind work on one stream.
struct Lane {
    /// The stream, for messages.
    stream: Stream,
    /// Oldest first: their events complete in this order.
    queued: VecDeque<Pending>,
    /// Batches of this lane's releases that a sweep, a flush or a drain has taken out
    /// of `queued` and not yet done, with their sizes: a flush that finds `queued`
    /// empty waits for these, since they were queued before it too.
    taken: Vec<(BatchId, usize)>,
}

#[derive(Default)]
struct Queue {
    lanes: HashMap<StreamKey, Lane, std::hash::BuildHasherDefault<KeyHasher>>,
    next_batch: BatchId,
    /// The `seq` of the next release queued.
    next_seq: u64,
    shutdown: bool,
    /// The background thread waits on `wake` (it found nothing queued for
    /// [`LINGER`]): the next release wakes it. Otherwise it polls and finds releases
    /// by itself, and a release makes no system call.
    parked: bool,
    /// Flushes waiting on `done` for batches others took: a finished batch wakes
    /// them, and makes no system call when there are none.
    waiting: usize,
}

impl Queue {
    fn has_queued(&self) -> bool {
        self.lanes.values().any(|l| !l.queued.is_empty())
    }

    /// Registers a batch of `n` releases of `key` taken out of its queue.
    fn open_batch(&mut self, key: StreamKey, n: usize) -> BatchId {
        self.next_batch += 1;
        let id = self.next_batch;
        if let Some(lane) = self.lanes.get_mut(&key) {
            lane.taken.push((id, n));
        }
        id
    }
}

/// A batch of releases taken out of one lane, and what to do with each.
struct Batch {
    key: StreamKey,
    id: BatchId,
    items: Vec<(Pending, Outcome)>,
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
    queue: Mutex<Queue>,
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
            queue: Mutex::new(Queue::default()),
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

fn lock(r: &Reaper) -> MutexGuard<'_, Queue> {
    // Nothing panics while holding the lock (keep-alives are dropped outside it and
    // queries are caught), and the queue is consistent at every unlock anyway.
    r.queue.lock().unwrap_or_else(|p| p.into_inner())
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
    release_for(home::here(), after, keep_alive)
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
        home::give(home, keep_alive);
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
    let release: crate::graph::Kept = Box::new(move || home::give(home, keep_alive));
    match stream.backend().keep_with_graph(stream.raw(), release) {
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
) -> Result<(), (crate::Error, K)> {
    let r = reaper();
    let parked = {
        let mut q = lock(r);
        let event = match stream.record() {
            Ok(event) => event,
            Err(e) => return Err((e, keep_alive)),
        };
        stats::count(Counter::ReleasesDeferred, 1);
        let parked = std::mem::take(&mut q.parked);
        let seq = q.next_seq;
        q.next_seq += 1;
        let lane = q.lanes.entry(stream_key(stream)).or_insert_with(|| Lane {
            stream: stream.clone(),
            queued: VecDeque::new(),
            taken: Vec::new(),
        });
        lane.queued.push_back(Pending { event, seq, keep_alive: KeepAlive::new(keep_alive), home });
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

/// Whether `event` has completed, with a failure or a panic of the backend as text.
fn query(event: &Event) -> Result<bool, String> {
    answer(|| event.query())
}

/// [`query`] through a probe.
fn query_probe(probe: &EventProbe) -> Result<bool, String> {
    answer(|| probe.query())
}

/// A query's answer, with a failure or a panic of the backend as text.
fn answer(query: impl FnOnce() -> crate::Result<bool>) -> Result<bool, String> {
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
            let mut q = lock(r);
            if q.shutdown && !q.has_queued() {
                return;
            }
            if !q.has_queued() && !home::any_waiting() && last_work.elapsed() >= LINGER {
                q.parked = true;
                PARKED.store(true, Ordering::SeqCst);
                while q.parked && !q.has_queued() && !q.shutdown && !home::any_waiting() {
                    q = r.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                q.parked = false;
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

/// How many of a lane's oldest releases one sweep asks about, when its newest is not
/// done yet.
const ASKED_PER_SWEEP: usize = 16;

/// Takes out of the queue every release whose event has completed (and every one whose
/// query failed, to leak it), and does them. Returns how many it took. Never blocks.
///
/// The events are asked with no lock held, so a thread that queues a release (and
/// records its event under the lock) never waits for a query. Each lane's newest
/// release is asked first (events of a stream complete in order: if it is done, all
/// are), then, if it is not, its oldest ones in order until one is not done. An
/// answer covers the releases up to the one asked (by `seq`), and only those still
/// queued are taken: a flush may have taken them meanwhile, and given their events
/// back for reuse, but it takes a lane's releases oldest first, so the ones left
/// are all newer than any it took, and an answer about a reused event covers none.
fn sweep(r: &Reaper, deliver: Deliver, spares: &mut Spares) -> usize {
    let asks: Vec<(StreamKey, Vec<Asked>)> = {
        let q = lock(r);
        q.lanes
            .iter()
            .filter_map(|(key, lane)| {
                let newest = lane.queued.back()?;
                let oldest = lane.queued.iter().take(ASKED_PER_SWEEP.min(lane.queued.len() - 1));
                let asked = std::iter::once(newest).chain(oldest).map(|p| (p.seq, p.event.probe())).collect();
                Some((*key, asked))
            })
            .collect()
    };
    if asks.is_empty() {
        return 0;
    }
    // With no lock held: which releases of each lane are done (or failed).
    let answers: Vec<(StreamKey, Answer)> = asks
        .into_iter()
        .filter_map(|(key, asked)| {
            let answer = ask(&asked);
            (!matches!(&answer, Answer::Walked(w) if w.is_empty())).then_some((key, answer))
        })
        .collect();
    // Under the lock, the releases answered are taken out of their lanes with as few
    // moves as can be ([`take_oldest`]): a thread queueing a release meanwhile waits
    // for that alone. Their outcomes are written with no lock held.
    let taken: Vec<(StreamKey, BatchId, VecDeque<Pending>, Answer, String)> = {
        let mut q = lock(r);
        let mut taken = Vec::new();
        for (key, answer) in answers {
            let Some(lane) = q.lanes.get_mut(&key) else { continue };
            let n = answered(&lane.queued, &answer);
            if n == 0 {
                continue;
            }
            let items = take_oldest(&mut lane.queued, n, spares.take());
            // Named in the message of a failed query (rare: formatted only then).
            let failed = matches!(&answer, Answer::Walked(w) if w.iter().any(|(_, e)| e.is_some()));
            let stream = if failed { format!("{:?}", lane.stream) } else { String::new() };
            let id = q.open_batch(key, n);
            taken.push((key, id, items, answer, stream));
        }
        taken
    };
    let batches: Vec<Batch> = taken
        .into_iter()
        .map(|(key, id, mut items, answer, stream)| {
            let outcomes = items
                .drain(..)
                .map(|p| {
                    let outcome = match &answer {
                        Answer::AllUpTo(_) => Outcome::Release,
                        Answer::Walked(walked) => match walked.iter().find(|(seq, _)| *seq == p.seq) {
                            Some((_, Some(e))) => Outcome::Leak(format!(
                                "querying the release event {:?} on {stream} failed ({e})",
                                p.event
                            )),
                            _ => Outcome::Release,
                        },
                    };
                    (p, outcome)
                })
                .collect();
            spares.keep(items);
            Batch { key, id, items: outcomes }
        })
        .collect();
    let n = batches.iter().map(|b| b.items.len()).sum();
    for b in batches {
        perform(r, b, deliver);
    }
    n
}

/// Empty queues kept from one sweep to the next with their room, so that taking
/// releases out of their lanes ([`take_oldest`]) allocates nothing, and frees nothing
/// under the lock, once releases come at a steady rate.
#[derive(Default)]
struct Spares(Vec<VecDeque<Pending>>);

impl Spares {
    /// How many it keeps: one or two lanes are busy at a time, mostly.
    const KEPT: usize = 4;

    /// An empty queue: a kept one, or a new one (which allocates nothing yet).
    fn take(&mut self) -> VecDeque<Pending> {
        self.0.pop().unwrap_or_default()
    }

    /// Keeps `queue` (emptied) for a later sweep, if there is room.
    fn keep(&mut self, queue: VecDeque<Pending>) {
        if queue.is_empty() && self.0.len() < Self::KEPT {
            self.0.push(queue);
        }
    }
}

/// Takes the `n` oldest of `queue` out, in order, with as few moves as can be: when
/// they are most of it (all, or all but the releases queued since a sweep asked),
/// `queue` changes places with `spare` (empty) and the newer ones move back; else
/// they move into `spare`.
fn take_oldest<T>(queue: &mut VecDeque<T>, n: usize, spare: VecDeque<T>) -> VecDeque<T> {
    if 2 * n >= queue.len() {
        let mut taken = std::mem::replace(queue, spare);
        queue.extend(taken.drain(n..));
        taken
    } else {
        let mut taken = spare;
        taken.extend(queue.drain(..n));
        taken
    }
}

/// How many of a lane's oldest releases `answer` says are done or failed: those it
/// covers, in order, up to the first it does not.
fn answered(queued: &VecDeque<Pending>, answer: &Answer) -> usize {
    match answer {
        // `seq` grows from each release queued in a lane to the next.
        Answer::AllUpTo(seq) => queued.partition_point(|p| p.seq <= *seq),
        Answer::Walked(walked) => {
            queued.iter().take_while(|p| walked.iter().any(|(seq, _)| *seq == p.seq)).count()
        }
    }
}

/// A queued release a sweep asks about: its `seq`, and its event.
type Asked = (u64, EventProbe);

/// What a sweep learned of one lane.
enum Answer {
    /// Its releases up to this `seq` are done (the newest asked was).
    AllUpTo(u64),
    /// Its oldest releases, each done (`None`) or failed (why), in order, up to the
    /// first that is not done.
    Walked(Vec<(u64, Option<String>)>),
}

/// Asks a lane's newest release, then (if it is not done) its oldest ones in order
/// until one is not done; a failed query leaks that release only, except the newest's
/// when older ones can still be asked.
fn ask(asked: &[Asked]) -> Answer {
    let Some(((newest, probe), oldest)) = asked.split_first() else { return Answer::Walked(Vec::new()) };
    match query_probe(probe) {
        Ok(true) => return Answer::AllUpTo(*newest),
        Err(e) if oldest.is_empty() => return Answer::Walked(vec![(*newest, Some(e))]),
        _ => {}
    }
    let mut walked = Vec::new();
    for (seq, probe) in oldest {
        match query_probe(probe) {
            Ok(true) => walked.push((*seq, None)),
            Ok(false) => break,
            Err(e) => walked.push((*seq, Some(e))),
        }
    }
    Answer::Walked(walked)
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
        let mut q = lock(r);
        if let Some(lane) = q.lanes.get_mut(&batch.key) {
            lane.taken.retain(|&(id, _)| id != batch.id);
            if lane.queued.is_empty() && lane.taken.is_empty() {
                q.lanes.remove(&batch.key);
            }
        }
        q.waiting
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
    let key = stream_key(stream);
    flush_where(|k| *k == key)
}

fn stream_key(stream: &Stream) -> StreamKey {
    (stream.backend() as *const dyn crate::Backend as *const () as usize, stream.raw(), stream.thread())
}

fn flush_where(select: impl Fn(&StreamKey) -> bool) {
    let Some(r) = live() else { return };
    // Hand-offs let go on other threads wait at their homes: dropped now, they queue
    // their releases, which this flush then does.
    home::take_all_now();
    // Take what is queued for the selected streams, and note the batches others
    // (the background thread, another flush, a drain) took before this call.
    let (mine, others) = {
        let mut q = lock(r);
        let keys: Vec<StreamKey> = q.lanes.keys().filter(|k| select(k)).copied().collect();
        let mut mine = Vec::new();
        let mut others = Vec::new();
        for key in keys {
            let Some(lane) = q.lanes.get_mut(&key) else { continue };
            others.extend(lane.taken.iter().map(|&(id, _)| (key, id)));
            if lane.queued.is_empty() {
                continue;
            }
            let items: Vec<Pending> = lane.queued.drain(..).collect();
            let stream = lane.stream.clone();
            let id = q.open_batch(key, items.len());
            mine.push((stream, Batch { key, id, items: Vec::new() }, items));
        }
        (mine, others)
    };
    // Wait on the device with no lock held.
    for (stream, mut batch, items) in mine {
        batch.items = settle(&stream, items);
        perform(r, batch, Deliver::Here);
    }
    {
        let mut q = lock(r);
        q.waiting += 1;
        while others.iter().any(|(k, id)| q.lanes.get(k).is_some_and(|l| l.taken.iter().any(|t| t.0 == *id)))
        {
            q = r.done.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        q.waiting -= 1;
    }
    // What the background thread gave back to the homes is done here too.
    home::take_all_now();
}

/// Waits for the last of one stream's releases (events of a stream complete in
/// order). When that wait fails, each event is asked instead, and the releases it
/// does not say are done are leaked.
fn settle(stream: &Stream, items: Vec<Pending>) -> Vec<(Pending, Outcome)> {
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
#[cfg(test)]
mod tests;

pub(crate) use home::Home;
pub(crate) use home::give as give_home;
pub(crate) use home::here as home_here;
pub use home::{STALE, take_returns};

use exit::atexit;
use exit::drain_at_exit;
pub use exit::{Drained, drain};
#[cfg(unix)]
use exit::{mark_forked_child, pthread_atfork};
