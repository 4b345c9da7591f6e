//! The reaper's tests, with fake backends whose events never complete or fail.

use super::*;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{Backend, EventPool, RawEvent, RawStream};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::thread::ThreadId;
use std::time::Instant;

/// Events of this stream complete at once.
const OK: RawStream = 1;
/// Events of this stream complete only once the gate opens; `synchronize` blocks until then.
const STUCK: RawStream = 2;
/// Queries and synchronizes of events of this stream fail.
const QUERY_FAILS: RawStream = 3;
/// Records on this stream fail.
const RECORD_FAILS: RawStream = 4;
/// Events of this stream never complete, and `synchronize` fails at once.
const SYNC_FAILS: RawStream = 5;

#[derive(Default)]
struct FakeState {
    next: RawEvent,
    recorded_on: HashMap<RawEvent, RawStream>,
    open: bool,
    in_sync: usize,
}

/// A device whose streams fail in the ways above.
struct Fake {
    pool: EventPool,
    state: Mutex<FakeState>,
    cv: Condvar,
}

impl Fake {
    fn new() -> Arc<Fake> {
        Arc::new(Fake { pool: EventPool::new(), state: Mutex::default(), cv: Condvar::new() })
    }
    fn stream(self: &Arc<Self>, raw: RawStream) -> Stream {
        Stream::new(self.clone(), raw)
    }
    fn stream_of(&self, event: RawEvent) -> RawStream {
        self.state.lock().unwrap().recorded_on[&event]
    }
    /// Lets the stuck stream complete.
    fn open(&self) {
        self.state.lock().unwrap().open = true;
        self.cv.notify_all();
    }
    /// Waits until someone is blocked in `synchronize`.
    fn wait_for_sync(&self) {
        let s = self.state.lock().unwrap();
        let (_s, t) = self.cv.wait_timeout_while(s, Duration::from_secs(5), |s| s.in_sync == 0).unwrap();
        assert!(!t.timed_out(), "nobody entered synchronize");
    }
}

fn failed(what: &str) -> Error {
    Error::Adapter { adapter: "fake", message: format!("{what} failed (injected)") }
}

impl Backend for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn device(&self) -> Device {
        Device::Mock(77)
    }
    fn event_pool(&self) -> &EventPool {
        &self.pool
    }
    fn create_event(&self) -> Result<RawEvent> {
        let mut s = self.state.lock().unwrap();
        s.next += 1;
        Ok(s.next)
    }
    fn destroy_event(&self, _: RawEvent) {}
    fn record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        if stream == RECORD_FAILS {
            return Err(failed("record"));
        }
        self.state.lock().unwrap().recorded_on.insert(event, stream);
        Ok(())
    }
    fn wait(&self, _: RawStream, _: RawEvent) -> Result<()> {
        Ok(())
    }
    fn query(&self, event: RawEvent) -> Result<bool> {
        match self.stream_of(event) {
            STUCK => Ok(self.state.lock().unwrap().open),
            QUERY_FAILS => Err(failed("query")),
            SYNC_FAILS => Ok(false),
            _ => Ok(true),
        }
    }
    fn synchronize(&self, event: RawEvent) -> Result<()> {
        match self.stream_of(event) {
            STUCK => {
                let mut s = self.state.lock().unwrap();
                s.in_sync += 1;
                self.cv.notify_all();
                let mut s = self.cv.wait_while(s, |s| !s.open).unwrap();
                s.in_sync -= 1;
                Ok(())
            }
            QUERY_FAILS | SYNC_FAILS => Err(failed("synchronize")),
            _ => Ok(()),
        }
    }
}

/// A keep-alive that says when it is dropped.
struct Flag(Arc<AtomicBool>);
impl Drop for Flag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}
fn flag() -> (Flag, Arc<AtomicBool>) {
    let f = Arc::new(AtomicBool::new(false));
    (Flag(f.clone()), f)
}

