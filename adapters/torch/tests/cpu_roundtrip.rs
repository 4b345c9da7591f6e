//! CPU round trips: torch -> Handoff -> torch, and between torch and a host tensor
//! type, for every dtype and strided layout; zero-copy, writes seen both ways, the
//! foreign owner released exactly once.

mod common;

use common::{Count, HostTensor};
use handoff_runtime::dtype::DataType;
use handoff_runtime::{Export, Handoff, Ready, Stream, stats};
use handoff_torch::{TorchTensor, export, import};
use tch::{Device, Kind, Tensor};

fn host() -> Stream {
    Stream::host()
}

/// Every PyTorch kind tch can name, with its DLPack dtype.
const KINDS: &[(Kind, DataType)] = &[
    (Kind::Bool, DataType::BOOL),
    (Kind::Uint8, DataType::U8),
    (Kind::Int8, DataType::I8),
    (Kind::Int16, DataType::I16),
    (Kind::Int, DataType::I32),
    (Kind::Int64, DataType::I64),
    (Kind::Half, DataType::F16),
    (Kind::BFloat16, DataType::BF16),
    (Kind::Float, DataType::F32),
    (Kind::Double, DataType::F64),
    (Kind::ComplexFloat, DataType::C64),
    (Kind::ComplexDouble, DataType::C128),
    (Kind::Float8e5m2, DataType::F8E5M2),
    (Kind::Float8e4m3fn, DataType::F8E4M3FN),
    (Kind::Float8e5m2fnuz, DataType::F8E5M2FNUZ),
    (Kind::Float8e4m3fnuz, DataType::F8E4M3FNUZ),
];

fn sample(kind: Kind, shape: &[i64]) -> Tensor {
    let n: i64 = shape.iter().product();
    let base = Tensor::arange(n, (Kind::Float, Device::Cpu)).remainder(7.0);
    let t = match kind {
        Kind::Bool => base.remainder(2.0).ne(0.0),
        Kind::ComplexFloat | Kind::ComplexDouble => Tensor::complex(&base, &(base.neg())).to_kind(kind),
        k => base.to_kind(k),
    };
    t.reshape(shape)
}

/// Values compared in a type every kind converts to.
fn widen(t: &Tensor) -> Tensor {
    match t.kind() {
        Kind::ComplexFloat | Kind::ComplexDouble => t.to_kind(Kind::ComplexDouble),
        _ => t.to_kind(Kind::Double),
    }
}

/// The layouts of the brief, from one base tensor.
fn layouts(base: &Tensor) -> Vec<(&'static str, Tensor)> {
    vec![
        ("contiguous", base.shallow_clone()),
        ("transposed", base.tr()),
        ("narrowed with offset", base.narrow(1, 1, 2)),
        ("stepped slice", base.slice(1, 1, None, 2)),
        ("row with offset", base.get(2)),
        ("expanded (stride 0)", base.get(1).unsqueeze(0).expand([3, 4], false)),
        ("zero-size", base.narrow(0, 1, 0)),
        ("0-d", base.get(1).get(2)),
    ]
}

#[test]
fn every_kind_and_layout_round_trips_zero_copy() {
    for &(kind, dtype) in KINDS {
        let base = sample(kind, &[3, 4]);
        for (layout, x) in layouts(&base) {
            let what = format!("{kind:?} {layout}");
            let (h, delta) = stats::measure(|| export(&x, &host()).unwrap());
            assert_eq!((delta.host_syncs, delta.waits_enqueued), (0, 0), "{what}");
            assert_eq!(h.ready(), Ready::Elided, "{what}");
            assert_eq!(h.dtype(), dtype, "{what}");
            assert_eq!(h.shape(), &x.size()[..], "{what}");
            assert_eq!(h.strides(), &x.stride()[..], "{what}");
            if x.numel() > 0 {
                assert_eq!(h.data_ptr() as usize, x.data_ptr() as usize, "{what}");
            }
            assert!(!h.is_copied(), "{what}");
            let y = import(h).unwrap();
            assert_eq!(y.kind(), kind, "{what}");
            assert_eq!(y.size(), x.size(), "{what}");
            assert_eq!(y.stride(), x.stride(), "{what}");
            if x.numel() > 0 {
                assert_eq!(y.data_ptr(), x.data_ptr(), "{what}: the same memory comes back");
            }
            assert!(widen(&y).equal(&widen(&x)), "{what}: values");
        }
    }
}

#[test]
fn a_3d_permutation_keeps_its_strides() {
    let x = Tensor::arange(24, (Kind::Float, Device::Cpu)).reshape([2, 3, 4]).permute([2, 0, 1]);
    let h = export(&x, &host()).unwrap();
    assert_eq!(h.strides(), &[1, 12, 4]);
    assert!(!h.is_contiguous());
    let y = import(h).unwrap();
    assert_eq!(y.stride(), [1, 12, 4]);
    assert!(y.equal(&x));
}

#[test]
fn writes_are_seen_through_both_sides() {
    let x = Tensor::zeros([4, 4], (Kind::Float, Device::Cpu));
    let y = import(export(&x.tr(), &host()).unwrap()).unwrap();
    let _ = y.get(0).fill_(3.0); // column 0 of x
    assert_eq!(x.double_value(&[2, 0]), 3.0);
    let _ = x.get(1).fill_(5.0); // column 1 of y
    assert_eq!(y.double_value(&[3, 1]), 5.0);
}

#[test]
fn the_torch_tensor_outlives_its_python_owner_while_viewed() {
    let x = Tensor::arange(1000, (Kind::Int64, Device::Cpu));
    let ptr = x.data_ptr();
    let y = import(export(&x, &host()).unwrap()).unwrap();
    drop(x);
    // The hand-off keeps a reference: the memory is still x's.
    assert_eq!(y.data_ptr(), ptr);
    assert_eq!(y.int64_value(&[999]), 999);
}

