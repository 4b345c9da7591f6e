//! The protocol, proved on the mock device: readiness, elision, ordering under random
//! interleavings, stream-ordered release, and fault injection showing the hazard
//! checker catches a missing wait and an early release.

use handoff::mock::{HazardKind, Kernel, Mock, MockTensor};
use handoff::{
    Device, Export, Handoff, Ready, Release, Result, Stream, StreamOrdered, TensorDesc, reaper, stats,
};
use handoff_tests::eventually;
use proptest::prelude::*;

fn producer_writes(mock: &Mock, stream: &Stream, t: &MockTensor, value: f32, micros: u64) {
    let id = t.buffer();
    let n = t.num_elements();
    mock.launch(
        stream,
        Kernel::new("producer").micros(micros).writes(id).run(move |k| k.write_f32(id, &vec![value; n])),
    );
}

/// A consumer kernel that copies `src` into a fresh buffer `dst` (so the test can read
/// what the consumer saw, after a sync).
fn consumer_copies(mock: &Mock, stream: &Stream, src: &MockTensor, micros: u64) -> MockTensor {
    let dst = mock.tensor_f32(stream, "seen", src.shape(), &vec![-1.0; src.num_elements()]);
    let (s, d) = (src.buffer(), dst.buffer());
    mock.launch(
        stream,
        Kernel::new("consumer").micros(micros).reads(s).writes(d).run(move |k| {
            let v = k.read_f32(s);
            k.write_f32(d, &v);
        }),
    );
    dst
}

#[test]
fn cross_stream_export_is_one_record_one_wait_and_no_host_sync() {
    let mock = Mock::new();
    let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
    let x = mock.tensor_f32(&a, "x", &[4], &[0.0; 4]);
    producer_writes(&mock, &a, &x, 3.0, 50);
    let (h, d) = stats::measure(|| x.export(&b).unwrap());
    assert_eq!(h.ready(), Ready::Waited);
    assert_eq!((d.events_recorded, d.waits_enqueued, d.waits_elided, d.host_syncs), (1, 1, 0, 0));
    assert_eq!((d.exports, d.copies), (1, 0));
    assert_eq!(mock.host_syncs(), 0);
    let y: MockTensor = h.import().unwrap();
    let seen = consumer_copies(&mock, &b, &y, 1);
    mock.synchronize();
    assert_eq!(mock.read_f32(&seen), vec![3.0; 4]);
    assert!(mock.hazards().is_empty(), "{:#?}", mock.hazards());
}

#[test]
fn same_stream_export_enqueues_nothing() {
    let mock = Mock::new();
    let a = mock.stream(0, "a");
    let x = mock.tensor_f32(&a, "x", &[4], &[1.0; 4]);
    producer_writes(&mock, &a, &x, 2.0, 50);
    let (h, d) = stats::measure(|| x.export(&a).unwrap());
    assert_eq!(h.ready(), Ready::Elided);
    assert_eq!((d.events_recorded, d.waits_enqueued, d.waits_elided, d.host_syncs), (0, 0, 1, 0));
    // Same-stream release needs no event either: the memory goes back in order on
    // the stream, after the producer's kernel that is still queued.
    let y: MockTensor = h.import().unwrap();
    let ((), d) = stats::measure(|| drop(y));
    assert_eq!((d.events_recorded, d.releases_immediate, d.releases_deferred), (0, 1, 0));
    mock.synchronize();
    assert!(mock.hazards().is_empty(), "{:#?}", mock.hazards());
}

#[test]
fn host_consumer_waits_on_the_host_and_says_so() {
    let mock = Mock::new();
    let a = mock.stream(0, "a");
    let x = mock.tensor_f32(&a, "x", &[2], &[0.0; 2]);
    producer_writes(&mock, &a, &x, 5.0, 50);
    let (h, d) = stats::measure(|| x.export(&Stream::host()).unwrap());
    assert_eq!(h.ready(), Ready::HostSynced);
    assert_eq!(d.host_syncs, 1);
    assert!(mock.now() >= 50_000, "the host waited for the producer");
}

#[test]
fn cross_device_hand_off_is_refused() {
    let mock = Mock::new();
    let (a, b) = (mock.stream(0, "a"), mock.stream(1, "b"));
    let x = mock.tensor_f32(&a, "x", &[2], &[0.0; 2]);
    let e = x.export(&b).unwrap_err();
    assert!(matches!(e, handoff::Error::CrossDevice { from: Device::Mock(0), to: Device::Mock(1) }), "{e}");
}

