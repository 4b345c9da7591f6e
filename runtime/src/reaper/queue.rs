//! The releases waiting behind work on each stream, and the batches taken out of them:
//! the queue's data and the decisions made on it, with no thread, no lock and no
//! device call. The background thread, the flushes and the drain (`mod.rs`, `exit.rs`)
//! hold the reaper's lock around each call here and ask the device between calls, with
//! no lock held. Generic over the event `E` (and what a sweep asks, `P`), so that its
//! tests use plain integers.
//!
//! Releases queue in *lanes*, one per stream, oldest first: the events of a stream
//! complete in the order they were recorded, so an answer about one release covers
//! every older one of its lane. A *batch* is releases taken out of a lane and not yet
//! done; a flush that finds a lane empty still waits for the batches open in it, since
//! they were queued before the flush too. A lane goes away once it is empty and no
//! batch of it is open.

use super::KeepAlive;
use super::home::Home;
use crate::stream::{RawStream, Stream};
use std::collections::{HashMap, VecDeque};
use std::thread::ThreadId;

/// Which lane a release queues in: a stream's backend (its address) and raw handle,
/// and for a thread-relative handle (CUDA's per-thread default stream) its thread: two
/// threads' such streams are different streams, whose events must not share one lane.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) struct StreamKey {
    backend: usize,
    raw: RawStream,
    thread: Option<ThreadId>,
}

impl StreamKey {
    pub(super) fn of(stream: &Stream) -> StreamKey {
        StreamKey {
            backend: stream.backend() as *const dyn crate::stream::Backend as *const () as usize,
            raw: stream.raw(),
            thread: stream.thread(),
        }
    }
}

/// A queued release: the event recorded for it, and what to drop once it completed.
pub(super) struct Pending<E> {
    pub(super) event: E,
    /// When it was queued: later releases have larger numbers, in every lane and
    /// across a lane's removal and re-creation, so that an answer about older
    /// releases never covers newer ones.
    pub(super) seq: u64,
    pub(super) keep_alive: KeepAlive,
    /// The thread whose hand-off it was ([`super::home`]).
    pub(super) home: Option<Home>,
}

/// Names a batch: its lane, and its number (unique in the queue's life).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct BatchId {
    key: StreamKey,
    number: u64,
}

/// A batch taken out of a lane and not finished yet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct OpenBatch {
    pub(super) id: BatchId,
    /// How many releases it holds.
    pub(super) len: usize,
}

/// The releases queued behind work on one stream.
struct Lane<E> {
    /// The stream, for messages.
    stream: Stream,
    /// Oldest first: their events complete in this order.
    queued: VecDeque<Pending<E>>,
    /// Batches of this lane's releases taken out of `queued` and not finished.
    open: Vec<OpenBatch>,
}

/// Every lane, and the numbers of the next release and batch.
pub(super) struct Queue<E> {
    lanes: HashMap<StreamKey, Lane<E>>,
    /// The `seq` of the next release queued.
    next_seq: u64,
    next_batch: u64,
}

impl<E> Default for Queue<E> {
    fn default() -> Queue<E> {
        Queue { lanes: HashMap::new(), next_seq: 0, next_batch: 0 }
    }
}

/// How many of a lane's oldest releases one sweep asks about, when its newest is not
/// done yet.
pub(super) const ASKED_PER_SWEEP: usize = 16;

/// A queued release a sweep asks about: its `seq`, and what asks about its event.
pub(super) struct Asked<P> {
    pub(super) seq: u64,
    pub(super) probe: P,
}

/// What a sweep asks of one lane: its newest release first, then up to
/// [`ASKED_PER_SWEEP`] of its oldest, in order.
pub(super) struct LaneAsk<P> {
    pub(super) key: StreamKey,
    pub(super) asked: Vec<Asked<P>>,
}

/// What a sweep learned of one lane.
pub(super) struct LaneAnswer {
    pub(super) key: StreamKey,
    pub(super) answer: Answer,
}

/// What the queries of one lane's releases said.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// Its releases up to this `seq` are done (the newest asked was).
    AllUpTo(u64),
    /// Its oldest releases, each done or failed, in order, up to the first that is
    /// not done.
    Walked(Vec<Walked>),
}

