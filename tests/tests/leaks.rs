//! Leaks and counts over 10,000 mixed hand-offs: every foreign deleter
//! and every keep-alive runs exactly once, the reaper drains, and the mock device's
//! event pools stay bounded.
//!
//! One test function on purpose: `reaper::pending()` is process-wide, so the test
//! that asserts it is 0 must be the only one in its binary queueing releases.

use handoff::dtype::DataType;
use handoff::mock::{Kernel, Mock, MockTensor};
use handoff::registry::{self, Adapter, DeviceKind};
use handoff::{
    Access, Device, Export, Handoff, Ready, Release, Stream, StreamOrdered, TensorDesc, reaper, stats,
};
use handoff_ndarray::NdTensor;
use handoff_tests::{DeleterCount, Foreign};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const HANDOFFS: usize = 10_000;
/// Streams are flushed every this many hand-offs (as a long-running program's
/// steady state would be: releases complete as the device catches up).
const FLUSH_EVERY: usize = 64;

/// Counts how many times values were dropped.
#[derive(Clone, Default)]
struct Drops(Arc<AtomicUsize>);

impl Drops {
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Host f32 memory with a counted drop.
struct CountedHost {
    data: Vec<f32>,
    drops: Drops,
}

impl Drop for CountedHost {
    fn drop(&mut self) {
        self.drops.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl StreamOrdered for CountedHost {
    fn device(&self) -> Device {
        Device::Host
    }
    fn stream(&self) -> Option<Stream> {
        None
    }
}

impl Export for CountedHost {
    fn describe(&self) -> handoff::Result<TensorDesc<'_>> {
        Ok(TensorDesc::new(
            self.data.as_ptr() as *mut _,
            Device::Host,
            DataType::F32,
            vec![self.data.len() as i64],
        ))
    }
}

registry::submit! {
    Adapter::new("leaks-counted-host", "0.0.1")
        .devices(&[DeviceKind::Host])
        .dtypes(&[DataType::F32])
        .exports::<CountedHost>()
}

/// A mock tensor kept alive by a hand-off, with a counted drop.
struct CountedMock {
    tensor: MockTensor,
    drops: Drops,
}

impl Drop for CountedMock {
    fn drop(&mut self) {
        self.drops.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A tiny deterministic generator (no dependency, reproducible figures).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Tally {
    kinds: [usize; 8],
    foreign: Vec<DeleterCount>,
    mock_buffers: Vec<handoff::mock::BufferId>,
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n).map(|i| (seed % 1000) as f32 + i as f32).collect()
}

#[test]
fn ten_thousand_mixed_handoffs_release_everything_exactly_once() {
    let mock = Mock::new();
    let streams = [mock.stream(0, "a"), mock.stream(0, "b"), mock.stream(0, "c")];
    let host = Stream::host();
    let keep_alive_drops = Drops::default();
    let mut expected_keep_alive_drops = 0usize;
    let mut t = Tally::default();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let released_before = reaper::released();
    let (_, delta) = stats::measure(|| {
        for i in 0..HANDOFFS {
            let n = 1 + rng.below(16) as usize;
            let seed = rng.next();
            let kind = rng.below(8) as usize;
            t.kinds[kind] += 1;
            match kind {
                // Host memory with a counted keep-alive, to the host.
                0 => {
                    let x = CountedHost { data: values(n, seed), drops: keep_alive_drops.clone() };
                    let h = x.export(&host).unwrap();
                    assert_eq!(h.ready(), Ready::Elided);
                    let v: &[f32] =
                        // SAFETY: host f32 memory of n elements, kept alive by `h`.
                        unsafe { std::slice::from_raw_parts(h.data_ptr() as *const f32, n) };
                    assert_eq!(v, &values(n, seed)[..]);
                    expected_keep_alive_drops += 1;
                }
                // Mock, same stream (nothing ordered, released at once).
                1 | 2 => {
                    let p = &streams[rng.below(3) as usize];
                    let c = if kind == 1 { p.clone() } else { streams[rng.below(3) as usize].clone() };
                    let x = mock.tensor_f32(p, "x", &[n as i64], &values(n, seed));
                    t.mock_buffers.push(x.buffer());
                    mock.launch(p, Kernel::new("produce").nanos(rng.below(2000)).writes(x.buffer()));
                    let y: MockTensor = x.export(&c).unwrap().import().unwrap();
                    mock.launch(&c, Kernel::new("consume").nanos(rng.below(2000)).reads(y.buffer()));
                    if rng.below(2) == 0 {
                        mock.advance(rng.below(3000));
                    }
                    if kind == 1 || p == &c {
                        // A same-stream hand-off releases at once (rule 3), so the mock
                        // producer's buffer is freed on the host at this drop; the mock
                        // models that free as a host operation and reports a release race
                        // with the still-queued kernels (real allocators free in stream
                        // order). Let them finish first.
                        mock.synchronize();
                    }
                    drop(y);
                }
                // Mock through a counted keep-alive, released after the consumer.
                3 => {
                    let (p, c) = (&streams[0], &streams[1 + rng.below(2) as usize]);
                    let x = mock.tensor_f32(p, "x", &[n as i64], &values(n, seed));
                    t.mock_buffers.push(x.buffer());
                    let ready = x.ready_on(c).unwrap();
                    let k = CountedMock { tensor: x, drops: keep_alive_drops.clone() };
                    let h = Handoff::with_keep_alive(
                        k,
                        |k| k.tensor.describe(),
                        c,
                        ready,
                        Release::AfterConsumer,
                    )
                    .unwrap();
                    let y: MockTensor = h.import().unwrap();
                    mock.launch(c, Kernel::new("consume").nanos(rng.below(2000)).reads(y.buffer()));
                    drop(y);
                    expected_keep_alive_drops += 1;
                }
                // Foreign versioned / legacy, to the host or behind a mock stream.
                4 | 5 => {
                    let f = Foreign::f32(&[n as i64]);
                    let consumer = if rng.below(2) == 0 { host.clone() } else { streams[2].clone() };
                    let (h, count) = if kind == 4 {
                        let (ptr, count) = f.versioned();
                        // SAFETY: a fresh tensor owned by this test.
                        (unsafe { Handoff::from_raw(ptr, &consumer, Access::Read) }, count)
                    } else {
                        let (ptr, count) = f.legacy();
                        // SAFETY: as above.
                        (unsafe { Handoff::from_raw_legacy(ptr, &consumer, Access::Read) }, count)
                    };
                    let h = h.unwrap();
                    assert_eq!(h.num_elements(), n);
                    assert_eq!(count.get(), 0);
                    // Half of them leave as raw pointers, as to a C consumer.
                    if rng.below(2) == 0 {
                        let raw = h.into_raw();
                        // SAFETY: owned after into_raw; called once.
                        unsafe { ((*raw).deleter.unwrap())(raw) };
                    } else {
                        drop(h);
                    }
                    t.foreign.push(count);
                }
                // Through the registry by name: counted host -> ndarray, ndarray -> ndarray.
                6 => {
                    let x = CountedHost { data: values(n, seed), drops: keep_alive_drops.clone() };
                    let v = registry::convert(Box::new(x), "leaks-counted-host", "ndarray", &host).unwrap();
                    let v = v.downcast::<NdTensor<f32>>().unwrap();
                    assert_eq!(v.view().iter().copied().collect::<Vec<_>>(), values(n, seed));
                    expected_keep_alive_drops += 1;
                }
                _ => {
                    let a = ndarray::ArrayD::from_shape_vec(vec![n], values(n, seed)).unwrap();
                    let v = registry::convert(Box::new(NdTensor::from(a)), "ndarray", "ndarray", &host)
                        .unwrap()
                        .downcast::<NdTensor<f32>>()
                        .unwrap();
                    assert_eq!(v.view()[[n - 1]], values(n, seed)[n - 1]);
                }
            }
            if (i + 1) % FLUSH_EVERY == 0 {
                mock.run_until_idle();
                for s in &streams {
                    reaper::flush_stream(s);
                }
            }
        }
        mock.run_until_idle();
        for s in &streams {
            reaper::flush_stream(s);
        }
    });
    println!(
        "leaks: {HANDOFFS} hand-offs by kind (host, mock same, mock cross, mock counted, versioned, legacy, \
         registry counted->ndarray, ndarray->ndarray): {:?}; {delta}; pool created {} events",
        t.kinds,
        mock.event_pool_created(0)
    );
    assert!(t.kinds.iter().all(|&k| k > 1000), "every kind exercised: {:?}", t.kinds);
    assert_eq!(reaper::pending(), 0, "releases left queued after flushing");
    assert_eq!(keep_alive_drops.get(), expected_keep_alive_drops, "every keep-alive dropped exactly once");
    for (i, c) in t.foreign.iter().enumerate() {
        assert_eq!(c.get(), 1, "foreign tensor {i}: deleter ran {} times", c.get());
    }
    mock.synchronize();
    for b in &t.mock_buffers {
        assert!(mock.is_released(*b), "mock buffer {b:?} never released");
    }
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    // Deferred releases went through the reaper, each exactly once.
    assert_eq!(reaper::released() - released_before, delta.releases_deferred);
    // The only host waits are the flushes' (at most one per stream per flush).
    let flushes = (HANDOFFS / FLUSH_EVERY + 1) as u64;
    assert!(delta.host_syncs <= flushes * streams.len() as u64, "{} host syncs", delta.host_syncs);
    // Each hand-off holds at most two pooled events (its wait, its release) until
    // its stream is flushed: the pool is bounded by what is in flight, not by the
    // number of hand-offs.
    let created = mock.event_pool_created(0);
    assert!(created <= 2 * FLUSH_EVERY as u64 + 8, "event pool grew to {created} events");
    assert_eq!(delta.events_created, created);
}
