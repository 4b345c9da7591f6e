//! The registry: the third-party `ndarray` adapter (its own crate, one `submit!`)
//! is found and used without any change to handoff, next to the mock adapter and a
//! derived type this test registers itself.

use handoff::dtype::{self, DataType};
use handoff::registry::{self, Adapter, DeviceKind, RegistryError};
use handoff::storage::Elements;
use handoff::{Device, DlpackExchange, Stream, stats};
use handoff_ndarray::NdTensor;
use ndarray::ArrayD;

/// A user type, registered by this test crate.
#[derive(DlpackExchange)]
struct Frame<T: dtype::Element> {
    #[dlpack(data)]
    data: Elements<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

registry::submit! {
    Adapter::new("test-frame", "0.0.1")
        .devices(&[DeviceKind::Host])
        .dtypes(&[DataType::F32])
        .exports::<Frame<f32>>()
        .imports::<Frame<f32>>()
}

registry::submit! {
    Adapter::new("test-frame-i32", "0.0.1")
        .devices(&[DeviceKind::Host])
        .dtypes(&[DataType::I32]) // what `Frame<i32>` exports: i32 alone
        .exports::<Frame<i32>>()
}

// Two adapters with one name (as when two versions of one adapter crate are linked).
registry::submit! {
    Adapter::new("test-twice", "0.0.1")
        .devices(&[DeviceKind::Host])
        .dtypes(&[DataType::F32])
        .exports::<Frame<f32>>()
        .imports::<Frame<f32>>()
}

registry::submit! {
    Adapter::new("test-twice", "0.0.2")
        .devices(&[DeviceKind::Host])
        .dtypes(&[DataType::I32])
        .exports::<Frame<i32>>()
}

fn array() -> NdTensor<f32> {
    NdTensor::from(ArrayD::from_shape_vec(vec![2, 3], (0..6).map(|i| i as f32).collect()).unwrap())
}

#[test]
fn the_third_party_adapter_is_listed_with_its_capabilities() {
    let names: Vec<&str> = registry::list().iter().map(|a| a.name).collect();
    for n in ["mock", "ndarray", "test-frame"] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    let nd = registry::find("ndarray").unwrap();
    assert_eq!(
        (nd.capability(), nd.devices, nd.dtypes),
        ("import, export", &[DeviceKind::Host][..], &[DataType::F32][..])
    );
    assert!(nd.supports_device(Device::Host) && !nd.supports_device(Device::Cuda(0)));
}

#[test]
fn ndarray_round_trips_through_the_registry_without_a_copy() {
    let a = array();
    let ptr = a.view().as_ptr();
    let (v, delta) =
        stats::measure(|| registry::convert(Box::new(a), "ndarray", "ndarray", &Stream::host()).unwrap());
    let v = v.downcast::<NdTensor<f32>>().unwrap();
    assert_eq!(v.view().as_ptr(), ptr, "the view is of the producer's memory");
    assert_eq!(v.view()[[1, 2]], 5.0);
    assert_eq!((delta.copies, delta.host_syncs, delta.exports), (0, 0, 1));
}

#[test]
fn a_derived_type_converts_to_ndarray_and_back() {
    let f = Frame { data: Elements::from(vec![1.0f32, 2.0, 3.0, 4.0]), shape: vec![2, 2] };
    let v = registry::convert(Box::new(f), "test-frame", "ndarray", &Stream::host()).unwrap();
    let v = v.downcast::<NdTensor<f32>>().unwrap();
    assert_eq!(v.view().shape(), &[2, 2]);
    assert_eq!(v.view()[[1, 0]], 3.0);

    let back = registry::convert(Box::new(array()), "ndarray", "test-frame", &Stream::host()).unwrap();
    let back = back.downcast::<Frame<f32>>().unwrap();
    assert_eq!(back.shape, vec![2, 3]);
    assert_eq!(back.data.as_slice().unwrap(), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn unknown_names_and_unsupported_pairs_are_clear_errors() {
    let err = registry::convert(Box::new(array()), "ndarray", "pytorch", &Stream::host()).unwrap_err();
    assert!(
        matches!(&err.error, RegistryError::UnknownAdapter { name, known } if name == "pytorch" && known.contains("ndarray")),
        "{err}"
    );

    let mock = handoff::mock::Mock::new();
    let s = mock.stream(0, "s");
    let x = mock.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
    let (err, delta) = stats::measure(|| registry::convert(Box::new(x), "mock", "ndarray", &s).unwrap_err());
    assert!(
        matches!(
            err.error,
            RegistryError::UnsupportedDevice { adapter: "ndarray", device: Device::Mock(0), .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("takes: host"), "{err}");
    assert_eq!(delta.exports, 0, "refused before any export");

    let i = Frame { data: Elements::from(vec![1i32, 2]), shape: vec![2] };
    let err = registry::convert(Box::new(i), "test-frame-i32", "ndarray", &Stream::host()).unwrap_err();
    assert!(
        matches!(&err.error, RegistryError::UnsupportedDtype { adapter: "ndarray", dtype, .. } if dtype == "i32"),
        "{err}"
    );

    let err = registry::convert(Box::new(array()), "test-frame-i32", "ndarray", &Stream::host()).unwrap_err();
    assert!(matches!(err.error, RegistryError::WrongType { adapter: "test-frame-i32", .. }), "{err}");
    let err = registry::convert(Box::new(array()), "ndarray", "test-frame-i32", &Stream::host()).unwrap_err();
    assert!(matches!(err.error, RegistryError::CannotImport { adapter: "test-frame-i32" }), "{err}");
}

#[test]
fn doctor_lists_the_adapters_and_never_fails() {
    let report = handoff::doctor::report();
    assert!(report.contains("ndarray 0.1.0: import, export; devices: host; dtypes: f32"), "{report}");
    assert!(report.contains("mock"), "{report}");
    for subject in ["libtorch", "PJRT plugins", "CUDA devices"] {
        assert!(report.contains(subject), "{subject} missing:\n{report}");
    }
}

#[test]
fn two_adapters_with_one_name_are_refused() {
    let err = registry::find("test-twice").map(|a| a.version).unwrap_err();
    assert!(
        matches!(&err, RegistryError::Ambiguous { name, versions, .. }
            if name == "test-twice" && versions == &["0.0.1", "0.0.2"]),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("test-twice 0.0.1 exporting `registry::Frame<f32>`"), "{msg}");
    assert!(msg.contains("test-twice 0.0.2 exporting `registry::Frame<i32>` and importing nothing"), "{msg}");

    // Both directions of `convert` refuse it, and give the value back.
    let a = array();
    let ptr = a.view().as_ptr();
    let err = registry::convert(Box::new(a), "ndarray", "test-twice", &Stream::host()).unwrap_err();
    assert!(matches!(&err.error, RegistryError::Ambiguous { name, .. } if name == "test-twice"), "{err}");
    let a = err.into_value().unwrap().downcast::<NdTensor<f32>>().unwrap();
    assert_eq!(a.view().as_ptr(), ptr);
    let f = Frame { data: Elements::from(vec![1.0f32]), shape: vec![1] };
    let err = registry::convert(Box::new(f), "test-twice", "ndarray", &Stream::host()).unwrap_err();
    assert!(matches!(err.error, RegistryError::Ambiguous { .. }), "{err}");

    // `handoff doctor` lists both, and warns with the registry's refusal.
    let report = handoff::doctor::report();
    assert!(report.contains("  test-twice 0.0.1: import, export;"), "{report}");
    assert!(report.contains("  test-twice 0.0.2: export;"), "{report}");
    assert!(report.contains("warning: 2 adapters are registered as `test-twice`"), "{report}");
}

#[test]
fn export_only_adapters_advertise_what_they_export() {
    let report = handoff::doctor::report();
    assert!(report.contains("test-frame-i32 0.0.1: export; devices: host; dtypes: i32\n"), "{report}");
}

/// A refused conversion gives the caller's value back, untouched (here a mock
/// tensor that ndarray refuses for its device): nothing was exported, nothing released.
#[test]
fn a_refused_value_is_given_back() {
    let mock = handoff::mock::Mock::new();
    let s = mock.stream(0, "s");
    let x = mock.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
    let buffer = x.buffer();
    let (err, delta) = stats::measure(|| registry::convert(Box::new(x), "mock", "ndarray", &s).unwrap_err());
    assert!(matches!(err.error, RegistryError::UnsupportedDevice { adapter: "ndarray", .. }), "{err}");
    assert_eq!(delta.exports, 0);
    handoff::reaper::flush_stream(&s);
    mock.synchronize();
    assert!(!mock.is_released(buffer), "the caller's tensor was dropped by a refused convert");
    let x = err.into_value().expect("given back").downcast::<handoff::mock::MockTensor>().unwrap();
    assert_eq!(mock.read_f32(&x), [1.0, 2.0]);
    drop(x);
    mock.synchronize();
    assert!(mock.is_released(buffer));

    // A wrong type comes back as it went.
    let err = registry::convert(Box::new(String::from("pixels")), "ndarray", "ndarray", &Stream::host())
        .unwrap_err();
    assert!(matches!(err.error, RegistryError::WrongType { adapter: "ndarray", .. }), "{err}");
    assert_eq!(*err.into_value().unwrap().downcast::<String>().unwrap(), "pixels");
}

/// One element of any dtype in host memory.
struct AnyHost {
    bytes: Box<[u64; 4]>,
    dtype: DataType,
}

impl handoff::StreamOrdered for AnyHost {
    fn device(&self) -> Device {
        Device::Host
    }
    fn stream(&self) -> Option<Stream> {
        None
    }
}

impl handoff::Export for AnyHost {
    fn describe(&self) -> handoff::Result<handoff::TensorDesc<'_>> {
        let data = self.bytes.as_ptr() as *mut std::ffi::c_void;
        Ok(handoff::TensorDesc::new(data, Device::Host, self.dtype, &[1i64][..]))
    }
}

/// One element of any dtype in mock memory.
struct AnyMock {
    tensor: handoff::mock::MockTensor,
    dtype: DataType,
}

impl handoff::StreamOrdered for AnyMock {
    fn device(&self) -> Device {
        handoff::StreamOrdered::device(&self.tensor)
    }
    fn stream(&self) -> Option<Stream> {
        Some(self.tensor.stream().clone())
    }
}

impl handoff::Export for AnyMock {
    fn describe(&self) -> handoff::Result<handoff::TensorDesc<'_>> {
        let data = self.tensor.data_ptr().cast();
        Ok(handoff::TensorDesc::new(
            data,
            handoff::StreamOrdered::device(&self.tensor),
            self.dtype,
            &[1i64][..],
        ))
    }
}

#[test]
fn every_adapter_imports_exactly_the_dtypes_it_advertises() {
    use handoff::Export;
    let mock = handoff::mock::Mock::new();
    let ms = mock.stream(0, "s");
    let mut wrong = Vec::new();
    for a in registry::list() {
        let Some(entry) = a.import else { continue };
        if (entry.context_id)() != std::any::TypeId::of::<Stream>() {
            continue;
        }
        for &kind in a.devices {
            for &dtype in dtype::ALL {
                let (h, stream) = match kind {
                    DeviceKind::Host => {
                        let v = AnyHost { bytes: Box::new([0; 4]), dtype };
                        (v.export(&Stream::host()).unwrap(), Stream::host())
                    }
                    DeviceKind::Mock => {
                        let tensor = mock.tensor_f32(&ms, "x", &[4], &[0.0; 4]);
                        (AnyMock { tensor, dtype }.export(&ms).unwrap(), ms.clone())
                    }
                    _ => continue,
                };
                // The adapter's own entry point, not `Adapter::import`, which checks the
                // advertised dtypes first.
                let imports = (entry.import)(h, &stream).is_ok();
                if imports != a.supports_dtype(dtype) {
                    wrong.push(format!(
                        "{} {} on {kind}: {} advertised, {} imported",
                        a.name,
                        a.version,
                        dtype::name(dtype),
                        if imports { "is" } else { "is not" }
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "advertised dtypes differ from what the adapters import:\n{}",
        wrong.join("\n")
    );
}