#[test]
fn the_event_pool_reaches_a_steady_state() {
    let mock = Mock::new();
    let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
    for _ in 0..10 {
        let x = mock.tensor_f32(&a, "x", &[1], &[0.0]);
        drop(x.export(&b).unwrap());
    }
    mock.run_until_idle();
    reaper::flush_stream(&b);
    let before = mock.event_pool_created(0);
    let (_, d) = stats::measure(|| {
        for _ in 0..1000 {
            let x = mock.tensor_f32(&a, "x", &[1], &[0.0]);
            let y: MockTensor = x.export(&b).unwrap().import().unwrap();
            drop(y);
            mock.run_until_idle();
            reaper::flush_stream(&b);
        }
    });
    assert_eq!(d.events_recorded, 2000);
    assert!(mock.event_pool_created(0) - before <= 2, "pool grew by {}", mock.event_pool_created(0) - before);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the durations, the enqueue order of unrelated work and where the host
    /// lets time pass, the consumer sees the producer's last write and no hazard is
    /// reported.
    #[test]
    fn the_consumer_sees_the_producers_write(
        writes in prop::collection::vec((1u64..200, 0u64..100), 1..4),
        consumer_busy in prop::collection::vec(1u64..200, 0..3),
        consumer_micros in 1u64..100,
        advance_before_export in 0u64..300,
        advance_after_export in 0u64..300,
    ) {
        let mock = Mock::new();
        let (a, b) = (mock.stream(0, "producer"), mock.stream(0, "consumer"));
        let x = mock.tensor_f32(&a, "x", &[8], &[0.0; 8]);
        let other = mock.tensor_f32(&b, "other", &[8], &[0.0; 8]);
        for (i, &(micros, gap)) in writes.iter().enumerate() {
            producer_writes(&mock, &a, &x, i as f32 + 1.0, micros);
            mock.advance(gap * 1_000);
        }
        for &m in &consumer_busy {
            mock.launch(&b, Kernel::new("unrelated").micros(m).writes(other.buffer()));
        }
        mock.advance(advance_before_export * 1_000);
        let y: MockTensor = x.export(&b).unwrap().import().unwrap();
        mock.advance(advance_after_export * 1_000);
        let seen = consumer_copies(&mock, &b, &y, consumer_micros);
        mock.synchronize();
        prop_assert_eq!(mock.read_f32(&seen), vec![writes.len() as f32; 8]);
        prop_assert!(mock.hazards().is_empty(), "{:#?}", mock.hazards());
    }
}

#[test]
fn release_waits_for_the_consumers_last_kernel_and_never_blocks_the_dropper() {
    let mock = Mock::new();
    let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
    let x = mock.tensor_f32(&a, "x", &[4], &[0.0; 4]);
    let id = x.buffer();
    producer_writes(&mock, &a, &x, 1.0, 10);
    let y: MockTensor = x.export(&b).unwrap().import().unwrap();
    let _seen = consumer_copies(&mock, &b, &y, 100);
    let now = mock.now();
    let ((), d) = stats::measure(|| drop(y));
    assert_eq!((d.host_syncs, d.releases_deferred, d.events_recorded), (0, 1, 1));
    assert_eq!(mock.now(), now, "the drop moved no virtual time: no host wait");
    assert_eq!(mock.host_syncs(), 0);
    // The consumer's kernel is still queued: the memory must stay.
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(!mock.is_released(id), "released while the consumer's kernel was queued");
    mock.advance(50_000);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(!mock.is_released(id), "released halfway through the consumer's kernel");
    mock.run_until_idle();
    assert!(eventually(|| mock.is_released(id)), "the reaper never released the memory");
    assert_eq!(mock.host_syncs(), 0, "the reaper released by polling, not by waiting");
    assert!(mock.hazards().is_empty(), "{:#?}", mock.hazards());
}

/// Fault injection: an adapter whose `ready_on` forgets the wait.
struct NoWait(MockTensor);
impl StreamOrdered for NoWait {
    fn device(&self) -> Device {
        self.0.device()
    }
    fn stream(&self) -> Option<Stream> {
        StreamOrdered::stream(&self.0)
    }
    fn ready_on(&self, _: &Stream) -> Result<Ready> {
        Ok(Ready::Elided)
    }
}
impl Export for NoWait {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        self.0.describe()
    }
}

