//! What storage and the example ndarray adapter do with the tensors other frameworks
//! really send: a derived type's device field checked against its storage, empty
//! tensors with a null data pointer, and compact tensors with odd size-1 strides.

use handoff::mock::{Mock, MockTensor};
use handoff::storage::{Adopt, Elements, StorageError};
use handoff::{Access, Device, DlpackExchange, Error, Export, Handoff, Stream, StreamOrdered};
use handoff_ndarray::NdTensor;
use handoff_tests::Foreign;

fn import(f: Foreign) -> Handoff {
    let (ptr, _count) = f.versioned();
    // SAFETY: `ptr` is a fresh tensor owned by this test.
    unsafe { Handoff::from_raw(ptr, &Stream::host(), Access::Read) }.unwrap()
}

fn storage_err<T>(r: handoff::Result<T>) -> StorageError {
    match r {
        Err(Error::Storage(e)) => *e,
        Err(e) => panic!("not a storage error: {e}"),
        Ok(_) => panic!("accepted"),
    }
}

#[derive(DlpackExchange)]
struct Labelled {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<i64>,
    #[dlpack(device)]
    device: Device,
}

#[derive(DlpackExchange)]
struct LabelledBuffer {
    #[dlpack(data)]
    data: Elements<f32>,
    #[dlpack(shape)]
    shape: Vec<i64>,
    #[dlpack(device)]
    device: Device,
}

#[test]
fn a_device_field_that_contradicts_the_storage_is_refused() {
    // Host memory labelled as CUDA memory.
    let t = Labelled { data: vec![1.0; 4], shape: vec![4], device: Device::Cuda(0) };
    let e = storage_err(t.describe());
    assert_eq!(
        e,
        StorageError::DeviceMismatch { field: "device", device: Device::Cuda(0), storage: Device::Host }
    );
    assert!(e.to_string().contains("cuda:0") && e.to_string().contains("host"), "{e}");
    // The same export through the protocol fails the same way (before any hand-off).
    let t = Labelled { data: vec![1.0; 4], shape: vec![4], device: Device::Cuda(0) };
    assert!(matches!(t.export(&Stream::host()), Err(Error::Storage(_))));

    // The reverse: memory of a (mock) device labelled as host memory.
    let mock = Mock::new();
    let s = mock.stream(0, "s");
    let x = mock.tensor_f32(&s, "x", &[4], &[0.0; 4]);
    let data = Elements::<f32>::adopt(x.export(&s).unwrap()).unwrap();
    let t = LabelledBuffer { data, shape: vec![4], device: Device::Host };
    assert_eq!(
        storage_err(t.describe()),
        StorageError::DeviceMismatch { field: "device", device: Device::Host, storage: Device::Mock(0) }
    );

    // Agreeing labels are fine.
    let t = Labelled { data: vec![1.0; 4], shape: vec![4], device: Device::Host };
    assert_eq!(t.describe().unwrap().device, Device::Host);
    let data = Elements::<f32>::adopt(mock.tensor_f32(&s, "y", &[4], &[0.0; 4]).export(&s).unwrap()).unwrap();
    let t = LabelledBuffer { data, shape: vec![4], device: Device::Mock(0) };
    assert_eq!(t.describe().unwrap().device, Device::Mock(0));
    assert_eq!(t.device(), Device::Mock(0));
}

/// An empty tensor as PyTorch exports it: no elements, a null data pointer.
fn empty_null(shape: &[i64], strides: &[i64]) -> Foreign {
    let mut f = Foreign::f32(shape);
    f.data = Some(0);
    f.strides = Some(strides.to_vec());
    f
}

#[test]
fn an_empty_tensor_with_null_data_adopts_into_an_empty_buffer() {
    let h = import(empty_null(&[0, 3], &[3, 1]));
    assert!(h.data().is_null());
    let b = Elements::<f32>::adopt(h).unwrap();
    assert_eq!(b.as_slice(), Some(&[][..]));
}

#[test]
fn an_empty_tensor_with_null_data_views_as_an_empty_ndarray() {
    for (shape, strides) in
        [(vec![0i64, 3], vec![3i64, 1]), (vec![0], vec![1]), (vec![4, 0, 2], vec![9, 5, 7])]
    {
        let h = import(empty_null(&shape, &strides));
        let t: NdTensor<f32> = h.import().unwrap();
        let v = t.view();
        assert_eq!(v.len(), 0);
        let dims: Vec<i64> = v.shape().iter().map(|&d| d as i64).collect();
        assert_eq!(dims, shape);
        assert_eq!(t.to_owned().len(), 0);
        // And it hands on: the view exports as an empty tensor again.
        let again = t.export(&Stream::host()).unwrap();
        assert_eq!(again.num_elements(), 0);
    }
}

#[derive(DlpackExchange)]
struct Compact {
    #[dlpack(data)]
    data: Elements<f32>,
    #[dlpack(shape)]
    shape: Vec<i64>,
}

#[test]
fn a_transposed_row_is_compact_for_a_type_without_strides() {
    // torch.ones(1, 8).t(): shape [8, 1], strides [1, 8], contiguous to PyTorch.
    let mut f = Foreign::f32(&[8, 1]);
    f.strides = Some(vec![1, 8]);
    let h = import(f);
    assert!(h.is_contiguous());
    let c: Compact = h.import().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.shape, vec![8, 1]);
    assert_eq!(c.data.as_slice().unwrap(), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    // Still refused when it really is strided.
    let mut f = Foreign::f32(&[2, 2]);
    f.strides = Some(vec![1, 2]);
    let e = storage_err(import(f).import::<Compact>());
    assert!(matches!(e, StorageError::NotCompact { ref strides, .. } if strides == &[1, 2]), "{e}");
}

#[test]
fn a_mock_tensor_with_size_one_strides_is_viewed() {
    let mock = Mock::new();
    let s = mock.stream(0, "s");
    let x = mock.tensor_f32(&s, "x", &[8, 1], &[1.0; 8]);
    let data = x.describe().unwrap().data;
    // The same memory described with the strides `t()` gives it.
    let h = Handoff::with_keep_alive(
        x,
        |_| {
            Ok(handoff::TensorDesc::new(data, Device::Mock(0), handoff::dtype::DataType::F32, &[8i64, 1][..])
                .with_strides(&[1i64, 8][..]))
        },
        &s,
        handoff::Ready::Elided,
        handoff::Release::AfterConsumer,
    )
    .unwrap();
    let y: MockTensor = h.import().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(mock.read_f32(&y), vec![1.0; 8]);
}
