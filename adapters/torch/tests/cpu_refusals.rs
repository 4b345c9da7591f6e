//! Every tensor the adapter refuses gets its own error, and a refused import releases
//! the foreign owner exactly once.

mod common;

use common::{Count, HostTensor};
use handoff_runtime::dtype::DataType;
use handoff_runtime::mock::Mock;
use handoff_runtime::{Error, Export, Stream, stats};
use handoff_torch::{ImportOptions, TorchError, check, export, import, import_with};
use tch::{Device, Kind, Tensor};

fn message(e: Error) -> String {
    match e {
        Error::Adapter { adapter: "torch", message } => message,
        other => panic!("expected a torch adapter error, got {other:?}"),
    }
}

fn refused(x: &Tensor) -> (TorchError, String) {
    let typed = check(x).expect_err("check should refuse");
    let (r, delta) = stats::measure(|| export(x, &Stream::host()));
    assert_eq!(delta.exports, 0, "nothing is exported");
    let text = message(r.expect_err("export should refuse"));
    assert_eq!(text, typed.to_string());
    (typed, text)
}

#[test]
fn requires_grad_points_at_detach() {
    let x = Tensor::ones([2, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let (e, text) = refused(&x);
    assert_eq!(e, TorchError::RequiresGrad { shape: vec![2, 3] });
    assert!(text.contains("requires grad") && text.contains("detach()"), "{text}");
    let d = x.detach();
    let h = export(&d, &Stream::host()).unwrap();
    assert_eq!(h.data_ptr() as usize, x.data_ptr() as usize, "detach shares the memory");
}

#[test]
fn sparse_layouts_are_refused() {
    let dense = Tensor::eye(3, (Kind::Float, Device::Cpu));
    for (x, layout) in [
        (dense.to_sparse(None, None::<&[i64]>, None), "Sparse"),
        (dense.to_sparse_csr(None), "SparseCsr"),
        (dense.to_sparse_csc(None), "SparseCsc"),
    ] {
        let (e, text) = refused(&x);
        assert_eq!(e, TorchError::NotStrided { layout: layout.into() });
        assert!(text.contains("to_dense()"), "{text}");
    }
}

#[test]
fn unresolved_conjugate_and_negative_views_are_refused() {
    let z = Tensor::complex(
        &Tensor::ones([3], (Kind::Float, Device::Cpu)),
        &Tensor::ones([3], (Kind::Float, Device::Cpu)),
    );
    let c = z.conj();
    assert!(c.is_conj());
    let (e, text) = refused(&c);
    assert_eq!(e, TorchError::Conjugate);
    assert!(text.contains("resolve_conj()"), "{text}");
    assert!(check(&c.resolve_conj()).is_ok());

    let n = Tensor::ones([3], (Kind::Float, Device::Cpu)).internal_neg_view();
    assert!(n.is_neg());
    let (e, text) = refused(&n);
    assert_eq!(e, TorchError::Negative);
    assert!(text.contains("resolve_neg()"), "{text}");
    assert!(check(&n.resolve_neg()).is_ok());
}

#[test]
fn dtypes_without_a_dlpack_equivalent_are_refused() {
    let half_complex = Tensor::ones([2], (Kind::ComplexHalf, Device::Cpu));
    let (e, text) = refused(&half_complex);
    assert!(matches!(e, TorchError::UnsupportedDtype { ref dtype, .. } if dtype == "ComplexHalf"), "{e:?}");
    assert!(text.contains("ComplexFloat"), "{text}");

    let q = Tensor::ones([4], (Kind::Float, Device::Cpu)).quantize_per_tensor(0.5, 0, Kind::QInt8);
    let (e, text) = refused(&q);
    assert!(matches!(e, TorchError::UnsupportedDtype { ref dtype, .. } if dtype == "QInt8"), "{e:?}");
    assert!(text.contains("dequantize()"), "{text}");
}

#[test]
fn cuda_tensor_errors_are_clear_without_cuda() {
    if tch::Cuda::is_available() {
        println!("SKIPPED: CUDA is available here; this checks the CPU-only message");
        return;
    }
    let r = Tensor::f_ones([1], (Kind::Float, Device::Cuda(0)));
    assert!(r.is_err(), "no CUDA tensor can exist without CUDA");
    let e = handoff_torch::cuda::current_raw_stream(0).expect_err("no CUDA device");
    assert!(!e.to_string().is_empty());
}

fn host_tensor(dtype: DataType, dropped: &Count) -> HostTensor {
    HostTensor::zeros(dtype, &[2, 2], dropped)
}

#[test]
fn imports_of_dtypes_torch_lacks_are_refused_and_released_once() {
    for dtype in [DataType::F4E2M1FN, DataType::F6E2M3FN, DataType::F8E3M4, DataType::F8E4M3B11FNUZ] {
        let dropped = Count::default();
        let h = host_tensor(dtype, &dropped).export(&Stream::host()).unwrap();
        let text = message(import(h).expect_err("refused"));
        assert_eq!(text, TorchError::ImportDtype { dtype: handoff_runtime::dtype::name(dtype) }.to_string());
        assert_eq!(dropped.get(), 1, "{dtype:?}: released exactly once on the error path");
    }
}

#[test]
fn negative_strides_are_refused_and_released_once() {
    let dropped = Count::default();
    let mut t = host_tensor(DataType::F32, &dropped);
    t.byte_offset = 12;
    t.shape = vec![4];
    t.strides = vec![-1];
    let h = t.export(&Stream::host()).unwrap();
    let text = message(import(h).expect_err("refused"));
    assert_eq!(text, TorchError::NegativeStride { axis: 0, stride: -1 }.to_string());
    assert_eq!(dropped.get(), 1);
}

#[test]
fn read_only_handoffs_need_consent() {
    let dropped = Count::default();
    let mut t = host_tensor(DataType::I16, &dropped);
    t.read_only = true;
    let text = message(import(t.export(&Stream::host()).unwrap()).expect_err("refused"));
    assert_eq!(text, TorchError::ReadOnly.to_string());
    assert_eq!(dropped.get(), 1);

    let dropped = Count::default();
    let mut t = host_tensor(DataType::I16, &dropped);
    t.read_only = true;
    let y = import_with(t.export(&Stream::host()).unwrap(), &ImportOptions::new().read_only_ok()).unwrap();
    assert_eq!(y.size(), [2, 2]);
    drop(y);
    assert_eq!(dropped.get(), 1);
}

/// A read-only hand-off imported with consent and exported again stays read-only
/// (it used to come out writable).
#[test]
fn read_only_is_carried_through_a_torch_tensor() {
    let dropped = Count::default();
    let mut t = host_tensor(DataType::I16, &dropped);
    t.read_only = true;
    let options = ImportOptions::new().read_only_ok();
    let y = handoff_torch::TorchTensor::import_with(t.export(&Stream::host()).unwrap(), &options).unwrap();
    assert!(y.is_read_only());
    let again = y.export(&Stream::host()).unwrap();
    assert!(again.is_read_only(), "the flag is kept on the way out");
    // A consumer that did not consent is refused again.
    let text = message(import(again).expect_err("refused"));
    assert_eq!(text, TorchError::ReadOnly.to_string());
    assert_eq!(dropped.get(), 1);
}

#[test]
fn mock_memory_cannot_become_a_torch_tensor() {
    let mock = Mock::new();
    let s = mock.stream(0, "s");
    let x = mock.tensor_f32(&s, "x", &[2], &[1.0, 2.0]);
    let text = message(import(x.export(&s).unwrap()).expect_err("refused"));
    assert_eq!(text, TorchError::ImportDevice { device: handoff_runtime::Device::Mock(0) }.to_string());
}

#[test]
fn a_named_stream_of_another_device_is_refused() {
    let mock = Mock::new();
    let s = mock.stream(0, "s");
    let x = Tensor::ones([2], (Kind::Float, Device::Cpu));
    let e = handoff_torch::TorchTensor::with_stream(x.shallow_clone(), s.clone()).expect_err("refused");
    assert!(message(e).contains("is not a stream of host"));
    let dropped = Count::default();
    let h = host_tensor(DataType::F32, &dropped).export(&Stream::host()).unwrap();
    let e = import_with(h, &ImportOptions::new().stream(s)).expect_err("refused");
    assert!(message(e).contains("is not a stream of host"));
    assert_eq!(dropped.get(), 1);
}