/// One release of a walk through a lane's oldest: done, or its query failed (why).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Walked {
    pub(super) seq: u64,
    pub(super) failure: Option<String>,
}

impl Answer {
    /// Whether it says nothing is done or failed.
    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Answer::Walked(w) if w.is_empty())
    }

    /// Whether a query failed.
    pub(super) fn failed(&self) -> bool {
        matches!(self, Answer::Walked(w) if w.iter().any(|w| w.failure.is_some()))
    }

    /// Why the query of release `seq` failed, if it did.
    pub(super) fn failure(&self, seq: u64) -> Option<&str> {
        match self {
            Answer::AllUpTo(_) => None,
            Answer::Walked(walked) => walked.iter().find(|w| w.seq == seq)?.failure.as_deref(),
        }
    }
}

impl<P> LaneAsk<P> {
    /// Asks the lane's newest release, then (if it is not done) its oldest ones in
    /// order until one is not done, with `query`; a failed query leaks that release
    /// only, except the newest's when older ones can still be asked.
    pub(super) fn ask(&self, mut query: impl FnMut(&P) -> Result<bool, String>) -> LaneAnswer {
        let answer = match self.asked.split_first() {
            None => Answer::Walked(Vec::new()),
            Some((newest, oldest)) => match query(&newest.probe) {
                Ok(true) => Answer::AllUpTo(newest.seq),
                Err(e) if oldest.is_empty() => {
                    Answer::Walked(vec![Walked { seq: newest.seq, failure: Some(e) }])
                }
                _ => {
                    let mut walked = Vec::new();
                    for a in oldest {
                        match query(&a.probe) {
                            Ok(true) => walked.push(Walked { seq: a.seq, failure: None }),
                            Ok(false) => break,
                            Err(e) => walked.push(Walked { seq: a.seq, failure: Some(e) }),
                        }
                    }
                    Answer::Walked(walked)
                }
            },
        };
        LaneAnswer { key: self.key, answer }
    }
}

/// Releases a sweep took out of one lane, oldest first, with the answer that covers
/// them.
pub(super) struct Taken<E> {
    pub(super) batch: BatchId,
    pub(super) items: VecDeque<Pending<E>>,
    pub(super) answer: Answer,
    /// The lane's stream, for the message of a failed query (rare: formatted only
    /// then, else empty).
    pub(super) stream: String,
}

/// All that was queued in one lane, taken by a flush or a drain, oldest first.
pub(super) struct LaneBatch<E> {
    pub(super) batch: BatchId,
    pub(super) stream: Stream,
    pub(super) items: Vec<Pending<E>>,
}

/// What a flush or a drain took: its own batches, and those open before it in the same
/// lanes (taken by others: the background thread, another flush, a drain).
pub(super) struct Flushed<E> {
    pub(super) batches: Vec<LaneBatch<E>>,
    pub(super) earlier: Vec<OpenBatch>,
}

impl<E> Queue<E> {
    /// Queues a release behind `event`, in the lane of `key` (made for `stream` if
    /// there is none).
    pub(super) fn push(
        &mut self,
        key: StreamKey,
        stream: &Stream,
        event: E,
        keep_alive: KeepAlive,
        home: Option<Home>,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let lane = self.lanes.entry(key).or_insert_with(|| Lane {
            stream: stream.clone(),
            queued: VecDeque::new(),
            open: Vec::new(),
        });
        lane.queued.push_back(Pending { event, seq, keep_alive, home });
    }

    /// Whether any release is queued (not counting those taken out in batches).
    pub(super) fn has_queued(&self) -> bool {
        self.lanes.values().any(|l| !l.queued.is_empty())
    }

    /// Whether no release is queued and no batch open.
    pub(super) fn is_idle(&self) -> bool {
        self.lanes.values().all(|l| l.queued.is_empty() && l.open.is_empty())
    }

