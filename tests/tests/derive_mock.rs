//! Derived types on mock streams: handed to a consumer on another stream they are
//! ordered (no hazard, one wait); a stream field that names the wrong stream is
//! caught by the hazard checker.

use handoff::mock::{BufferId, HazardKind, Kernel, Mock, MockTensor};
use handoff::storage::{Adopt, Elements};
use handoff::{DlpackExchange, Export, Stream, stats, transfer};

#[derive(DlpackExchange)]
struct Frame {
    #[dlpack(data)]
    data: Elements<f32>,
    #[dlpack(shape)]
    shape: Vec<i64>,
    #[dlpack(stream)]
    stream: Stream,
}

/// A frame in mock memory whose fill kernel is queued on `producer`, claiming its
/// pending writes are on `claimed`.
fn frame(mock: &Mock, producer: &Stream, claimed: &Stream) -> (Frame, BufferId) {
    let x = mock.tensor_f32(producer, "frame", &[4], &[0.0; 4]);
    let id = x.buffer();
    let data = Elements::<f32>::adopt(x.export(producer).unwrap()).unwrap();
    mock.launch(producer, Kernel::new("fill").micros(50).writes(id).run(move |k| k.write_f32(id, &[1.0; 4])));
    (Frame { data, shape: vec![4], stream: claimed.clone() }, id)
}

#[test]
fn derived_type_handed_to_another_stream_has_no_hazard() {
    let mock = Mock::new();
    let (producer, consumer) = (mock.stream(0, "producer"), mock.stream(0, "consumer"));
    let (f, id) = frame(&mock, &producer, &producer);
    let (y, delta) = stats::measure(|| transfer::<MockTensor, _, _>(f, &consumer).unwrap());
    assert_eq!(y.buffer(), id, "the consumer views the producer's memory, no copy");
    assert_eq!((delta.waits_enqueued, delta.host_syncs, delta.copies), (1, 0, 0));
    mock.launch(&consumer, Kernel::new("use").micros(5).reads(y.buffer()));
    mock.run_until_idle();
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
    assert_eq!(mock.read_f32(&y), vec![1.0; 4]);
}

#[test]
fn derived_type_imports_from_mock_and_hands_on() {
    let mock = Mock::new();
    let (a, b, c) = (mock.stream(0, "a"), mock.stream(0, "b"), mock.stream(0, "c"));
    let x = mock.tensor_f32(&a, "x", &[2, 2], &[0.0; 4]);
    let id = x.buffer();
    mock.launch(&a, Kernel::new("fill").micros(20).writes(id).run(move |k| k.write_f32(id, &[2.0; 4])));
    let f: Frame = transfer(x, &b).unwrap();
    assert_eq!((f.shape.as_slice(), &f.stream), (&[2, 2][..], &b));
    assert!(f.data.is_adopted());
    let y: MockTensor = transfer(f, &c).unwrap();
    mock.launch(&c, Kernel::new("use").reads(y.buffer()));
    mock.run_until_idle();
    assert!(mock.hazards().is_empty(), "{:?}", mock.hazards());
}

#[test]
fn wrong_stream_field_is_caught_by_the_hazard_checker() {
    let mock = Mock::new();
    let (producer, consumer, other) =
        (mock.stream(0, "producer"), mock.stream(0, "consumer"), mock.stream(0, "other"));
    // The fill is queued on `producer`, but the frame says its writes are on `other`.
    let (f, _) = frame(&mock, &producer, &other);
    let y: MockTensor = transfer(f, &consumer).unwrap();
    mock.launch(&consumer, Kernel::new("use").micros(5).reads(y.buffer()));
    mock.run_until_idle();
    let hazards = mock.hazards();
    assert!(
        hazards.iter().any(|h| h.kind == HazardKind::UnorderedRead && h.buffer == "frame"),
        "expected an unordered read of `frame`, got {hazards:?}"
    );
}