/// Opens the gate when the test ends, passing or not, so that no thread stays blocked.
struct OpenOnDrop(Arc<Fake>);
impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// Runs `f` on a thread and says whether it returned within `limit`.
fn returns_within(limit: Duration, f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(limit).is_ok()
}

fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}

/// Tests that leak on purpose run one at a time, so that counts are exact.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn a_stream_that_never_completes_holds_up_no_other_stream() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fake = Fake::new();
    let _open = OpenOnDrop(fake.clone());
    let (stuck, ok) = (fake.stream(STUCK), fake.stream(OK));
    let (k_stuck, stuck_dropped) = flag();
    release_after(Some(&stuck), k_stuck);
    // Someone flushes the stuck stream and blocks on the device.
    let flusher = {
        let stuck = stuck.clone();
        std::thread::spawn(move || flush_stream(&stuck))
    };
    fake.wait_for_sync();

    // A flush of another stream completes meanwhile.
    let (k_ok, ok_dropped) = flag();
    release_after(Some(&ok), k_ok);
    let ok2 = ok.clone();
    assert!(
        returns_within(Duration::from_secs(2), move || flush_stream(&ok2)),
        "flush_stream(ok) did not return within 2 s while another thread waits on a stuck stream"
    );
    assert!(ok_dropped.load(Ordering::SeqCst));
    // And the reaper thread keeps releasing without any flush.
    let (k_ok, ok_dropped) = flag();
    release_after(Some(&ok), k_ok);
    assert!(
        eventually(Duration::from_secs(2), || ok_dropped.load(Ordering::SeqCst)),
        "the reaper thread released nothing within 2 s while a flush waits on a stuck stream"
    );
    assert!(!stuck_dropped.load(Ordering::SeqCst), "released before its stream completed");

    fake.open();
    flusher.join().unwrap();
    assert!(stuck_dropped.load(Ordering::SeqCst));
}

/// The background thread takes completed releases out of the queue and does them
/// after unlocking it; a flush arriving in between must wait for them.
#[test]
fn a_flush_returns_only_once_the_releases_before_it_are_done() {
    struct Slow(Arc<AtomicUsize>);
    impl Drop for Slow {
        fn drop(&mut self) {
            std::thread::sleep(Duration::from_micros(20));
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let fake = Fake::new();
    let ok = fake.stream(OK);
    let dropped = Arc::new(AtomicUsize::new(0));
    for i in 1..=500 {
        release_after(Some(&ok), Slow(dropped.clone()));
        if i % 3 == 0 {
            // Let the background thread take some.
            std::thread::sleep(Duration::from_micros(10));
        }
        flush_stream(&ok);
        assert_eq!(dropped.load(Ordering::SeqCst), i, "flush_stream returned before release {i} was done");
    }
}

#[test]
fn the_exit_drain_returns_within_its_bound_and_leaks_what_is_left() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fake = Fake::new();
    let _open = OpenOnDrop(fake.clone());
    let (k_stuck, stuck_dropped) = flag();
    release_after(Some(&fake.stream(STUCK)), k_stuck);
    let (k_ok, ok_dropped) = flag();
    release_after(Some(&fake.stream(OK)), k_ok);

    let leaked0 = crate::stats().releases_leaked;
    let t0 = Instant::now();
    let (tx, rx) = mpsc::channel();
    assert!(
        returns_within(Duration::from_secs(3), move || {
            let _ = tx.send(drain(Duration::from_millis(200)));
        }),
        "drain(200 ms) did not return within 3 s with a stream that never completes"
    );
    assert!(t0.elapsed() >= Duration::from_millis(200), "gave up before its deadline");
    assert_eq!(rx.recv().unwrap(), Drained { leaked: 1, in_flight: 0 });
    assert_eq!(crate::stats().releases_leaked - leaked0, 1, "the leak is counted");
    assert!(ok_dropped.load(Ordering::SeqCst), "a completed release was not done by the drain");
    assert!(!stuck_dropped.load(Ordering::SeqCst), "released before its stream completed");
    fake.open();
    assert!(drain(Duration::from_millis(100)).is_complete(), "the leaked release left the queue");
    assert!(!stuck_dropped.load(Ordering::SeqCst), "a leaked keep-alive is never dropped");
}

#[test]
fn a_failed_query_keeps_the_keep_alive() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fake = Fake::new();
    let (pending0, leaked0) = (pending(), crate::stats().releases_leaked);
    let (k, dropped) = flag();
    release_after(Some(&fake.stream(QUERY_FAILS)), k);
    // The reaper thread queries, and must not free on error. It counts the leak just
    // after it takes the release out of the queue: wait for both.
    let leaked = || crate::stats().releases_leaked - leaked0;
    assert!(
        eventually(Duration::from_secs(2), || pending() == pending0 && leaked() > 0),
        "never taken out of the queue and counted as leaked"
    );
    assert!(!dropped.load(Ordering::SeqCst), "the keep-alive was dropped although its event query failed");
    assert_eq!(leaked(), 1, "the leak is counted once");
}

