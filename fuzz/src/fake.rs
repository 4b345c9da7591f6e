//! A fake device for the `reaper_faults` and `export` targets: a [`Backend`] whose
//! streams complete their work at once, after a delay, only when told (or when the
//! host waits), or never, and whose records, waits, queries and synchronizes fail as
//! the fuzz input says.
//!
//! The model: each stream has a count of enqueued work items (`work`) and of
//! completed ones (`done`), completed in order. A record is itself a work item, and
//! its event completes once `done` reaches it. A harness "kernel" is a work item too.
//! So "the work enqueued on a stream before a release" is a number, and a keep-alive
//! may be dropped only once `done` has reached it: [`Fake::done`] says, at any instant
//! and on any thread, whether that holds.
//!
//! Faults are per call number, so that they do not depend on thread timing: the
//! `r`-th record of a stream fails when bit `r % 8` of [`Faults::record`] is set, and
//! the event of that record then fails every query (bit `r % 8` of [`Faults::query`])
//! or synchronize ([`Faults::sync`]); the `w`-th wait fails by bit `w % 8` of
//! [`Faults::wait`]. A stream in [`Mode::Never`] must never be synchronized (nobody
//! may block on it: only a bounded `drain` may give up on it): a synchronize there
//! panics, which the fuzzer reports.

use arbitrary::{Arbitrary, Unstructured};
use handoff::{Backend, Device, Error, EventPool, RawEvent, RawStream, Result, Stream};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a stream completes its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// At once.
    Instant,
    /// Each item this many microseconds after it was enqueued (in order); a
    /// synchronize sleeps until then.
    Delay(u16),
    /// Only when the harness says ([`Fake::complete`]) or a host synchronize waits.
    Manual,
    /// Never, until [`Fake::open`] (the end of the input); nobody may synchronize it.
    Never,
}

/// Which calls fail: bit `n % 8` for the `n`-th record, wait, or record's event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    pub record: u8,
    pub wait: u8,
    pub query: u8,
    pub sync: u8,
}

impl Faults {
    pub fn none(&self) -> bool {
        *self == Faults::default()
    }
}

fn bit(mask: u8, n: u64) -> bool {
    mask >> (n % 8) & 1 == 1
}

/// What a target records of one keep-alive, for the checks its drop makes on
/// whatever thread drops it.
#[derive(Default)]
pub struct Slot {
    /// Made (or released) and not yet dropped.
    pub armed: bool,
    pub dropped: bool,
    /// The fake stream whose queued work the drop must wait for (`None`: no order).
    pub lane: Option<usize>,
    /// Work items of that stream that must be complete when it drops.
    pub need: u64,
    /// The record number of its release event, and whether that record fails.
    pub record: u64,
    pub record_fails: bool,
    /// A `drain` gave up while it was queued: it may be leaked.
    pub drained: bool,
}

impl Slot {
    /// Keep-alive `id` is being dropped: at most once, never after its release event
    /// failed to record, never after a query of it failed unless the device then said
    /// it was done (a query of it or of a later event of its stream said so, or a
    /// synchronize of one returned), and only once the work enqueued on its stream
    /// before its release has completed.
    pub fn drop_checked(&mut self, id: usize, fake: Option<&Fake>) {
        assert!(self.armed && !self.dropped, "keep-alive {id} dropped twice (or before it was released)");
        self.armed = false;
        self.dropped = true;
        let Some(lane) = self.lane else { return };
        let fake = fake.expect("the input's fake device");
        assert!(!self.record_fails, "keep-alive {id} dropped although recording its release event failed");
        assert!(
            fake.done(lane, self.need),
            "keep-alive {id} dropped before the {} work items enqueued on fake stream {lane} before its release \
             completed",
            self.need
        );
        assert!(
            !fake.query_failed(lane, self.record) || fake.confirmed(lane, self.record),
            "keep-alive {id} dropped although querying its release event failed and the device never said \
             it was done (it must be leaked)"
        );
    }
}

/// The keep-alives of the current input and its fake device.
pub struct Ledger {
    pub fake: Option<Arc<Fake>>,
    pub slots: Vec<Slot>,
}

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger { fake: None, slots: Vec::new() });

/// Locks the ledger (a failed check panics and the fuzzer stops: poisoning is moot).
/// Never held while calling into handoff, which may drop a keep-alive on this thread.
pub fn ledger() -> MutexGuard<'static, Ledger> {
    LEDGER.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts an input: its fake device, no keep-alives.