/// Fault injection: an adapter that gives its memory back as soon as the consumer drops.
struct EarlyRelease(MockTensor);
impl StreamOrdered for EarlyRelease {
    fn device(&self) -> Device {
        self.0.device()
    }
    fn stream(&self) -> Option<Stream> {
        StreamOrdered::stream(&self.0)
    }
}
impl Export for EarlyRelease {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        self.0.describe()
    }
    fn export(self, consumer: &Stream) -> Result<Handoff> {
        let ready = self.ready_on(consumer)?;
        Handoff::with_keep_alive(self, |v| v.describe(), consumer, ready, Release::Immediately)
    }
}

#[test]
fn the_checker_catches_a_missing_wait() {
    let scenario = |faulty: bool| {
        let mock = Mock::new();
        let (a, b) = (mock.stream(0, "producer"), mock.stream(0, "consumer"));
        let x = mock.tensor_f32(&a, "x", &[4], &[0.0; 4]);
        producer_writes(&mock, &a, &x, 7.0, 100);
        let h = if faulty { NoWait(x).export(&b) } else { x.export(&b) }.unwrap();
        let y: MockTensor = h.import().unwrap();
        let seen = consumer_copies(&mock, &b, &y, 1);
        mock.synchronize();
        (mock.hazards(), mock.read_f32(&seen))
    };
    let (hazards, seen) = scenario(false);
    assert!(hazards.is_empty(), "{hazards:#?}");
    assert_eq!(seen, vec![7.0; 4]);

    let (hazards, seen) = scenario(true);
    assert_eq!(seen, vec![0.0; 4], "without the wait the consumer read stale data");
    let h = hazards.iter().find(|h| h.kind == HazardKind::UnorderedRead).expect("missing wait not reported");
    assert_eq!((h.first.name.as_str(), h.second.name.as_str()), ("producer", "consumer"));
    assert!(h.to_string().contains("mock:0/consumer"), "{h}");
}

#[test]
fn the_checker_catches_an_early_release() {
    let scenario = |faulty: bool| {
        let mock = Mock::new();
        let (a, b) = (mock.stream(0, "producer"), mock.stream(0, "consumer"));
        let x = mock.tensor_f32(&a, "x", &[4], &[0.0; 4]);
        let id = x.buffer();
        producer_writes(&mock, &a, &x, 7.0, 1);
        let h = if faulty { EarlyRelease(x).export(&b) } else { x.export(&b) }.unwrap();
        let y: MockTensor = h.import().unwrap();
        let seen = consumer_copies(&mock, &b, &y, 100);
        mock.advance(5_000); // the producer is done, the consumer's kernel is not
        drop(y);
        // Allocator churn: the next same-size allocation gets the freed block if any.
        let churn = mock.tensor_f32(&a, "churn", &[4], &[9.0; 4]);
        mock.run_until_idle();
        assert!(eventually(|| mock.is_released(id)));
        mock.synchronize();
        (mock.hazards(), mock.read_f32(&seen), churn)
    };
    let (hazards, seen, _churn) = scenario(false);
    assert!(hazards.is_empty(), "{hazards:#?}");
    assert_eq!(seen, vec![7.0; 4]);

    let (hazards, seen, _churn) = scenario(true);
    assert_eq!(seen, vec![9.0; 4], "the freed block was reused under the consumer's kernel");
    let h = hazards
        .iter()
        .find(|h| h.kind == HazardKind::ReleaseRace && h.first.name == "consumer")
        .expect("early release under the consumer's kernel not reported");
    assert!(h.second.name.starts_with("release of `x`"), "{h}");
}

/// A tensor allocated on `a` and moved to `b` (`set_stream`) is still freed in order
/// on `a`, where its allocator enqueues the free. Exported to `b`, its memory must
/// not go back when the consumer on `b` lets go while its read is still queued.
#[test]
fn memory_goes_back_on_the_allocation_stream_after_set_stream() {
    let mock = Mock::new();
    let (a, b) = (mock.stream(0, "a"), mock.stream(0, "b"));
    let mut x = mock.tensor_f32(&a, "x", &[4], &[1.0; 4]);
    mock.synchronize();
    x.set_stream(b.clone());
    let h = x.export(&b).unwrap();
    let y: MockTensor = h.import().unwrap();
    let id = y.buffer();
    mock.launch(&b, Kernel::new("read on b").micros(100).reads(id));
    drop(y);
    reaper::flush_stream(&b); // this test's stream only: other tests' mocks run beside it
    mock.synchronize();
    assert!(mock.hazards().is_empty(), "{:#?}", mock.hazards());
}