#[test]
fn a_failed_synchronize_in_a_flush_keeps_the_keep_alive() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fake = Fake::new();
    let s = fake.stream(SYNC_FAILS);
    let (k, dropped) = flag();
    let leaked0 = crate::stats().releases_leaked;
    release_after(Some(&s), k);
    let ((), d) = crate::stats::measure(|| flush_stream(&s));
    assert!(
        !dropped.load(Ordering::SeqCst),
        "flush dropped the keep-alive although waiting for its event failed"
    );
    assert_eq!(d.host_syncs, 1);
    assert_eq!(crate::stats().releases_leaked - leaked0, 1, "the leak is counted");
}

#[test]
fn a_failed_record_keeps_the_keep_alive() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fake = Fake::new();
    let (k, dropped) = flag();
    let ((), d) = crate::stats::measure(|| release_after(Some(&fake.stream(RECORD_FAILS)), k));
    assert!(!dropped.load(Ordering::SeqCst));
    assert_eq!((d.releases_leaked, d.releases_deferred), (1, 0));
}

#[cfg(unix)]
#[test]
fn a_forked_child_releases_nothing() {
    unsafe extern "C" {
        fn fork() -> i32;
        fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
        fn _exit(code: i32) -> !;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fake = Fake::new();
    let ok = fake.stream(OK);
    // The parent's reaper runs before the fork.
    let (k, dropped) = flag();
    release_after(Some(&ok), k);
    flush_stream(&ok);
    assert!(dropped.load(Ordering::SeqCst));

    // SAFETY: the child only touches atomics, its own stack and heap (glibc's fork
    // makes malloc usable in the child) and the reaper's fork-child paths, which
    // take no lock, then leaves with `_exit`, running no exit handler.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let (k, dropped) = flag();
        let leaked0 = crate::stats().releases_leaked;
        release_after(Some(&ok), k);
        flush();
        let left = drain(Duration::from_secs(1));
        let code = if dropped.load(Ordering::SeqCst) {
            1
        } else if crate::stats().releases_leaked != leaked0 + 1 {
            2
        } else if !left.is_complete() {
            3
        } else {
            0
        };
        // SAFETY: ends the child at once, as a fork child of a threaded process must.
        unsafe { _exit(code) }
    }
    let mut status = -1;
    // SAFETY: `pid` is our child; `status` is a valid place for its status.
    let waited = unsafe { waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert_eq!(
        status >> 8,
        0,
        "in the child (raw status {status:#x}): 1 = a keep-alive was dropped, 2 = the leak was not counted, \
         3 = the drain saw the parent's queue"
    );
    // The parent's reaper is unaffected.
    let (k, dropped) = flag();
    release_after(Some(&ok), k);
    flush_stream(&ok);
    assert!(dropped.load(Ordering::SeqCst));
}

/// A device whose one stream completes its events in record order, and only as far as
/// someone waited: `synchronize(e)` completes `e` and what was recorded before it. Its
/// first record can be held inside `record`, after it has taken its place in the order.
struct InOrder {
    pool: EventPool,
    state: Mutex<InOrderState>,
    cv: Condvar,
}

#[derive(Default)]
struct InOrderState {
    next_event: RawEvent,
    /// Each event's place in record order (from 1).
    place: HashMap<RawEvent, u64>,
    recorded: u64,
    /// Every event up to this place has completed.
    done: u64,
    hold_first: bool,
    holding: bool,
}

impl InOrder {
    fn lock(&self) -> MutexGuard<'_, InOrderState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn wait_holding(&self) {
        let s = self.lock();
        let (_s, t) = self.cv.wait_timeout_while(s, Duration::from_secs(5), |s| !s.holding).unwrap();
        assert!(!t.timed_out(), "the first record was not held");
    }
    fn let_go(&self) {
        self.lock().hold_first = false;
        self.cv.notify_all();
    }
}

