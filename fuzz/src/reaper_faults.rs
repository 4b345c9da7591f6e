//! Target `reaper_faults`: deferred releases through the reaper
//! (`reaper::release_after`, `flush`, `flush_stream`, `drain`) on a fake device whose
//! streams complete at once, late, when told, or never, and whose records, queries and
//! synchronizes fail as the input says (see [`crate::fake`]).
//!
//! Keep-alives are zero-sized types `Ka<I>` (one type per slot `I`), so a keep-alive
//! the reaper leaks on purpose allocates nothing and LeakSanitizer stays on for
//! everything else. Dropping `Ka<I>` checks, on whatever thread drops it:
//!
//! - it was released and not dropped before (at most once);
//! - all the work enqueued on its stream before its release has completed (never
//!   early);
//! - its release event was recorded, and no query of it failed unless the device then
//!   said it was done (a query of it or of a later event of its stream, or a
//!   synchronize): never after an error the device did not take back.
//!
//! And the harness checks, on the fuzzing thread: a host (or no-stream) release drops
//! at once; a failed record leaks (counted); after `flush_stream(s)` every release
//! queued on `s` before it is dropped, or leaked for a reason the device gave (a failed
//! record, query or synchronize, or a `drain` that gave up); a `flush_stream` of a
//! healthy stream returns while another stream never completes (no synchronize ever
//! reaches a stream in `Mode::Never`: the fake panics); `drain(t)` returns within `t`
//! plus slack; concurrent flushes on other threads return within 10 s; and at the end
//! `pending()` is back to 0 right after `flush()`, and `stats().releases_leaked` went
//! up by exactly the keep-alives that were never dropped.

use crate::fake::{self, Fake, Mode, Slot, Spec, ledger};
use arbitrary::{Arbitrary, Unstructured};
use handoff::{Stream, reaper, stats};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Keep-alive slots per input.
const SLOTS: usize = 32;

/// A keep-alive of slot `I`: zero-sized, so that leaking it allocates nothing.
struct Ka<const I: usize>;

impl<const I: usize> Drop for Ka<I> {
    fn drop(&mut self) {
        let mut l = ledger();
        let fake = l.fake.clone();
        l.slots[I].drop_checked(I, fake.as_deref());
    }
}

fn release(slot: usize, after: Option<&Stream>) {
    macro_rules! slots {
        ($($n:literal)*) => {
            match slot {
                $($n => reaper::release_after(after, Ka::<$n>),)*
                _ => unreachable!(),
            }
        };
    }
    slots!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
}

#[derive(Debug, Arbitrary)]
enum Op {
    /// Release the next keep-alive behind a fake stream (`to < lanes`), the host
    /// stream, or no stream; `kernel` enqueues work there first.
    Release {
        to: u8,
        kernel: bool,
    },
    Kernel {
        lane: u8,
    },
    Complete {
        lane: u8,
    },
    /// Let the reaper thread run a little.
    Sleep {
        us: u8,
    },
    FlushStream {
        lane: u8,
    },
    /// `flush()`, only while no stream that never completes has releases queued.
    Flush,
    /// `flush_stream` on another thread, joined at the end (or by `Join`).
    SpawnFlush {
        lane: u8,
    },
    Join,
    /// `drain(0 or 1 ms)`.
    Drain {
        ms: bool,
    },
}

#[derive(Debug)]
struct Case {
    specs: Vec<Spec>,
    ops: Vec<Op>,
}

impl<'a> Arbitrary<'a> for Case {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let n = u.int_in_range(1..=4)?;
        let specs = (0..n).map(|_| Spec::arbitrary(u, true, true)).collect::<arbitrary::Result<_>>()?;
        let mut ops = Vec::new();
        while ops.len() < 64 && !u.is_empty() {
            ops.push(Op::arbitrary(u)?);
        }
        Ok(Case { specs, ops })
    }
}

struct Flusher {
    done: mpsc::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
    lane: usize,
}

fn join(flushers: &mut Vec<Flusher>) {
    for f in flushers.drain(..) {
        assert!(
            f.done.recv_timeout(Duration::from_secs(10)).is_ok(),
            "flush_stream of fake stream {} (which completes) did not return within 10 s on another thread",
            f.lane
        );
        // Returned: joined so that its exit is over before the per-input leak check.
        f.thread.join().expect("a flushing thread panicked");
    }
}

/// Whether slot `i`, released and not dropped, may have been leaked: the device
/// gave a reason, or a drain gave up on it.
fn may_leak(fake: &Fake, s: &Slot) -> bool {
    let Some(lane) = s.lane else { return false };
    s.record_fails || s.drained || fake.query_failed(lane, s.record) || fake.sync_failed_since(lane, s.record)
}

/// After a flush of `lanes`: every release queued behind them is done or leaked for a reason.
fn check_flushed(fake: &Fake, lanes: &[usize], what: &str) {
    let l = ledger();
    for (i, s) in l.slots.iter().enumerate() {
        if s.armed && s.lane.is_some_and(|x| lanes.contains(&x)) {
            assert!(
                may_leak(fake, s),
                "{what} returned while keep-alive {i} (behind fake stream {:?}, no fault) was neither dropped nor leaked",
                s.lane
            );
        }
    }
}