pub fn start(fake: &Arc<Fake>) {
    let mut l = ledger();
    l.fake = Some(fake.clone());
    l.slots.clear();
}

/// One stream of the fake device.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub mode: Mode,
    pub faults: Faults,
}

impl Spec {
    /// A spec from fuzz input: mostly healthy, `faulty` allows failing calls.
    pub fn arbitrary(u: &mut Unstructured<'_>, never: bool, faulty: bool) -> arbitrary::Result<Spec> {
        let mode = match u.int_in_range(0..=9)? {
            0..=2 => Mode::Instant,
            3..=5 => Mode::Delay(u.int_in_range(0..=200)?),
            6..=7 => Mode::Manual,
            _ if never => Mode::Never,
            _ => Mode::Manual,
        };
        let faults = if faulty && u.ratio(1, 3)? {
            let mask = |u: &mut Unstructured<'_>| -> arbitrary::Result<u8> {
                if u.ratio(1, 2)? { Ok(0) } else { u8::arbitrary(u) }
            };
            Faults { record: mask(u)?, wait: mask(u)?, query: mask(u)?, sync: mask(u)? }
        } else {
            Faults::default()
        };
        Ok(Spec { mode, faults })
    }
}

struct Lane {
    spec: Spec,
    opened: bool,
    work: u64,
    /// Manual: completed items.
    done: u64,
    /// Delay: when each item completes (non-decreasing).
    due: Vec<Instant>,
    records: u64,
    waits: u64,
}

struct Ev {
    lane: usize,
    target: u64,
    record: u64,
}

#[derive(Default)]
struct State {
    lanes: Vec<Lane>,
    events: HashMap<RawEvent, Ev>,
    next_event: RawEvent,
    /// (lane, record number) of events whose query failed.
    query_failed: HashSet<(usize, u64)>,
    /// (lane, record number) of events whose synchronize failed.
    sync_failed: HashSet<(usize, u64)>,
    /// Per lane, the latest record number the device said was done (a query answered
    /// true, or a synchronize returned): events of a stream complete in order, so
    /// every earlier record is done too.
    confirmed: HashMap<usize, u64>,
}

impl State {
    /// The device said `record` of `lane` (and so every earlier one) was done.
    fn confirm(&mut self, lane: usize, record: u64) {
        let latest = self.confirmed.entry(lane).or_insert(record);
        *latest = (*latest).max(record);
    }

    fn done(&self, lane: usize, now: Instant) -> u64 {
        let l = &self.lanes[lane];
        if l.opened {
            return l.work;
        }
        match l.spec.mode {
            Mode::Instant => l.work,
            Mode::Delay(_) => l.due.partition_point(|&t| t <= now) as u64,
            Mode::Manual => l.done,
            Mode::Never => 0,
        }
    }

    fn enqueue(&mut self, lane: usize) -> u64 {
        let l = &mut self.lanes[lane];
        l.work += 1;
        if let Mode::Delay(us) = l.spec.mode {
            let at = Instant::now() + Duration::from_micros(us.into());
            let at = l.due.last().map_or(at, |&last| last.max(at));
            l.due.push(at);
        }
        l.work
    }
}

/// The fake device: one per fuzz input, streams `0..n`.
pub struct Fake {
    pool: EventPool,
    state: Mutex<State>,
}

fn failed(call: &'static str) -> Error {
    Error::Backend { backend: "fake", call, message: "injected by the fuzz input".into() }
}