impl Backend for InOrder {
    fn name(&self) -> &'static str {
        "in-order"
    }
    fn device(&self) -> Device {
        Device::Mock(78)
    }
    fn event_pool(&self) -> &EventPool {
        &self.pool
    }
    fn create_event(&self) -> Result<RawEvent> {
        let mut s = self.lock();
        s.next_event += 1;
        Ok(s.next_event)
    }
    fn destroy_event(&self, _: RawEvent) {}
    fn record(&self, event: RawEvent, _: RawStream) -> Result<()> {
        let mut s = self.lock();
        s.recorded += 1;
        let place = s.recorded;
        s.place.insert(event, place);
        if place == 1 && s.hold_first {
            s.holding = true;
            self.cv.notify_all();
            let mut s = self.cv.wait_while(s, |s| s.hold_first).unwrap_or_else(|p| p.into_inner());
            s.holding = false;
        }
        Ok(())
    }
    fn wait(&self, _: RawStream, _: RawEvent) -> Result<()> {
        Ok(())
    }
    fn query(&self, event: RawEvent) -> Result<bool> {
        let s = self.lock();
        Ok(s.place[&event] <= s.done)
    }
    fn synchronize(&self, event: RawEvent) -> Result<()> {
        let mut s = self.lock();
        s.done = s.done.max(s.place[&event]);
        Ok(())
    }
}

/// A keep-alive released behind the `place`-th record: its drop notes whether that
/// event had completed.
struct Behind {
    device: Arc<InOrder>,
    place: u64,
    early: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
}
impl Drop for Behind {
    fn drop(&mut self) {
        if self.device.lock().done < self.place {
            self.early.store(true, Ordering::SeqCst);
        }
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// Two threads releasing behind one stream at once: the one that recorded first is
/// held inside `record` while the other releases. Their releases must still be queued
/// in record order, as a flush waits for the last queued event only (found by the
/// `export` fuzz target: fuzz/regressions/export/concurrent-releases-out-of-order).
#[test]
fn releases_behind_one_stream_are_queued_in_record_order() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let device = Arc::new(InOrder {
        pool: EventPool::new(),
        state: Mutex::new(InOrderState { hold_first: true, ..Default::default() }),
        cv: Condvar::new(),
    });
    let stream = Stream::new(device.clone(), 9);
    let (early, dropped) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let behind =
        |place| Behind { device: device.clone(), place, early: early.clone(), dropped: dropped.clone() };

    let first = {
        let (s, k) = (stream.clone(), behind(1));
        std::thread::spawn(move || release_after(Some(&s), k))
    };
    device.wait_holding();
    let second = {
        let (s, k) = (stream.clone(), behind(2));
        std::thread::spawn(move || release_after(Some(&s), k))
    };
    // The second thread records and queues now, unless it waits for the first.
    std::thread::sleep(Duration::from_millis(50));
    device.let_go();
    first.join().unwrap();
    second.join().unwrap();

    flush_stream(&stream);
    assert_eq!(dropped.load(Ordering::SeqCst), 2, "the flush left a release queued");
    assert!(
        !early.load(Ordering::SeqCst),
        "a keep-alive was dropped before the event recorded for it completed"
    );
}

/// Once the queue has been empty for `LINGER`, the background thread parks; the next
/// release must wake it (without a flush), or its keep-alive is never dropped.
#[test]
fn a_release_after_the_background_thread_parked_wakes_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fake = Fake::new();
    let ok = fake.stream(OK);
    let (k, dropped) = flag();
    release_after(Some(&ok), k);
    assert!(
        eventually(Duration::from_secs(5), || dropped.load(Ordering::SeqCst)),
        "the first release was not done"
    );
    let r = reaper();
    assert!(
        eventually(LINGER * 50, || lock(r).parked),
        "the background thread did not park within {:?} of an empty queue",
        LINGER * 50
    );
    let (k, dropped) = flag();
    release_after(Some(&ok), k);
    assert!(
        eventually(Duration::from_secs(5), || dropped.load(Ordering::SeqCst)),
        "a release made while the background thread was parked was not done within 5 s"
    );
}

