//! Hand-offs made while the consumer stream captures a graph, on the mock device
//! (its capture keeps the bookkeeping only; kernels still run at once): the ordering
//! wait is enqueued as in an eager run, and the release waits for the graph, not an
//! event: nothing is queued to the reaper (whose event query a capture forbids), and
//! the producer's memory is freed only once the graph is dropped.

use handoff::mock::{Mock, MockTensor};
use handoff::{Export, Ready, graph, reaper, stats};
use std::time::{Duration, Instant};

fn eventually(check: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// One hand-off from `producer` to `consumer`, the import dropped at once; the
/// producer's buffer and what the hand-off counted.
fn hand_off(
    mock: &Mock,
    producer: &handoff::Stream,
    consumer: &handoff::Stream,
) -> (handoff::mock::BufferId, stats::Stats) {
    let x = mock.tensor_f32(producer, "x", &[4], &[1.0, 2.0, 3.0, 4.0]);
    let buffer = x.buffer();
    let ((), delta) = stats::measure(|| {
        let h = x.export(consumer).unwrap();
        assert_eq!(h.ready(), Ready::Waited);
        let y: MockTensor = h.import().unwrap();
        drop(y);
    });
    (buffer, delta)
}

#[test]
fn a_release_during_a_capture_waits_for_the_graph_not_an_event() {
    let mock = Mock::new();
    let (producer, consumer) = (mock.stream(0, "producer"), mock.stream(0, "consumer"));

    // Control, no capture: the release is deferred behind an event on the consumer.
    let (eager, delta) = hand_off(&mock, &producer, &consumer);
    assert_eq!((delta.waits_enqueued, delta.releases_deferred, delta.releases_with_graph), (1, 1, 0));
    mock.run_until_idle();
    assert!(eventually(|| mock.is_released(eager)), "the eager hand-off's memory was never freed");

    // Captured: the same wait, and the release kept with the graph.
    mock.begin_capture(&consumer);
    let pending = reaper::pending();
    let (captured, delta) = hand_off(&mock, &producer, &consumer);
    assert_eq!((delta.waits_enqueued, delta.releases_deferred, delta.releases_with_graph), (1, 0, 1));
    assert_eq!(delta.host_syncs, 0);
    assert_eq!(reaper::pending(), pending, "a release during a capture reached the reaper");
    let graph = mock.end_capture(&consumer);
    assert_eq!(graph.kept(), 1);

    // While the graph lives, its memory stays, whatever the device and the reaper do.
    mock.run_until_idle();
    reaper::flush();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!mock.is_released(captured), "memory a graph uses was freed while the graph lives");

    drop(graph);
    assert!(
        eventually(|| mock.is_released(captured)),
        "the graph's memory was never freed after it was dropped"
    );
    assert!(mock.hazards().is_empty(), "{:#?}", mock.hazards());
}

#[test]
fn a_stream_that_does_not_capture_is_unaffected_by_another_that_does() {
    let mock = Mock::new();
    let (producer, consumer, other) =
        (mock.stream(0, "producer"), mock.stream(0, "consumer"), mock.stream(0, "other"));
    mock.begin_capture(&other);
    let (buffer, delta) = hand_off(&mock, &producer, &consumer);
    assert_eq!((delta.releases_deferred, delta.releases_with_graph), (1, 0));
    let graph = mock.end_capture(&other);
    assert_eq!(graph.kept(), 0);
    mock.run_until_idle();
    assert!(eventually(|| mock.is_released(buffer)));
}

#[test]
fn memory_kept_with_a_graph_is_pending_until_the_graph_is_dropped() {
    let mock = Mock::new();
    let s = mock.stream(0, "s");
    let e = graph::keep(&s, vec![0u8; 16]).unwrap_err().to_string();
    assert!(e.contains("not capturing"), "{e}");
    mock.begin_capture(&s);
    let before = graph::pending();
    graph::keep(&s, vec![0u8; 16]).unwrap();
    assert!(graph::pending() > before, "a kept value is not counted as pending");
    let g = mock.end_capture(&s);
    assert_eq!(g.kept(), 1);
    drop(g);
    assert!(graph::wait_released(Duration::from_secs(5)), "{} still pending", graph::pending());
}