impl Fake {
    pub fn new(specs: &[Spec]) -> Arc<Fake> {
        let lanes = specs
            .iter()
            .map(|&spec| Lane {
                spec,
                opened: false,
                work: 0,
                done: 0,
                due: Vec::new(),
                records: 0,
                waits: 0,
            })
            .collect();
        Arc::new(Fake { pool: EventPool::new(), state: Mutex::new(State { lanes, ..State::default() }) })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stream `lane` as a handoff [`Stream`].
    pub fn stream(self: &Arc<Self>, lane: usize) -> Stream {
        Stream::new(self.clone(), lane as RawStream + 1)
    }

    pub fn lanes(&self) -> usize {
        self.state().lanes.len()
    }

    pub fn spec(&self, lane: usize) -> Spec {
        self.state().lanes[lane].spec
    }

    /// Enqueues a harness kernel on `lane`; returns the work count including it.
    pub fn kernel(&self, lane: usize) -> u64 {
        self.state().enqueue(lane)
    }

    /// The work enqueued on `lane` so far.
    pub fn work(&self, lane: usize) -> u64 {
        self.state().lanes[lane].work
    }

    /// Whether the first `n` work items of `lane` have completed, now.
    pub fn done(&self, lane: usize, n: u64) -> bool {
        self.state().done(lane, Instant::now()) >= n
    }

    /// Completes the work enqueued on a manual `lane` so far.
    pub fn complete(&self, lane: usize) {
        let mut s = self.state();
        let l = &mut s.lanes[lane];
        l.done = l.work;
    }

    /// Lets a `Never` lane complete everything from now on (the input is over).
    pub fn open(&self, lane: usize) {
        self.state().lanes[lane].opened = true;
    }

    /// The number the next record on `lane` gets, and whether it will fail.
    pub fn next_record(&self, lane: usize) -> (u64, bool) {
        let s = self.state();
        let l = &s.lanes[lane];
        (l.records, bit(l.spec.faults.record, l.records))
    }

    /// Whether a query of the event of record `record` of `lane` has failed.
    pub fn query_failed(&self, lane: usize, record: u64) -> bool {
        self.state().query_failed.contains(&(lane, record))
    }

    /// Whether the device said an event of `lane` recorded at or after `record` was done.
    pub fn confirmed(&self, lane: usize, record: u64) -> bool {
        self.state().confirmed.get(&lane).is_some_and(|&r| r >= record)
    }

    /// Whether a synchronize of an event of `lane` recorded at or after `record` failed.
    pub fn sync_failed_since(&self, lane: usize, record: u64) -> bool {
        self.state().sync_failed.iter().any(|&(l, r)| l == lane && r >= record)
    }

    fn event(&self, event: RawEvent) -> (usize, u64, u64, Spec) {
        let s = self.state();
        let e = s.events.get(&event).unwrap_or_else(|| panic!("event {event} was never recorded"));
        (e.lane, e.target, e.record, s.lanes[e.lane].spec)
    }
}

impl Backend for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn device(&self) -> Device {
        Device::Mock(90)
    }
    fn event_pool(&self) -> &EventPool {
        &self.pool
    }
    fn create_event(&self) -> Result<RawEvent> {
        let mut s = self.state();
        s.next_event += 1;
        Ok(s.next_event)
    }
    fn destroy_event(&self, _: RawEvent) {}
    fn record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        let mut s = self.state();
        let lane = stream as usize - 1;
        let l = &mut s.lanes[lane];
        let record = l.records;
        l.records += 1;
        if bit(l.spec.faults.record, record) {
            return Err(failed("record"));
        }
        let target = s.enqueue(lane);
        s.events.insert(event, Ev { lane, target, record });
        Ok(())
    }
    fn wait(&self, stream: RawStream, _: RawEvent) -> Result<()> {
        let mut s = self.state();
        let l = &mut s.lanes[stream as usize - 1];
        l.waits += 1;
        if bit(l.spec.faults.wait, l.waits - 1) { Err(failed("wait")) } else { Ok(()) }
    }
    fn query(&self, event: RawEvent) -> Result<bool> {
        let (lane, target, record, spec) = self.event(event);
        if bit(spec.faults.query, record) {
            self.state().query_failed.insert((lane, record));
            return Err(failed("query"));
        }
        let mut s = self.state();
        let done = s.done(lane, Instant::now()) >= target;
        if done {
            s.confirm(lane, record);
        }
        Ok(done)
    }
    fn synchronize(&self, event: RawEvent) -> Result<()> {
        let (lane, target, record, spec) = self.event(event);
        let mut s = self.state();
        if spec.mode == Mode::Never && !s.lanes[lane].opened {
            panic!(
                "synchronize on an event of fake stream {lane}, which never completes: handoff blocked on a \
                 stream nobody asked it to flush (a flush of another stream, or a drain, must never wait on it)"
            );
        }
        if bit(spec.faults.sync, record) {
            s.sync_failed.insert((lane, record));
            return Err(failed("synchronize"));
        }
        if spec.mode == Mode::Manual {
            let l = &mut s.lanes[lane];
            l.done = l.done.max(target);
        }
        if let Mode::Delay(_) = spec.mode
            && !s.lanes[lane].opened
        {
            let due = s.lanes[lane].due[target as usize - 1];
            drop(s);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            s = self.state();
        }
        // Returned: the device says the event is done.
        s.confirm(lane, record);
        Ok(())
    }
    fn describe_stream(&self, stream: RawStream) -> String {
        format!("fake:{}", stream - 1)
    }
}