/// Host memory whose drop says on which thread it happened.
struct HomeProbe {
    data: Vec<f32>,
    dropped_on: Arc<Mutex<Option<ThreadId>>>,
}
impl Drop for HomeProbe {
    fn drop(&mut self) {
        *self.dropped_on.lock().unwrap() = Some(std::thread::current().id());
    }
}

/// A host hand-off of the four floats `data(&keep_alive)` points to, made on the
/// calling thread and released at once.
fn host_handoff<K: Send + 'static>(keep_alive: K, data: fn(&K) -> *const f32) -> crate::Handoff {
    crate::Handoff::with_keep_alive(
        keep_alive,
        |k| {
            Ok(crate::TensorDesc::new(data(k) as *mut _, Device::Host, crate::dtype::DataType::F32, &[4][..]))
        },
        &Stream::host(),
        crate::Ready::Elided,
        crate::Release::Immediately,
    )
    .unwrap()
}

/// A host hand-off of a probe.
fn probe_handoff() -> (crate::Handoff, Arc<Mutex<Option<ThreadId>>>) {
    let dropped_on = Arc::new(Mutex::new(None));
    let probe = HomeProbe { data: vec![1.0; 4], dropped_on: dropped_on.clone() };
    (host_handoff(probe, |p| p.data.as_ptr()), dropped_on)
}

/// Drops `h` on a new thread and waits for it; returns that thread's id.
fn drop_elsewhere(h: crate::Handoff) -> ThreadId {
    std::thread::spawn(move || {
        drop(h);
        std::thread::current().id()
    })
    .join()
    .unwrap()
}

#[test]
fn a_keep_alive_let_go_elsewhere_is_dropped_at_home() {
    let (h, dropped_on) = probe_handoff();
    let elsewhere = drop_elsewhere(h);
    take_returns();
    // Given back: dropped here, unless another test's flush or the background thread
    // (after STALE) took it first (and may still be dropping it); never where it was
    // let go.
    assert!(eventually(Duration::from_secs(5), || dropped_on.lock().unwrap().is_some()));
    let on = dropped_on.lock().unwrap().expect("dropped (above)");
    assert_ne!(on, elsewhere, "dropped on the thread that let go of it, not given back");
    // At home, a release is dropped at once, in place.
    let (h, dropped_on) = probe_handoff();
    drop(h);
    assert_eq!(*dropped_on.lock().unwrap(), Some(std::thread::current().id()));
}

