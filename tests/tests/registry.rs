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
        .dtypes(dtype::ALL)
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
        matches!(&err, RegistryError::UnknownAdapter { name, known } if name == "pytorch" && known.contains("ndarray")),
        "{err}"
    );

    let mock = handoff::mock::Mock::new();
    let s = mock.stream(0, "s");
    let x = mock.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
    let (err, delta) = stats::measure(|| registry::convert(Box::new(x), "mock", "ndarray", &s).unwrap_err());
    assert!(
        matches!(err, RegistryError::UnsupportedDevice { adapter: "ndarray", device: Device::Mock(0), .. }),
        "{err}"
    );
    assert!(err.to_string().contains("takes: host"), "{err}");
    assert_eq!(delta.exports, 0, "refused before any export");

    let i = Frame { data: Elements::from(vec![1i32, 2]), shape: vec![2] };
    let err = registry::convert(Box::new(i), "test-frame-i32", "ndarray", &Stream::host()).unwrap_err();
    assert!(
        matches!(&err, RegistryError::UnsupportedDtype { adapter: "ndarray", dtype, .. } if dtype == "i32"),
        "{err}"
    );

    let err = registry::convert(Box::new(array()), "test-frame-i32", "ndarray", &Stream::host()).unwrap_err();
    assert!(matches!(err, RegistryError::WrongType { adapter: "test-frame-i32", .. }), "{err}");
    let err = registry::convert(Box::new(array()), "ndarray", "test-frame-i32", &Stream::host()).unwrap_err();
    assert!(matches!(err, RegistryError::CannotImport { adapter: "test-frame-i32" }), "{err}");
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