    /// What a sweep asks, for each lane with releases queued: the newest, then the
    /// oldest ones ([`LaneAsk`]), each through `probe` of its event.
    pub(super) fn asks<P>(&self, mut probe: impl FnMut(&E) -> P) -> Vec<LaneAsk<P>> {
        self.lanes
            .iter()
            .filter_map(|(key, lane)| {
                let newest = lane.queued.back()?;
                let oldest = lane.queued.iter().take(ASKED_PER_SWEEP.min(lane.queued.len() - 1));
                let asked = std::iter::once(newest)
                    .chain(oldest)
                    .map(|p| Asked { seq: p.seq, probe: probe(&p.event) })
                    .collect();
                Some(LaneAsk { key: *key, asked })
            })
            .collect()
    }

    /// Takes the releases `answer` covers out of their lane, in a batch opened for
    /// them, with as few moves as can be ([`take_oldest`], into `spare()` when it
    /// takes one); `None` when it covers none still queued (a flush may have taken them
    /// meanwhile). An answer covers the releases up to the one asked (by `seq`): a flush
    /// takes a lane's releases oldest first, so the ones left are all newer than any it
    /// took, and an answer about an event it gave back for reuse covers none.
    pub(super) fn take_answered(
        &mut self,
        answer: LaneAnswer,
        spare: impl FnOnce() -> VecDeque<Pending<E>>,
    ) -> Option<Taken<E>> {
        let lane = self.lanes.get_mut(&answer.key)?;
        let n = answered(&lane.queued, &answer.answer);
        if n == 0 {
            return None;
        }
        let items = take_oldest(&mut lane.queued, n, spare());
        let stream = if answer.answer.failed() { format!("{:?}", lane.stream) } else { String::new() };
        let batch = self.open_batch(answer.key, n);
        Some(Taken { batch, items, answer: answer.answer, stream })
    }

    /// Takes everything queued in the lanes `select` picks, a batch for each lane,
    /// and notes the batches open in them before.
    pub(super) fn take_queued(&mut self, select: impl Fn(&StreamKey) -> bool) -> Flushed<E> {
        let keys: Vec<StreamKey> = self.lanes.keys().filter(|k| select(k)).copied().collect();
        let mut flushed = Flushed { batches: Vec::new(), earlier: Vec::new() };
        for key in keys {
            let Some(lane) = self.lanes.get_mut(&key) else { continue };
            flushed.earlier.extend_from_slice(&lane.open);
            if lane.queued.is_empty() {
                continue;
            }
            let items: Vec<Pending<E>> = lane.queued.drain(..).collect();
            let stream = lane.stream.clone();
            let batch = self.open_batch(key, items.len());
            flushed.batches.push(LaneBatch { batch, stream, items });
        }
        flushed
    }

    /// Opens a batch of `len` releases taken out of the lane of `key`.
    fn open_batch(&mut self, key: StreamKey, len: usize) -> BatchId {
        self.next_batch += 1;
        let id = BatchId { key, number: self.next_batch };
        if let Some(lane) = self.lanes.get_mut(&key) {
            lane.open.push(OpenBatch { id, len });
        }
        id
    }

    /// Whether `batch` is still open (a flush waits until none it noted is).
    pub(super) fn is_open(&self, batch: BatchId) -> bool {
        self.lanes.get(&batch.key).is_some_and(|l| l.open.iter().any(|b| b.id == batch))
    }

    /// Finishes `batch` (its releases done or leaked), and removes its lane if that
    /// left it empty with no batch open.
    pub(super) fn finish(&mut self, batch: BatchId) {
        if let Some(lane) = self.lanes.get_mut(&batch.key) {
            lane.open.retain(|b| b.id != batch);
            if lane.queued.is_empty() && lane.open.is_empty() {
                self.lanes.remove(&batch.key);
            }
        }
    }
}