#[test]
fn a_hand_off_let_go_elsewhere_goes_home_whole() {
    let (h, dropped_on) = probe_handoff();
    // Its release starts where its owner is dropped: counted on that thread.
    let immediate = || crate::stats::of_this_thread(Counter::ReleasesImmediate as usize);
    let released_there = std::thread::spawn(move || {
        let before = immediate();
        drop(h);
        immediate() - before
    })
    .join()
    .unwrap();
    assert_eq!(released_there, 0, "the hand-off's own tensor was freed where it was let go");
    take_returns();
    assert!(eventually(Duration::from_secs(5), || dropped_on.lock().unwrap().is_some()));
}

#[test]
fn what_waits_at_a_home_that_makes_no_hand_off_is_dropped_by_the_reaper() {
    let (h, dropped_on) = probe_handoff();
    drop_elsewhere(h);
    // This thread makes no hand-off and takes nothing back.
    assert!(
        eventually(Duration::from_secs(5), || dropped_on.lock().unwrap().is_some()),
        "dropped within its bound without the home thread"
    );
    assert_ne!(*dropped_on.lock().unwrap(), Some(std::thread::current().id()));
}

#[test]
fn a_flush_drops_what_waits_at_homes() {
    let (h, dropped_on) = probe_handoff();
    let waiter = std::thread::spawn(move || {
        drop_elsewhere(h);
        // Another thread's flush: the home (the test thread) takes nothing back itself.
        flush();
    });
    waiter.join().unwrap();
    assert!(dropped_on.lock().unwrap().is_some(), "a flush returns only once it is dropped");
}

#[test]
fn a_home_whose_thread_ended_drops_at_once() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(probe_handoff()).unwrap()).join().unwrap();
    let (h, dropped_on) = rx.recv().unwrap();
    drop(h);
    assert_eq!(*dropped_on.lock().unwrap(), Some(std::thread::current().id()), "dropped where let go");
}

#[test]
fn a_flush_inside_a_given_back_drop_does_not_wait_for_itself() {
    let done = returns_within(Duration::from_secs(5), || {
        /// Host memory whose drop flushes (as a Python producer's deleter may drain).
        struct Flushes(Vec<f32>);
        impl Drop for Flushes {
            fn drop(&mut self) {
                flush();
            }
        }
        drop_elsewhere(host_handoff(Flushes(vec![1.0; 4]), |k| k.0.as_ptr()));
        take_returns();
    });
    assert!(done, "a flush inside a given-back keep-alive's drop waited for itself");
}

#[test]
fn a_sweep_takes_the_releases_whose_work_is_done_and_no_newer_one() {
    use crate::mock::{Kernel, Mock};
    let mock = Mock::new();
    let s = mock.stream(0, "swept");
    let (first, first_done) = flag();
    let (second, second_done) = flag();
    let (third, third_done) = flag();
    mock.launch(&s, Kernel::new("one").micros(10));
    release_after(Some(&s), first);
    mock.launch(&s, Kernel::new("two").micros(10));
    release_after(Some(&s), second);
    mock.launch(&s, Kernel::new("three").micros(10));
    release_after(Some(&s), third);
    // Several sweeps with nothing done: nothing released.
    std::thread::sleep(MIN_POLL * 10);
    take_returns();
    assert!(!first_done.load(Ordering::SeqCst) && !second_done.load(Ordering::SeqCst));
    // The first kernel done: its release only (the newest is not done, so the sweep
    // walks the oldest ones); it comes home and is dropped at this thread's next take.
    mock.advance(10_000);
    assert!(eventually(Duration::from_secs(5), || {
        take_returns();
        first_done.load(Ordering::SeqCst)
    }));
    std::thread::sleep(MIN_POLL * 10);
    take_returns();
    assert!(!second_done.load(Ordering::SeqCst), "released before its work was done");
    assert!(!third_done.load(Ordering::SeqCst), "released before its work was done");
    // All done: the newest answers for both that are left.
    mock.advance(20_000);
    assert!(eventually(Duration::from_secs(5), || {
        take_returns();
        second_done.load(Ordering::SeqCst) && third_done.load(Ordering::SeqCst)
    }));
}