#[test]
fn host_tensor_to_torch_views_its_memory_and_releases_it_once() {
    let dropped = Count::default();
    let mut t = HostTensor::zeros(DataType::F32, &[2, 3], &dropped);
    for (i, v) in [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().enumerate() {
        t.bytes_mut(24)[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
    }
    let ptr = t.first() as usize;
    let y = import(t.export(&host()).unwrap()).unwrap();
    assert_eq!(y.data_ptr() as usize, ptr);
    assert_eq!(y.double_value(&[1, 2]), 6.0);
    let _ = y.get(0).fill_(9.0);
    // Views and clones of the import share the one release.
    let column = y.narrow(1, 2, 1);
    let alias = y.shallow_clone();
    drop(y);
    assert_eq!(dropped.get(), 0);
    drop(alias);
    assert_eq!(dropped.get(), 0);
    assert_eq!(column.double_value(&[0, 0]), 9.0);
    drop(column);
    assert_eq!(dropped.get(), 1, "the foreign owner is released exactly once, after the last view");
}

#[test]
fn every_dlpack_dtype_torch_has_imports_from_a_host_tensor() {
    // Includes the unsigned kinds and f8e8m0fnu, which tch has no `Kind` for.
    let dtypes = [
        DataType::BOOL,
        DataType::U8,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::F16,
        DataType::BF16,
        DataType::F32,
        DataType::F64,
        DataType::C64,
        DataType::C128,
        DataType::F8E5M2,
        DataType::F8E4M3FN,
        DataType::F8E5M2FNUZ,
        DataType::F8E4M3FNUZ,
        DataType::F8E8M0FNU,
    ];
    for dtype in dtypes {
        let dropped = Count::default();
        let mut t = HostTensor::zeros(dtype, &[2, 2], &dropped);
        let size = dtype.element_size();
        t.bytes_mut(4 * size)[size] = 1; // element 1, lowest byte
        let ptr = t.first() as usize;
        let y = via_import(t.export(&host()).unwrap());
        assert_eq!(y.data_ptr() as usize, ptr, "{dtype:?}");
        assert_eq!(y.size(), [2, 2], "{dtype:?}");
        // Back out of torch: the same dtype and memory.
        let h = export(&y, &host()).unwrap();
        assert_eq!(h.dtype(), dtype);
        assert_eq!(h.data_ptr() as usize, ptr);
        let back: HostTensor = h.import().unwrap();
        assert_eq!(back.bytes(4 * size)[size], 1, "{dtype:?}");
        drop((y, back));
        assert_eq!(dropped.get(), 1, "{dtype:?}");
    }
}

/// Imports through the `Import` impl of `TorchTensor`.
fn via_import(h: Handoff) -> Tensor {
    let t: TorchTensor = h.import().unwrap();
    assert!(handoff_runtime::StreamOrdered::stream(&t).is_none(), "host memory has no stream");
    t.into_tensor()
}

#[test]
fn host_tensor_with_strides_and_offset_imports_as_a_view() {
    let dropped = Count::default();
    let mut t = HostTensor::zeros(DataType::I32, &[4, 4], &dropped);
    for i in 0..16i32 {
        t.bytes_mut(64)[i as usize * 4..i as usize * 4 + 4].copy_from_slice(&i.to_ne_bytes());
    }
    // The transposed lower-right 2x2 block: offset 10 elements, strides [1, 4].
    t.byte_offset = 40;
    t.shape = vec![2, 2];
    t.strides = vec![1, 4];
    let y = import(t.export(&host()).unwrap()).unwrap();
    assert_eq!(y.stride(), [1, 4]);
    let values: Vec<i64> = (0..4).map(|i| y.int64_value(&[i / 2, i % 2])).collect();
    assert_eq!(values, [10, 14, 11, 15]);
    drop(y);
    assert_eq!(dropped.get(), 1);
}

#[test]
fn torch_to_host_tensor_and_back() {
    let x = Tensor::from_slice(&[1.5f64, 2.5, 3.5]);
    let mut h: HostTensor =
        TorchTensor::new(x.shallow_clone()).unwrap().export(&host()).unwrap().import().unwrap();
    assert_eq!(h.first() as usize, x.data_ptr() as usize);
    h.bytes_mut(24)[0..8].copy_from_slice(&7.0f64.to_ne_bytes());
    assert_eq!(x.double_value(&[0]), 7.0);
    let y = import(h.export(&host()).unwrap()).unwrap();
    assert_eq!(y.data_ptr(), x.data_ptr());
    assert!(y.equal(&Tensor::from_slice(&[7.0f64, 2.5, 3.5])));
}

#[test]
fn a_round_trip_counts_one_export_and_no_sync() {
    let x = Tensor::ones([8], (Kind::Float, Device::Cpu));
    let (y, delta) = stats::measure(|| import(export(&x, &host()).unwrap()).unwrap());
    assert_eq!(delta.exports, 1);
    assert!(delta.imports >= 1);
    assert_eq!((delta.host_syncs, delta.copies, delta.waits_enqueued), (0, 0, 0));
    assert_eq!(y.data_ptr(), x.data_ptr());
}

#[test]
fn init_reports_the_cuda_libraries() {
    // On this CPU machine libtorch_cuda.so cannot load (no cuBLAS); everything else works.
    let loaded = handoff_torch::init();
    if !loaded {
        assert!(handoff_torch::cuda_load_error().is_some());
        assert!(!tch::Cuda::is_available());
    }
    println!("libtorch_cuda loaded: {loaded}; shim CUDA: {}", handoff_torch::shim_has_cuda());
}
