//! Hand-offs and keep-alives given back on the thread that made the hand-off.
//!
//! A hand-off is often let go on another thread than the one that made it: PJRT
//! lets go of a view on its own worker thread once the execution that read it is
//! done, and the reaper does deferred releases on its thread. Freeing there costs
//! the making thread too: the producer's allocator (PyTorch's caching allocator,
//! PJRT's, the process's `malloc` for the DLPack tensor itself) then changes hands
//! between threads at every step. So each thread that makes hand-offs has a *home*:
//! a hand-off dropped elsewhere, or a keep-alive whose deferred release is done, is
//! posted to its home, and the home thread drops what was posted at its next release
//! (every release calls [`take_returns`] first), in its own calls' company, as it
//! would have dropped its own memory.
//!
//! Nothing is held indefinitely: what waits in a home longer than [`STALE`] (its
//! thread released nothing since) is dropped by the reaper's thread, which polls while
//! any home holds something; a home whose thread ended drops what is posted to it at
//! once; a flush or a drain drops everything waiting in every home.

use super::*;
use std::cell::Cell;

/// How long a keep-alive waits in its home for the home thread before the reaper's
/// thread drops it instead (see [`take_returns`]).
pub const STALE: Duration = Duration::from_millis(2);

/// A thread's home, as hand-offs name it: the slot it lives in, and which of the
/// slot's owners it is (slots are reused by later threads; what is given to the home
/// of a thread that ended is dropped at once, never posted to the slot's next owner).
#[derive(Clone, Copy)]
pub(crate) struct Home {
    slot: &'static Slot,
    generation: u64,
}

impl PartialEq for Home {
    fn eq(&self, other: &Home) -> bool {
        std::ptr::eq(self.slot, other.slot) && self.generation == other.generation
    }
}

/// The keep-alives posted to one thread, and since when the oldest waits.
///
/// A post and a take touch this slot alone (no count shared by all threads): a
/// hand-off given back on PJRT's thread every call, and taken on its home thread,
/// moves no other cache line between the two.
struct Slot {
    posted: Mutex<Posted>,
    /// Something was posted and not taken yet: what the home thread checks, without
    /// the lock, at each release, and the reaper's thread when it decides to park.
    waiting: AtomicBool,
    /// How many batches taken out of this slot are being dropped now: a flush that
    /// finds the homes empty waits for these, since they may be what it waits for.
    dropping: AtomicUsize,
}

#[derive(Default)]
struct Posted {
    items: Vec<KeepAlive>,
    since: Option<Instant>,
    /// A thread owns this slot (else what is posted is dropped at once).
    open: bool,
    /// Which owner: counts the threads that took the slot.
    generation: u64,
}

/// Every slot ever made (they are reused, never freed), for flushes and the reaper.
static HOMES: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());
/// Slots whose thread ended, for the next thread.
static FREE: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics under these locks (keep-alives are dropped outside them).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The calling thread's home, taken on first use and given back when it ends.
struct Local(Home);

impl Local {
    fn acquire() -> Local {
        let slot = locked(&FREE).pop().unwrap_or_else(|| {
            let slot: &'static Slot = Box::leak(Box::new(Slot {
                posted: Mutex::new(Posted::default()),
                waiting: AtomicBool::new(false),
                dropping: AtomicUsize::new(0),
            }));
            locked(&HOMES).push(slot);
            slot
        });
        let mut posted = locked(&slot.posted);
        posted.open = true;
        posted.generation += 1;
        Local(Home { slot, generation: posted.generation })
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let slot = self.0.slot;
        let mut items = Vec::new();
        {
            let mut posted = locked(&slot.posted);
            posted.open = false;
            take(slot, &mut posted, &mut items);
        }
        drop_taken(slot, &mut items);
        locked(&FREE).push(slot);
    }
}

thread_local! {
    static LOCAL: Local = Local::acquire();
}

/// The calling thread's home (`None` while the thread is being torn down).
pub(crate) fn home_here() -> Option<Home> {
    LOCAL.try_with(|l| l.0).ok()
}

/// Drops `keep_alive` now when called on its home's thread (or it has no home, or the
/// home's thread ended, or in a child made by `fork`, or while this thread drops what it
/// took out of homes: what it drops on a home thread's behalf is dropped all the way);
/// otherwise posts it to its home.
pub(crate) fn give_home<K: Send + 'static>(home: Option<Home>, keep_alive: K) {
    give_as(home, keep_alive, KeepAlive::new)
}

/// [`give_home`] for a keep-alive already erased (a deferred release's): posted as it is.
pub(crate) fn give_erased(home: Option<Home>, keep_alive: KeepAlive) {
    give_as(home, keep_alive, |k| k)
}

