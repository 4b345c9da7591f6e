//! The simulation: a virtual clock, streams as FIFO queues, events, vector clocks
//! for happens-before, and buffers with their access history.
//!
//! Times are computed when work is enqueued (a kernel starts when its stream is free,
//! the host has enqueued it and every wait before it is satisfied); effects run when
//! the virtual clock passes their completion time. Hazards are judged on
//! happens-before, not on timing, so a race is reported even when the timing hid it.

use super::hazard::{Hazard, HazardKind, OpRef};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

/// Agent 0 is the host; agent `i + 1` is stream `i`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Clock(Vec<u32>);

impl Clock {
    fn get(&self, agent: usize) -> u32 {
        self.0.get(agent).copied().unwrap_or(0)
    }
    fn set(&mut self, agent: usize, v: u32) {
        if self.0.len() <= agent {
            self.0.resize(agent + 1, 0);
        }
        self.0[agent] = v;
    }
    fn join(&mut self, other: &Clock) {
        for (i, &v) in other.0.iter().enumerate() {
            if v > self.get(i) {
                self.set(i, v);
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Access {
    op: OpRef,
    agent: usize,
    seq: u32,
    range: Range<usize>,
    write: bool,
}

impl Access {
    fn before(&self, clock: &Clock) -> bool {
        clock.get(self.agent) >= self.seq
    }
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

pub(crate) struct Storage {
    lines: Box<[Line]>,
    len: usize,
    free: bool,
    /// The stream it was freed on, in stream order (`None`: by the host).
    freed_on: Option<u64>,
}

impl Storage {
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.lines.as_ptr() as *mut u8
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `lines` holds at least `len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut u8, self.len) }
    }
}

pub(crate) struct Buffer {
    pub name: String,
    pub device: u32,
    pub storage: usize,
    history: Vec<Access>,
    released: Option<OpRef>,
}

struct StreamState {
    device: u32,
    name: String,
    tail: u64,
    clock: Clock,
    seq: u32,
}

#[derive(Default)]
struct EventState {
    recorded: Option<(u64, Clock)>,
}

/// A kernel's effect, run when the clock passes its completion.
pub type Effect = Box<dyn FnOnce(&mut KernelCtx<'_>) + Send>;

struct Scheduled {
    effect: Effect,
}

/// What a kernel's effect may touch: the bytes of the buffers of its world.
pub struct KernelCtx<'a> {
    storages: &'a mut [Storage],
    buffers: &'a [Buffer],
}

impl KernelCtx<'_> {
    /// The bytes of a buffer.
    pub fn bytes(&self, buffer: super::BufferId) -> &[u8] {
        self.storages[self.buffers[buffer.0].storage].bytes()
    }
    /// The bytes of a buffer, to write.
    pub fn bytes_mut(&mut self, buffer: super::BufferId) -> &mut [u8] {
        self.storages[self.buffers[buffer.0].storage].bytes_mut()
    }
    /// A buffer's contents as `f32`.
    pub fn read_f32(&self, buffer: super::BufferId) -> Vec<f32> {
        self.bytes(buffer).chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
    /// Writes `values` as `f32` from the buffer's start.
    pub fn write_f32(&mut self, buffer: super::BufferId, values: &[f32]) {
        let bytes = self.bytes_mut(buffer);
        for (c, v) in bytes.chunks_exact_mut(4).zip(values) {
            c.copy_from_slice(&v.to_ne_bytes());
        }
    }
}

#[derive(Default)]
pub(crate) struct Sim {
    pub now: u64,
    host_clock: Clock,
    host_seq: u32,
    streams: Vec<StreamState>,
    events: Vec<EventState>,
    pub buffers: Vec<Buffer>,
    storages: Vec<Storage>,
    due: BinaryHeap<Reverse<(u64, u64)>>,
    scheduled: std::collections::HashMap<u64, Scheduled>,
    next_op: u64,
    pub hazards: Vec<Hazard>,
    pub host_syncs: u64,
}

/// A kernel's declared accesses.
pub(crate) struct Declared {
    pub buffer: usize,
    pub range: Option<Range<usize>>,
    pub write: bool,
}

impl Sim {
    pub fn add_stream(&mut self, device: u32, name: &str) -> u64 {
        self.streams.push(StreamState {
            device,
            name: name.into(),
            tail: 0,
            clock: Clock::default(),
            seq: 0,
        });
        (self.streams.len() - 1) as u64
    }

    pub fn stream_name(&self, s: u64) -> String {
        match self.streams.get(s as usize) {
            Some(st) => format!("mock:{}/{}", st.device, st.name),
            None => format!("mock:?/{s}"),
        }
    }

    pub fn stream_device(&self, s: u64) -> Option<u32> {
        self.streams.get(s as usize).map(|st| st.device)
    }

    /// Allocates on `stream` (or from the host with `None`).
    pub fn alloc(&mut self, device: u32, name: &str, len: usize, on: Option<u64>) -> usize {
        // Reuse a freed block of the same size first, as caching allocators do: a
        // release that came too early then shows up as corrupted data. A block freed
        // in order on a stream goes back to that stream's allocations (or the host's).
        let reusable = |s: &Storage| s.free && s.len == len && (s.freed_on.is_none() || s.freed_on == on);
        let storage = match self.storages.iter().position(reusable) {
            Some(i) => {
                self.storages[i].free = false;
                self.storages[i].bytes_mut().fill(0);
                i
            }
            None => {
                let lines = vec![Line([0; 64]); len.div_ceil(64).max(1)].into_boxed_slice();
                self.storages.push(Storage { lines, len, free: false, freed_on: None });
                self.storages.len() - 1
            }
        };
        self.buffers.push(Buffer { name: name.into(), device, storage, history: Vec::new(), released: None });
        self.buffers.len() - 1
    }

    pub fn storage_ptr(&self, buffer: usize) -> *mut u8 {
        self.storages[self.buffers[buffer].storage].ptr()
    }

    pub fn storage_len(&self, buffer: usize) -> usize {
        self.storages[self.buffers[buffer].storage].len
    }

    pub fn find_buffer(&self, device: u32, addr: usize) -> Option<usize> {
        self.buffers.iter().enumerate().rev().find_map(|(i, b)| {
            let s = &self.storages[b.storage];
            let base = s.ptr() as usize;
            (b.device == device && b.released.is_none() && (base..base + s.len.max(1)).contains(&addr))
                .then_some(i)
        })
    }

    fn host_op(&mut self, name: &str) -> (OpRef, u32) {
        self.host_seq += 1;
        self.host_clock.set(0, self.host_seq);
        (OpRef { name: name.into(), on: "host".into() }, self.host_seq)
    }

    fn check(&mut self, buffer: usize, access: Access, clock: &Clock) {
        let b = &mut self.buffers[buffer];
        if let Some(rel) = &b.released {
            self.hazards.push(Hazard {
                kind: HazardKind::UseAfterRelease,
                buffer: b.name.clone(),
                first: rel.clone(),
                second: access.op,
            });
            return;
        }
        let (range, write) = (access.range.clone(), access.write);
        for a in &b.history {
            let overlaps = a.range.start < range.end && range.start < a.range.end;
            if !overlaps || a.before(clock) || (!a.write && !write) {
                continue;
            }
            let kind = if write { HazardKind::WriteRace } else { HazardKind::UnorderedRead };
            self.hazards.push(Hazard {
                kind,
                buffer: b.name.clone(),
                first: a.op.clone(),
                second: access.op.clone(),
            });
        }
        if write {
            b.history
                .retain(|a| !(a.before(clock) && range.start <= a.range.start && a.range.end <= range.end));
        }
        b.history.push(access);
    }

    pub fn launch(
        &mut self,
        stream: u64,
        name: &str,
        duration: u64,
        accesses: Vec<Declared>,
        effect: Option<Effect>,
    ) {
        let s = stream as usize;
        let agent = s + 1;
        let host_clock = self.host_clock.clone();
        let st = &mut self.streams[s];
        st.clock.join(&host_clock);
        st.seq += 1;
        let seq = st.seq;
        st.clock.set(agent, seq);
        let start = st.tail.max(self.now);
        st.tail = start + duration;
        let (done, clock) = (st.tail, st.clock.clone());
        let op = OpRef { name: name.into(), on: self.stream_name(stream) };
        for d in accesses {
            let len = self.storage_len(d.buffer);
            let range = d.range.unwrap_or(0..len);
            self.check(d.buffer, Access { op: op.clone(), agent, seq, range, write: d.write }, &clock);
        }
        if let Some(effect) = effect {
            let id = self.next_op;
            self.next_op += 1;
            self.due.push(Reverse((done, id)));
            self.scheduled.insert(id, Scheduled { effect });
        }
    }

    pub fn record(&mut self, event: u64, stream: u64) {
        let host_clock = self.host_clock.clone();
        let st = &mut self.streams[stream as usize];
        st.clock.join(&host_clock);
        let at = st.tail.max(self.now);
        self.events[event as usize].recorded = Some((at, st.clock.clone()));
    }

    pub fn wait(&mut self, stream: u64, event: u64) {
        let Some((at, clock)) = self.events[event as usize].recorded.clone() else { return };
        let st = &mut self.streams[stream as usize];
        st.tail = st.tail.max(at);
        st.clock.join(&clock);
    }

    pub fn new_event(&mut self) -> u64 {
        self.events.push(EventState::default());
        (self.events.len() - 1) as u64
    }

    pub fn query(&mut self, event: u64) -> bool {
        match self.events[event as usize].recorded.clone() {
            Some((at, clock)) if at <= self.now => {
                self.host_clock.join(&clock);
                true
            }
            Some(_) => false,
            None => true,
        }
    }

    pub fn synchronize(&mut self, event: u64) {
        self.host_syncs += 1;
        if let Some((at, clock)) = self.events[event as usize].recorded.clone() {
            self.advance_to(at);
            self.host_clock.join(&clock);
        }
    }

    pub fn advance_to(&mut self, t: u64) {
        while let Some(&Reverse((at, id))) = self.due.peek() {
            if at > t {
                break;
            }
            self.due.pop();
            self.now = self.now.max(at);
            if let Some(s) = self.scheduled.remove(&id) {
                let mut ctx = KernelCtx { storages: &mut self.storages, buffers: &self.buffers };
                (s.effect)(&mut ctx);
            }
        }
        self.now = self.now.max(t);
    }

    pub fn host_knows_all(&mut self) {
        self.host_syncs += 1;
        for st in &self.streams {
            self.host_clock.join(&st.clock);
        }
    }

    pub fn idle_time(&self) -> u64 {
        self.streams.iter().map(|s| s.tail).max().unwrap_or(0).max(self.now)
    }

    pub fn host_access(&mut self, buffer: usize, name: &str, write: bool) {
        let (op, seq) = self.host_op(name);
        let clock = self.host_clock.clone();
        let len = self.storage_len(buffer);
        self.check(buffer, Access { op, agent: 0, seq, range: 0..len, write }, &clock);
    }

    pub fn host_write(&mut self, buffer: usize, bytes: &[u8]) {
        self.host_access(buffer, "host write", true);
        let s = self.buffers[buffer].storage;
        let dst = self.storages[s].bytes_mut();
        let n = dst.len().min(bytes.len());
        dst[..n].copy_from_slice(&bytes[..n]);
    }

    pub fn host_read(&mut self, buffer: usize) -> Vec<u8> {
        self.host_access(buffer, "host read", false);
        self.storages[self.buffers[buffer].storage].bytes().to_vec()
    }

    /// Releases a buffer: by the host (`None`), or in order on a stream, as
    /// stream-ordered allocators free (`cudaFreeAsync`, PyTorch's caching allocator).
    pub fn release(&mut self, buffer: usize, on: Option<u64>) {
        let name = format!("release of `{}`", self.buffers[buffer].name);
        let (op, clock) = match on {
            Some(stream) => {
                let host_clock = self.host_clock.clone();
                let on = self.stream_name(stream);
                let st = &mut self.streams[stream as usize];
                st.clock.join(&host_clock);
                st.seq += 1;
                st.clock.set(stream as usize + 1, st.seq);
                (OpRef { name, on }, st.clock.clone())
            }
            None => (self.host_op(&name).0, self.host_clock.clone()),
        };
        let b = &mut self.buffers[buffer];
        for a in &b.history {
            if !a.before(&clock) {
                self.hazards.push(Hazard {
                    kind: HazardKind::ReleaseRace,
                    buffer: b.name.clone(),
                    first: a.op.clone(),
                    second: op.clone(),
                });
            }
        }
        b.released = Some(op);
        self.storages[b.storage].free = true;
        self.storages[b.storage].freed_on = on;
    }

    pub fn is_released(&self, buffer: usize) -> bool {
        self.buffers[buffer].released.is_some()
    }
}