/// One input.
pub fn fuzz_reaper(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(case) = Case::arbitrary(&mut u) else { return };
    assert_eq!(reaper::pending(), 0, "an earlier input left releases queued");
    let fake = Fake::new(&case.specs);
    let streams: Vec<Stream> = (0..fake.lanes()).map(|i| fake.stream(i)).collect();
    fake::start(&fake);
    ledger().slots = (0..SLOTS).map(|_| Slot::default()).collect();
    let (leaked0, released0) = (stats().releases_leaked, reaper::released());
    let n = streams.len();
    let mut next = 0;
    let mut deferred = 0u64;
    // A release behind a stream that never completes may be queued (so `flush()` would block).
    let mut never_queued = false;
    let mut flushers: Vec<Flusher> = Vec::new();
    for op in &case.ops {
        match *op {
            Op::Release { to, kernel } => {
                if next == SLOTS {
                    continue;
                }
                let i = next;
                next += 1;
                let to = to as usize % (n + 2);
                let after = match to {
                    t if t < n => Some(streams[t].clone()),
                    t if t == n => Some(Stream::host()),
                    _ => None,
                };
                {
                    let mut l = ledger();
                    let s = &mut l.slots[i];
                    s.armed = true;
                    if to < n {
                        if kernel {
                            fake.kernel(to);
                        }
                        let (record, fails) = fake.next_record(to);
                        *s = Slot {
                            armed: true,
                            lane: Some(to),
                            need: fake.work(to),
                            record,
                            record_fails: fails,
                            ..Slot::default()
                        };
                    }
                }
                let ((), d) = stats::measure(|| release(i, after.as_ref()));
                let l = ledger();
                let s = &l.slots[i];
                if to >= n {
                    assert!(s.dropped, "a release behind the host or no stream did not drop at once");
                    assert_eq!(d.releases_immediate, 1);
                } else if s.record_fails {
                    assert!(!s.dropped);
                    assert_eq!((d.releases_leaked, d.releases_deferred), (1, 0), "a failed record must leak");
                } else {
                    assert_eq!(d.releases_deferred, 1);
                    deferred += 1;
                    if fake.spec(to).mode == Mode::Never {
                        never_queued = true;
                    }
                }
            }
            Op::Kernel { lane } => {
                fake.kernel(lane as usize % n);
            }
            Op::Complete { lane } => fake.complete(lane as usize % n),
            Op::Sleep { us } => std::thread::sleep(Duration::from_micros((us % 64).into())),
            Op::FlushStream { lane } => {
                let lane = lane as usize % n;
                if fake.spec(lane).mode == Mode::Never {
                    continue;
                }
                reaper::flush_stream(&streams[lane]);
                check_flushed(&fake, &[lane], "flush_stream");
            }
            Op::Flush => {
                if never_queued {
                    continue;
                }
                reaper::flush();
                check_flushed(&fake, &(0..n).collect::<Vec<_>>(), "flush");
            }
            Op::SpawnFlush { lane } => {
                let lane = lane as usize % n;
                if fake.spec(lane).mode == Mode::Never || flushers.len() >= 4 {
                    continue;
                }
                let (tx, rx) = mpsc::channel();
                let s = streams[lane].clone();
                let thread = std::thread::spawn(move || {
                    reaper::flush_stream(&s);
                    let _ = tx.send(());
                });
                flushers.push(Flusher { done: rx, thread, lane });
            }
            Op::Join => join(&mut flushers),
            Op::Drain { ms } => {
                let timeout = Duration::from_millis(ms.into());
                let t0 = Instant::now();
                let d = reaper::drain(timeout);
                let took = t0.elapsed();
                assert!(took <= timeout + Duration::from_secs(5), "drain({timeout:?}) took {took:?}");
                if d.leaked > 0 {
                    assert!(took >= timeout, "drain gave up after {took:?}, before its {timeout:?}");
                }
                // What the drain left queued is leaked now: so anything not dropped may be.
                let mut l = ledger();
                for s in l.slots.iter_mut().filter(|s| s.armed) {
                    s.drained = true;
                }
                never_queued = false;
            }
        }
    }
    join(&mut flushers);
    // The input is over: streams that never completed may now, so that everything
    // queued can be flushed.
    for (i, spec) in case.specs.iter().enumerate() {
        if spec.mode == Mode::Never {
            fake.open(i);
        }
    }
    reaper::flush();
    check_flushed(&fake, &(0..n).collect::<Vec<_>>(), "the final flush");
    assert_eq!(reaper::pending(), 0, "releases left queued after flush()");
    let l = ledger();
    let kept = l.slots[..next].iter().filter(|s| !s.dropped).count() as u64;
    let dropped_deferred = l.slots[..next].iter().filter(|s| s.dropped && s.lane.is_some()).count() as u64;
    for (i, s) in l.slots[..next].iter().enumerate() {
        assert!(s.dropped || may_leak(&fake, s), "keep-alive {i} neither dropped nor leaked for a reason");
    }
    assert_eq!(stats().releases_leaked - leaked0, kept, "leaks counted != keep-alives never dropped");
    assert_eq!(reaper::released() - released0, dropped_deferred, "reaper::released() != deferred drops");
    assert!(dropped_deferred <= deferred);
}