/// [`give_home`], erasing `keep_alive`'s type with `erase` only when it is posted.
fn give_as<K>(home: Option<Home>, keep_alive: K, erase: impl FnOnce(K) -> KeepAlive) {
    let elsewhere = home.filter(|h| home_here().is_none_or(|mine| mine != *h));
    let elsewhere = elsewhere.filter(|_| MINE.try_with(|m| m.get() == 0).unwrap_or(false));
    let Some(home) = elsewhere.filter(|_| !FORKED.load(Ordering::Relaxed)) else {
        drop_quietly(keep_alive);
        return;
    };
    let first = {
        let slot = home.slot;
        let mut posted = locked(&slot.posted);
        if !posted.open || posted.generation != home.generation {
            drop(posted);
            drop_quietly(keep_alive);
            return;
        }
        posted.items.push(erase(keep_alive));
        let first = posted.since.is_none();
        if first {
            // Set under the home's lock, as `take` clears it; sequentially consistent,
            // as `keep_polling`'s read of the reaper's parking is (see there).
            posted.since = Some(Instant::now());
            slot.waiting.store(true, Ordering::SeqCst);
        }
        first
    };
    if first {
        super::keep_polling();
    }
}

/// Drops what was posted to the calling thread's home. Cheap when nothing was (one
/// thread-local read and one atomic load): every release calls it first, and a thread
/// that makes hand-offs but releases nothing itself may call it at a point of its
/// choosing (else the reaper's thread drops what waited longer than [`STALE`]).
///
/// ```
/// handoff_runtime::reaper::take_returns(); // nothing was posted here: returns at once
/// ```
pub fn take_returns() {
    let Some(Home { slot, .. }) = home_here() else { return };
    if !slot.waiting.load(Ordering::Acquire) {
        return;
    }
    // The thread's spare list and the home's swap places: neither posting nor taking
    // allocates once both lists have room.
    let mut items = SPARE.try_with(Cell::take).unwrap_or_default();
    take(slot, &mut locked(&slot.posted), &mut items);
    drop_taken(slot, &mut items);
    let _ = SPARE.try_with(|s| s.set(items));
}

thread_local! {
    /// An empty list with room, swapped with the home's at each [`take_returns`].
    static SPARE: Cell<Vec<KeepAlive>> = const { Cell::new(Vec::new()) };
}

/// Swaps what waits in `slot` (its lock held by the caller) with `into` (empty),
/// counted in its `dropping` until [`drop_taken`] dropped it.
fn take(slot: &Slot, posted: &mut Posted, into: &mut Vec<KeepAlive>) {
    if posted.since.take().is_some() {
        slot.waiting.store(false, Ordering::Release);
    }
    into.clear();
    std::mem::swap(&mut posted.items, into);
    if !into.is_empty() {
        slot.dropping.fetch_add(1, Ordering::SeqCst);
    }
}

thread_local! {
    /// How many of the slots' `dropping` batches this thread is dropping (nested when a
    /// keep-alive's drop releases more): a flush inside such a drop does not wait
    /// for itself.
    static MINE: Cell<usize> = const { Cell::new(0) };
}

/// Drops what [`take`] took out of `slot` (leaving `items` empty, with its room),
/// then uncounts it.
fn drop_taken(slot: &Slot, items: &mut Vec<KeepAlive>) {
    if items.is_empty() {
        return;
    }
    let _ = MINE.try_with(|m| m.set(m.get() + 1));
    items.drain(..).for_each(drop_quietly);
    let _ = MINE.try_with(|m| m.set(m.get() - 1));
    slot.dropping.fetch_sub(1, Ordering::SeqCst);
}

/// Whether any home holds something (the reaper's thread polls while one does):
/// each slot's flag, read in order (a few, one per thread that made hand-offs).
pub(crate) fn any_waiting() -> bool {
    locked(&HOMES).iter().any(|slot| slot.waiting.load(Ordering::SeqCst))
}

/// Drops, on the calling thread, what waits in any home for longer than `older`
/// (everything with `Duration::ZERO`). Returns how many it dropped.
pub(crate) fn take_all(older: Duration) -> usize {
    // The slots whose flag says they hold something, under one lock (no list is made
    // when none does); each is checked again under its own lock below.
    let waiting: Vec<&'static Slot> =
        locked(&HOMES).iter().copied().filter(|slot| slot.waiting.load(Ordering::SeqCst)).collect();
    let mut n = 0;
    let mut items = Vec::new();
    for slot in waiting {
        {
            let mut posted = locked(&slot.posted);
            match posted.since {
                Some(since) if since.elapsed() >= older => take(slot, &mut posted, &mut items),
                _ => continue,
            }
        }
        n += items.len();
        drop_taken(slot, &mut items);
    }
    n
}

/// Drops, on the calling thread, everything that waits in any home, and returns once
/// what other threads took out of homes before is dropped too (for flushes and drains).
pub(crate) fn take_all_now() {
    take_all(Duration::ZERO);
    let mine = MINE.try_with(|m| m.get()).unwrap_or(0);
    let dropping = || locked(&HOMES).iter().map(|slot| slot.dropping.load(Ordering::SeqCst)).sum::<usize>();
    while dropping() > mine {
        std::thread::sleep(Duration::from_micros(20));
    }
}