/// How many of a lane's oldest releases `answer` says are done or failed: those it
/// covers, in order, up to the first it does not.
fn answered<E>(queued: &VecDeque<Pending<E>>, answer: &Answer) -> usize {
    match answer {
        // `seq` grows from each release queued in a lane to the next.
        Answer::AllUpTo(seq) => queued.partition_point(|p| p.seq <= *seq),
        Answer::Walked(walked) => queued.iter().take_while(|p| walked.iter().any(|w| w.seq == p.seq)).count(),
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

/// Empty queues kept from one sweep to the next with their room, so that taking
/// releases out of their lanes ([`take_oldest`]) allocates nothing, and frees nothing
/// under the lock, once releases come at a steady rate.
pub(super) struct Spares<E>(Vec<VecDeque<Pending<E>>>);

impl<E> Default for Spares<E> {
    fn default() -> Spares<E> {
        Spares(Vec::new())
    }
}

impl<E> Spares<E> {
    /// How many it keeps: one or two lanes are busy at a time, mostly.
    const KEPT: usize = 4;

    /// An empty queue: a kept one, or a new one (which allocates nothing yet).
    pub(super) fn take(&mut self) -> VecDeque<Pending<E>> {
        self.0.pop().unwrap_or_default()
    }

    /// Keeps `queue` (emptied) for a later sweep, if there is room.
    pub(super) fn keep(&mut self, queue: VecDeque<Pending<E>>) {
        if queue.is_empty() && self.0.len() < Self::KEPT {
            self.0.push(queue);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane of stream `raw` (its stream, for messages, is the host's).
    fn key(raw: RawStream) -> StreamKey {
        StreamKey { backend: 0x1000, raw, thread: None }
    }

    /// Queues releases behind the "events" `events` (plain numbers) in the lane of `raw`.
    fn push(q: &mut Queue<u32>, raw: RawStream, events: impl IntoIterator<Item = u32>) {
        for e in events {
            q.push(key(raw), &Stream::host(), e, KeepAlive::new(()), None);
        }
    }

    /// The events of `items`, in order.
    fn events<'a>(items: impl IntoIterator<Item = &'a Pending<u32>>) -> Vec<u32> {
        items.into_iter().map(|p| p.event).collect()
    }

    /// The one lane ask of `q`'s lane `raw`.
    fn ask_of(q: &Queue<u32>, raw: RawStream) -> LaneAsk<u32> {
        q.asks(|e| *e).into_iter().find(|a| a.key == key(raw)).expect("asked")
    }

    fn done(seq: u64) -> Walked {
        Walked { seq, failure: None }
    }

    fn failed(seq: u64) -> Walked {
        Walked { seq, failure: Some("failed".into()) }
    }

    #[test]
    fn a_lane_keeps_its_releases_in_the_order_they_were_queued() {
        let mut q = Queue::default();
        push(&mut q, 1, [10, 11]);
        push(&mut q, 2, [20]);
        push(&mut q, 1, [12, 13]);
        // Asked: the newest, then the oldest in order.
        let ask = ask_of(&q, 1);
        assert_eq!(ask.asked.iter().map(|a| a.probe).collect::<Vec<_>>(), [13, 10, 11, 12]);
        assert_eq!(ask.asked.iter().map(|a| a.seq).collect::<Vec<_>>(), [4, 0, 1, 3]);
        // A lane of one release asks it once.
        assert_eq!(ask_of(&q, 2).asked.iter().map(|a| a.probe).collect::<Vec<_>>(), [20]);
        // Taken oldest first, by a sweep and by a flush.
        let taken = q.take_answered(LaneAnswer { key: key(1), answer: Answer::AllUpTo(1) }, VecDeque::new);
        assert_eq!(events(&taken.unwrap().items), [10, 11]);
        let flushed = q.take_queued(|k| *k == key(1));
        assert_eq!(flushed.batches.len(), 1);
        assert_eq!(events(&flushed.batches[0].items), [12, 13]);
    }

    #[test]
    fn a_sweep_asks_the_newest_and_at_most_its_share_of_the_oldest() {
        let mut q = Queue::default();
        push(&mut q, 1, 0..100);
        let ask = ask_of(&q, 1);
        assert_eq!(ask.asked.len(), 1 + ASKED_PER_SWEEP);
        assert_eq!(ask.asked[0].probe, 99);
        assert_eq!(ask.asked.last().map(|a| a.probe), Some(ASKED_PER_SWEEP as u32 - 1));
        // A lane with nothing queued is not asked.
        let flushed = q.take_queued(|_| true);
        assert!(q.asks(|e| *e).is_empty());
        q.finish(flushed.batches[0].batch);
    }

    #[test]
    fn an_ask_stops_at_the_newest_when_it_is_done_and_walks_the_oldest_else() {
        let mut q = Queue::default();
        push(&mut q, 1, [1, 2, 3, 4]);
        let ask = ask_of(&q, 1);
        let mut asked = Vec::new();
        // The newest done: it answers for all (seq 3), nothing else asked.
        let a = ask.ask(|e| {
            asked.push(*e);
            Ok(true)
        });
        assert_eq!((a.key, a.answer), (key(1), Answer::AllUpTo(3)));
        assert_eq!(asked, [4]);
        // The newest not done: the oldest in order, up to the first not done.
        let a = ask.ask(|e| Ok(*e <= 2));
        assert_eq!(a.answer, Answer::Walked(vec![done(0), done(1)]));
        // Failures are walked past and named; the newest's failure is not the last
        // word while older ones can be asked.
        let a = ask.ask(|e| match e {
            4 | 2 => Err("failed".into()),
            1 => Ok(true),
            _ => Ok(false),
        });
        assert_eq!(a.answer, Answer::Walked(vec![done(0), failed(1)]));
        assert!(a.answer.failed());
        assert_eq!(
            (a.answer.failure(0), a.answer.failure(1), a.answer.failure(2)),
            (None, Some("failed"), None)
        );
        // Nothing done: an answer that says nothing.
        assert!(ask.ask(|_| Ok(false)).answer.is_empty());
        // A lane of one release whose query fails: that release fails.
        let mut q = Queue::default();
        push(&mut q, 1, [7]);
        let a = ask_of(&q, 1).ask(|_| Err("failed".into()));
        assert_eq!(a.answer, Answer::Walked(vec![failed(0)]));
    }

    #[test]
    fn an_answer_covers_the_oldest_releases_it_names_and_no_newer_one() {
        let mut q = Queue::default();
        push(&mut q, 1, [3, 5, 8]);
        let queued = &q.lanes[&key(1)].queued;
        // Done up to a `seq`: every release queued up to it (all, or the older ones).
        assert_eq!(answered(queued, &Answer::AllUpTo(2)), 3);
        assert_eq!(answered(queued, &Answer::AllUpTo(9)), 3);
        assert_eq!(answered(queued, &Answer::AllUpTo(1)), 2);
        // Walked: the oldest ones named, done or failed, up to the first not named.
        assert_eq!(answered(queued, &Answer::Walked(vec![done(0), failed(1)])), 2);
        assert_eq!(answered(queued, &Answer::Walked(vec![done(0)])), 1);
        assert_eq!(answered(queued, &Answer::Walked(vec![done(0), done(2)])), 1);
        assert_eq!(answered(queued, &Answer::Walked(vec![])), 0);
        // Older releases than any queued (a flush took them): none of these.
        let mut q = Queue::default();
        push(&mut q, 1, [1, 2, 3]);
        let flushed = q.take_queued(|_| true);
        q.finish(flushed.batches[0].batch);
        push(&mut q, 1, [4, 5]);
        let queued = &q.lanes[&key(1)].queued;
        assert_eq!(answered(queued, &Answer::AllUpTo(2)), 0);
        assert_eq!(answered(queued, &Answer::Walked(vec![done(0), done(1)])), 0);
        assert!(
            q.take_answered(LaneAnswer { key: key(1), answer: Answer::AllUpTo(2) }, VecDeque::new).is_none()
        );
    }

    #[test]
    fn a_sweep_takes_what_its_answer_covers_with_the_failures_named() {
        let mut q = Queue::default();
        push(&mut q, 1, [1, 2, 3]);
        let answer = Answer::Walked(vec![done(0), failed(1)]);
        let taken = q.take_answered(LaneAnswer { key: key(1), answer }, VecDeque::new).unwrap();
        assert_eq!(events(&taken.items), [1, 2]);
        assert_eq!(taken.answer.failure(1), Some("failed"));
        assert_eq!(taken.stream, format!("{:?}", Stream::host()), "the stream is named for the message");
        let taken = q.take_answered(LaneAnswer { key: key(1), answer: Answer::AllUpTo(2) }, VecDeque::new);
        assert_eq!(taken.map(|t| (events(&t.items), t.stream)), Some((vec![3], String::new())));
        // No lane: nothing taken.
        assert!(
            q.take_answered(LaneAnswer { key: key(9), answer: Answer::AllUpTo(9) }, VecDeque::new).is_none()
        );
    }

    #[test]
    fn taking_the_oldest_releases_keeps_both_parts_in_order() {
        for len in 0..9usize {
            for n in 0..=len {
                let mut queue: VecDeque<usize> = (0..len).collect();
                let taken = take_oldest(&mut queue, n, VecDeque::with_capacity(len));
                assert_eq!(taken.into_iter().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>(), "{n} of {len}");
                assert_eq!(
                    queue.into_iter().collect::<Vec<_>>(),
                    (n..len).collect::<Vec<_>>(),
                    "{n} of {len}"
                );
            }
        }
    }

    #[test]
    fn taking_most_swaps_the_queue_with_the_spare_and_taking_few_moves_them() {
        let big = 256;
        // Most of it (6 of 8): the queue's own room goes with what is taken, and the
        // two newer ones move into the spare's room, which the queue keeps.
        let mut queue: VecDeque<u32> = VecDeque::with_capacity(8);
        queue.extend(0..8);
        let taken = take_oldest(&mut queue, 6, VecDeque::with_capacity(big));
        assert_eq!((taken.len(), queue.len()), (6, 2));
        assert!(taken.capacity() < big && queue.capacity() >= big, "swapped");
        assert_eq!(queue.iter().copied().collect::<Vec<_>>(), [6, 7]);
        // Few of it (2 of 8): those move into the spare; the queue keeps its room.
        let mut queue: VecDeque<u32> = VecDeque::with_capacity(8);
        queue.extend(0..8);
        let taken = take_oldest(&mut queue, 2, VecDeque::with_capacity(big));
        assert_eq!((taken.len(), queue.len()), (2, 6));
        assert!(taken.capacity() >= big && queue.capacity() < big, "moved");
        assert_eq!(taken.iter().copied().collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn a_flush_waits_for_the_batches_open_before_it_and_not_for_later_ones() {
        let mut q = Queue::default();
        push(&mut q, 1, [1, 2, 3]);
        push(&mut q, 2, [20]);
        // A sweep takes two of lane 1.
        let swept = q.take_answered(LaneAnswer { key: key(1), answer: Answer::AllUpTo(1) }, VecDeque::new);
        let swept = swept.unwrap().batch;
        assert!(q.is_open(swept));
        // A flush of lane 1 takes the rest and notes the sweep's batch (size 2).
        let flushed = q.take_queued(|k| *k == key(1));
        assert_eq!(flushed.earlier, [OpenBatch { id: swept, len: 2 }]);
        assert_eq!(flushed.batches.len(), 1);
        let mine = flushed.batches[0].batch;
        assert!(q.is_open(mine) && mine != swept);
        // A second flush of lane 1 finds nothing queued, and waits for both.
        let again = q.take_queued(|k| *k == key(1));
        assert!(again.batches.is_empty());
        assert_eq!(again.earlier.iter().map(|b| b.id).collect::<Vec<_>>(), [swept, mine]);
        // Lane 2 is untouched, and a flush of it waits for nothing of lane 1.
        assert!(q.take_queued(|k| *k == key(2)).earlier.is_empty());
        // Finished batches are no longer waited for.
        q.finish(swept);
        assert!(!q.is_open(swept) && q.is_open(mine));
        assert_eq!(q.take_queued(|k| *k == key(1)).earlier, [OpenBatch { id: mine, len: 1 }]);
        q.finish(mine);
        assert!(!q.is_open(mine));
        assert!(q.take_queued(|k| *k == key(1)).earlier.is_empty());
    }

    #[test]
    fn a_lane_goes_away_only_when_empty_with_no_batch_open() {
        let mut q = Queue::default();
        push(&mut q, 1, [1, 2, 3]);
        let swept = q.take_answered(LaneAnswer { key: key(1), answer: Answer::AllUpTo(0) }, VecDeque::new);
        let swept = swept.unwrap().batch;
        // Releases still queued: the lane stays when the batch finishes.
        q.finish(swept);
        assert!(q.lanes.contains_key(&key(1)));
        // Nothing queued, but a batch open: it stays until that batch finishes.
        let flushed = q.take_queued(|_| true);
        assert!(!q.has_queued() && !q.is_idle());
        assert!(q.lanes.contains_key(&key(1)));
        let (a, b) = (flushed.batches[0].batch, q.take_queued(|_| true).earlier[0].id);
        assert_eq!(a, b);
        q.finish(a);
        assert!(!q.lanes.contains_key(&key(1)));
        assert!(q.is_idle());
        // Two batches open: removed at the second's finish, not the first's.
        push(&mut q, 1, [4, 5, 6]);
        let first = q.take_answered(LaneAnswer { key: key(1), answer: Answer::AllUpTo(3) }, VecDeque::new);
        let first = first.unwrap().batch;
        let second = q.take_queued(|_| true).batches[0].batch;
        q.finish(second);
        assert!(q.lanes.contains_key(&key(1)));
        q.finish(first);
        assert!(!q.lanes.contains_key(&key(1)));
        // Finishing a batch of a lane gone does nothing.
        q.finish(first);
        assert!(q.is_idle());
    }

    #[test]
    fn seq_grows_across_lanes_and_a_lane_s_removal_and_re_creation() {
        let mut q = Queue::default();
        push(&mut q, 1, [1, 2]);
        push(&mut q, 2, [3]);
        let flushed = q.take_queued(|k| *k == key(1));
        assert_eq!(flushed.batches[0].items.iter().map(|p| p.seq).collect::<Vec<_>>(), [0, 1]);
        q.finish(flushed.batches[0].batch);
        assert!(!q.lanes.contains_key(&key(1)), "removed");
        push(&mut q, 1, [4, 5]);
        assert_eq!(q.lanes[&key(1)].queued.iter().map(|p| p.seq).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(q.lanes[&key(2)].queued.iter().map(|p| p.seq).collect::<Vec<_>>(), [2]);
        // So an answer about the removed lane's releases covers none of the new ones.
        assert_eq!(answered(&q.lanes[&key(1)].queued, &Answer::AllUpTo(1)), 0);
    }

    #[test]
    fn lanes_of_different_streams_backends_or_threads_are_apart() {
        let here = std::thread::current().id();
        let there = std::thread::spawn(|| std::thread::current().id()).join().unwrap();
        let keys = [
            StreamKey { backend: 0x1000, raw: 0, thread: None },
            StreamKey { backend: 0x1008, raw: 0, thread: None },
            StreamKey { backend: 0x1000, raw: 7, thread: None },
            StreamKey { backend: 0x1000, raw: 2, thread: Some(here) },
            StreamKey { backend: 0x1000, raw: 2, thread: Some(there) },
            StreamKey { backend: 0x1000, raw: 2, thread: None },
        ];
        let mut q = Queue::default();
        for k in keys {
            q.push(k, &Stream::host(), 0u32, KeepAlive::new(()), None);
        }
        assert_eq!(q.lanes.len(), keys.len());
        assert_eq!(StreamKey::of(&Stream::host()), StreamKey::of(&Stream::host()));
    }

    #[test]
    fn spares_keep_a_few_empty_queues() {
        let mut spares = Spares::<u32>::default();
        for _ in 0..10 {
            spares.keep(VecDeque::with_capacity(4));
        }
        assert_eq!(spares.0.len(), Spares::<u32>::KEPT);
        let mut q = Queue::default();
        push(&mut q, 1, [1]);
        let mut full = q.take_queued(|_| true);
        spares.0.clear();
        spares.keep(full.batches.remove(0).items.into_iter().collect());
        assert!(spares.0.is_empty(), "a queue still holding releases is not kept");
    }
}
