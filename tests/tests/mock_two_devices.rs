//! The ordering rules with two simulated devices: hand-offs on each device are
//! ordered and released on that device's streams with that device's events; a
//! hand-off across devices is refused, and so is waiting on another device's event.

use handoff::mock::{Kernel, Mock, MockTensor};
use handoff::{Device, Error, Export, Ready, reaper, stats};
use handoff_tests::eventually;

#[test]
fn each_device_orders_its_own_hand_offs_with_its_own_events() {
    let mock = Mock::new();
    let streams =
        [(mock.stream(0, "a0"), mock.stream(0, "b0")), (mock.stream(1, "a1"), mock.stream(1, "b1"))];
    let created = [mock.event_pool_created(0), mock.event_pool_created(1)];
    let mut ids = Vec::new();
    let mut seen = Vec::new();
    for (device, (a, b)) in streams.iter().enumerate() {
        let x = mock.tensor_f32(a, "x", &[4], &[0.0; 4]);
        let id = x.buffer();
        ids.push(id);
        let value = 10.0 + device as f32;
        mock.launch(
            a,
            Kernel::new("producer").micros(100).writes(id).run(move |k| k.write_f32(id, &[value; 4])),
        );
        let (h, d) = stats::measure(|| x.export(b).unwrap());
        assert_eq!(h.device(), Device::Mock(device as u32));
        assert_eq!((h.ready(), d.waits_enqueued, d.host_syncs), (Ready::Waited, 1, 0));
        let y: MockTensor = h.import().unwrap();
        let out = mock.tensor_f32(b, "out", &[4], &[-1.0; 4]);
        let (s, o) = (y.buffer(), out.buffer());
        mock.launch(
            b,
            Kernel::new("consumer").micros(50).reads(s).writes(o).run(move |k| {
                let v = k.read_f32(s);
                k.write_f32(o, &v);
            }),
        );
        drop(y); // released after the consumer's kernel, on this device's stream
        seen.push(out);
    }
    // Each device's events came from its own pool.
    assert!(mock.event_pool_created(0) > created[0]);
    assert!(mock.event_pool_created(1) > created[1]);
    assert!(!mock.is_released(ids[0]) && !mock.is_released(ids[1]));
    mock.run_until_idle();
    assert!(eventually(|| mock.is_released(ids[0]) && mock.is_released(ids[1])));
    mock.synchronize();
    assert_eq!(mock.read_f32(&seen[0]), vec![10.0; 4]);
    assert_eq!(mock.read_f32(&seen[1]), vec![11.0; 4]);
    assert!(mock.hazards().is_empty(), "{:#?}", mock.hazards());
    reaper::flush_stream(&streams[0].1);
    reaper::flush_stream(&streams[1].1);
}

#[test]
fn a_hand_off_across_devices_is_refused_before_anything_is_enqueued() {
    let mock = Mock::new();
    let (a0, b1) = (mock.stream(0, "a0"), mock.stream(1, "b1"));
    let x = mock.tensor_f32(&a0, "x", &[2], &[1.0, 2.0]);
    let (r, d) = stats::measure(|| x.export(&b1));
    match r {
        Err(Error::CrossDevice { from: Device::Mock(0), to: Device::Mock(1) }) => {}
        other => panic!("expected a cross-device refusal, got {other:?}"),
    }
    assert_eq!((d.events_recorded, d.waits_enqueued, d.host_syncs, d.copies), (0, 0, 0, 0));
}

#[test]
fn an_event_of_one_device_is_never_waited_on_another() {
    let mock = Mock::new();
    let (a0, b1) = (mock.stream(0, "a0"), mock.stream(1, "b1"));
    let event = a0.record().unwrap();
    assert_eq!(event.device(), Device::Mock(0));
    let e = b1.wait(&event).unwrap_err();
    assert!(matches!(e, Error::CrossDevice { from: Device::Mock(0), to: Device::Mock(1) }), "{e}");
    // The same event is fine on a stream of its own device.
    mock.stream(0, "b0").wait(&event).unwrap();
}
