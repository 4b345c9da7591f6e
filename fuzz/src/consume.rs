//! Target `consume`: foreign DLPack tensors, with a counting or a NULL deleter, taken
//! in and then *read* by the consumers that read a validated tensor:
//! `storage::Elements::<T>::adopt` + `as_slice` (`T` = u8, u16, i32, f32, u64) and
//! the ndarray adapter's view (`NdTensor<f32>::view`), on the host stream or behind
//! a fake device stream (so the release goes through the reaper).
//!
//! Half the inputs are honest producers ([`honest`]): any dtype, 0–4 dimensions of
//! 0–5, compact, null or arbitrary (negative included) strides, data and byte offset
//! placed so that the whole extent lies in the allocation, a NULL data pointer for
//! some empty tensors. Those must be accepted (but for write access to a read-only
//! or overlapping tensor), and every element a consumer exposes is read and compared
//! with the producer's bytes: ASan checks that no read leaves the allocation. The
//! other half are [`crate::Desc`]'s arbitrary descriptors (checked by the
//! `import_raw` oracle first), read only where the harness computed that the extent
//! lies in the allocation (DLPack carries no size, see the crate docs).
//!
//! Oracle per consumer: `Elements::<T>::adopt` is refused exactly when `T`'s width is
//! neither 8 bits nor the dtype's (`ElementSize`) or the extent reaches before the
//! first element (`NegativeStrides`); else it keeps the pointer, device, read-only
//! flag and the byte extent, and `as_slice` is `None` exactly off the host or when
//! misaligned, and otherwise has the extent's elements, equal to the producer's
//! bytes. `NdTensor<f32>` imports exactly host f32 tensors whose strides are not
//! negative (or that are empty) and whose non-zero dimensions multiply to at most
//! `isize::MAX` (what ndarray can index), and its view has the hand-off's shape and strides
//! and the producer's values at every index. Afterwards the foreign deleter ran
//! exactly once — not before the consumer stream's queued work completed — or, for a
//! NULL deleter, never (the harness then frees as the producer).

use crate::fake::{Fake, Faults, Mode, Spec};
use crate::{Built, Data, Desc, byte_at, compact, extent};
use arbitrary::{Arbitrary, Unstructured};
use handoff::dtype::{DataType, Element};
use handoff::ffi::{DLDevice, DLPackVersion};
use handoff::storage::{Adopt, Elements, Storage, StorageError};
use handoff::{Access, Device, Error, Handoff, Stream, ValidationError, reaper};
use handoff_ndarray::NdTensor;
use ndarray::Dimension;

const DTYPES: &[DataType] = &[
    DataType::U8,
    DataType::BOOL,
    DataType::I16,
    DataType::U16,
    DataType::I32,
    DataType::F32,
    DataType::F64,
    DataType::U64,
    DataType::C64,
    DataType::C128,
    DataType::F8E4M3FN,
    DataType::F6E2M3FN,
    DataType::F4E2M1FN,
];

/// The consumers.
#[derive(Debug, Clone, Copy)]
enum Consumer {
    U8,
    U16,
    I32,
    F32,
    U64,
    Nd,
    /// `handoff_torch::import_with` (CPU), with `--features torch` only.
    #[cfg_attr(not(feature = "torch"), allow(dead_code))]
    Torch,
}

impl Consumer {
    fn dtype(self) -> DataType {
        match self {
            Consumer::U8 => DataType::U8,
            Consumer::U16 => DataType::U16,
            Consumer::I32 => DataType::I32,
            Consumer::F32 | Consumer::Nd => DataType::F32,
            Consumer::U64 => DataType::U64,
            Consumer::Torch => DataType::F64,
        }
    }
}

/// An honest producer: a valid host tensor of `dtype` whose whole extent lies in its
/// allocation (arbitrary strides, negative ones included, with room before the first
/// element for them).
fn honest(u: &mut Unstructured<'_>, dtype: DataType) -> arbitrary::Result<Desc> {
    let legacy = u.ratio(1, 4)?;
    let minor = u.int_in_range(0..=3)?;
    let ndim = u.int_in_range(0..=4usize)?;
    let shape: Vec<i64> = (0..ndim).map(|_| u.int_in_range(0..=5)).collect::<arbitrary::Result<_>>()?;
    let strides = match u.int_in_range(0..=3)? {
        0 if legacy || minor < 2 => None,
        0 | 1 => compact(&shape),
        _ => Some((0..ndim).map(|_| u.int_in_range(-7..=7)).collect::<arbitrary::Result<Vec<i64>>>()?),
    };
    let bits = u32::from(dtype.bits);
    let align = handoff::dtype::alignment(dtype);
    let (lo, hi) = extent(&shape, strides.as_deref().unwrap_or(&compact(&shape).unwrap_or_default()), bits)
        .unwrap_or((0, 0));
    let empty = shape.contains(&0);
    // Bytes before the first element: what negative strides reach, and a little more.
    let before = (-lo) as usize;
    let before = before.div_ceil(align) * align + align * u.int_in_range(0..=2usize)?;
    let data_off = align * u.int_in_range(0..=3usize)?;
    let (data, byte_offset) = if empty && u.ratio(1, 3)? {
        // PyTorch exports every empty tensor with a NULL data pointer.
        (Data::Null, 0)
    } else {
        (Data::Into(data_off), before as u64)
    };
    let alloc_len = data_off + before + hi as usize + u.int_in_range(0..=7usize)?;
    let flags = *u.choose(&[0u64, 0, 1, 2])?;
    Ok(Desc {
        legacy,
        version: DLPackVersion { major: 1, minor },
        flags,
        device: DLDevice::CPU,
        dtype,
        ndim: ndim as i32,
        shape,
        null_shape: ndim == 0 && u.ratio(1, 4)?,
        strides,
        byte_offset,
        data,
        alloc_len,
        access: if u.ratio(1, 4)? { Access::Write } else { Access::Read },
        null_deleter: u.ratio(1, 3)?,
    })
}

/// Where a hand-off's extent lies in the producer's allocation, when it does:
/// `(first, lo, hi)`, the first element's offset in the allocation and the extent's
/// bytes relative to it.
fn inside(h: &Handoff, b: &Built) -> Option<(usize, i128, i128)> {
    let first = h.data_ptr() as i128 - b.alloc.0 as i128;
    let (lo, hi) = extent(h.shape(), h.strides(), u32::from(h.dtype().bits))?;
    (first + lo >= 0 && first + hi <= b.alloc.1 as i128).then_some((first as usize, lo, hi))
}

fn elements<T: Element + Send>(h: Handoff, at: Option<(usize, i128, i128)>) -> Option<Box<dyn Send>> {
    let (dtype, shape, strides) = (h.dtype(), h.shape().to_vec(), h.strides().to_vec());
    let (ptr, device, read_only) = (h.data_ptr(), h.device(), h.is_read_only());
    let size = std::mem::size_of::<T>();
    let r = Elements::<T>::adopt(h);
    let ext = extent(&shape, &strides, u32::from(dtype.bits));
    let e = match r {
        Err(Error::Storage(e)) => {
            match *e {
                StorageError::ElementSize { bits, elem_bits, .. } => {
                    assert!(elem_bits != 8 && elem_bits != usize::from(bits) && bits == dtype.bits)
                }
                StorageError::NegativeStrides { .. } => assert!(ext.is_some_and(|(lo, _)| lo < 0)),
                other => panic!("Elements::adopt refused with {other}"),
            }
            return None;
        }
        Err(e) => panic!("Elements::adopt refused with a non-storage error: {e}"),
        Ok(e) => e,
    };
    assert!(
        size == 1 || size * 8 == usize::from(dtype.bits),
        "adopted {} into {size}-byte elements",
        dtype.bits
    );
    let (lo, hi) = ext.unwrap_or((0, 0));
    assert!(lo >= 0, "adopted an extent reaching {lo} bytes before the first element");
    assert!(e.is_adopted());
    assert_eq!((e.data_ptr() as *mut u8, e.device(), e.read_only()), (ptr, device, read_only));
    assert_eq!(e.byte_len() as i128, hi, "adopted byte length != the extent");
    let aligned = (ptr as usize).is_multiple_of(std::mem::align_of::<T>());
    let honest = at.is_some() || hi == 0;
    if honest {
        match e.as_slice() {
            None => assert!(!device.is_host() || !aligned, "as_slice refused aligned host memory"),
            Some(s) => {
                assert!(device.is_host() && aligned);
                assert_eq!(s.len(), hi as usize / size);
                // SAFETY: the slice's own bytes (any element type is plain bytes).
                let bytes =
                    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) };
                if let Some((first, _, _)) = at {
                    for (k, &x) in bytes.iter().enumerate() {
                        assert_eq!(x, byte_at(first + k), "as_slice byte {k} differs from the producer's");
                    }
                }
            }
        }
    }
    Some(Box::new(e))
}

fn ndarray_view(h: Handoff, at: Option<(usize, i128, i128)>) -> Option<Box<dyn Send>> {
    let (shape, strides) = (h.shape().to_vec(), h.strides().to_vec());
    // ndarray indexes at most isize::MAX positions, counting the non-zero dimensions
    // even of an empty array (`ArrayView::from_shape_ptr`'s contract).
    let nonzero = shape.iter().filter(|&&d| d != 0).try_fold(1usize, |a, &d| a.checked_mul(d as usize));
    let indexable = nonzero.is_some_and(|n| n <= isize::MAX as usize);
    let ok = h.device() == Device::Host
        && h.dtype() == DataType::F32
        && indexable
        && (shape.contains(&0) || strides.iter().all(|&s| s >= 0));
    let r: handoff::Result<NdTensor<f32>> = h.import();
    let nd = match r {
        Err(e) => {
            assert!(!ok, "NdTensor refused a host f32 tensor it can view: {e}");
            return None;
        }
        Ok(nd) => nd,
    };
    assert!(ok, "NdTensor took a tensor it cannot view");
    assert!(nd.is_view());
    // Reads every element: only where the extent is in the allocation, and not for a
    // huge count over zero strides.
    if (at.is_some() || shape.contains(&0)) && nd.view().len() <= 4096 {
        let v = nd.view();
        let want: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        assert_eq!(v.shape(), &want[..]);
        if !shape.contains(&0) {
            let want: Vec<isize> = strides.iter().map(|&s| s as isize).collect();
            assert_eq!(v.strides(), &want[..]);
        }
        let first = at.map_or(0, |a| a.0);
        for (idx, &x) in v.indexed_iter() {
            let off: i128 = idx.slice().iter().zip(&strides).map(|(&i, &s)| i as i128 * s as i128).sum();
            let k = first + off as usize * 4;
            let want = f32::from_le_bytes([byte_at(k), byte_at(k + 1), byte_at(k + 2), byte_at(k + 3)]);
            assert_eq!(
                x.to_bits(),
                want.to_bits(),
                "ndarray view at {:?} differs from the producer's",
                idx.slice()
            );
        }
    }
    Some(Box::new(nd))
}

#[cfg(feature = "torch")]
mod torch {
    //! The torch import on CPU: `handoff_torch::import_with` views the hand-off with
    //! `from_blob` (libtorch is not instrumented, so its reads are checked by value).
    use crate::byte_at;
    use handoff::dtype::DataType;
    use handoff::{Device, Handoff};

    /// The dtypes PyTorch has (handoff-torch's table).
    const TORCH: &[DataType] = &[
        DataType::U8,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::C64,
        DataType::C128,
        DataType::BOOL,
        DataType::BF16,
        DataType::F8E5M2,
        DataType::F8E4M3FN,
        DataType::F8E5M2FNUZ,
        DataType::F8E4M3FNUZ,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::F8E8M0FNU,
    ];

    /// The value of the element at byte `k` of the producer's allocation, for the
    /// dtypes `double_value` reads exactly as the bytes say.
    fn value(dtype: DataType, k: usize) -> Option<f64> {
        let b = |n: usize| -> Vec<u8> { (k..k + n).map(byte_at).collect() };
        Some(match dtype {
            DataType::U8 => f64::from(byte_at(k)),
            DataType::I16 => f64::from(i16::from_le_bytes(b(2).try_into().ok()?)),
            DataType::I32 => f64::from(i32::from_le_bytes(b(4).try_into().ok()?)),
            DataType::F32 => f64::from(f32::from_le_bytes(b(4).try_into().ok()?)),
            DataType::F64 => f64::from_le_bytes(b(8).try_into().ok()?),
            _ => return None,
        })
    }

    pub(super) fn view(h: Handoff, at: Option<(usize, i128, i128)>) -> Option<Box<dyn Send>> {
        let (dtype, shape, strides, ptr) =
            (h.dtype(), h.shape().to_vec(), h.strides().to_vec(), h.data_ptr());
        let ok = h.device() == Device::Host && TORCH.contains(&dtype) && strides.iter().all(|&s| s >= 0);
        let options = handoff_torch::ImportOptions::new().read_only_ok();
        let t = match handoff_torch::import_with(h, &options) {
            Err(e) => {
                assert!(!ok, "torch refused a host tensor of a torch dtype with non-negative strides: {e}");
                return None;
            }
            Ok(t) => t,
        };
        assert!(ok, "torch took a tensor it cannot view");
        assert_eq!(t.size(), shape);
        // (Validated: without a zero dimension, the count fits.)
        let n: i64 = if shape.contains(&0) { 0 } else { shape.iter().product() };
        if n > 0 {
            // (PyTorch reports a null data pointer for any empty tensor.)
            assert_eq!(t.data_ptr() as *mut u8, ptr);
            assert_eq!(t.stride(), strides);
        }
        if let Some((first, _, _)) = at
            && n <= 4096
            && value(dtype, 0).is_some()
        {
            let es = dtype.bits as usize / 8;
            let mut idx = vec![0i64; shape.len()];
            for _ in 0..n {
                let off: i64 = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
                let want = value(dtype, first + off as usize * es).expect("a numeric dtype");
                let got = t.double_value(&idx);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "torch reads {got} at {idx:?}, the producer wrote {want}"
                );
                // The next index, row-major.
                for d in (0..idx.len()).rev() {
                    idx[d] += 1;
                    if idx[d] < shape[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
        }
        Some(Box::new(t))
    }

    /// A dtype for an honest tensor the torch consumer reads.
    pub(super) fn dtype(u: &mut arbitrary::Unstructured<'_>) -> arbitrary::Result<DataType> {
        u.choose(&[DataType::U8, DataType::I16, DataType::I32, DataType::F32, DataType::F64, DataType::BF16])
            .copied()
    }
}

/// One input.
pub fn fuzz_consume(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let consumers: &[Consumer] = &[
        Consumer::U8,
        Consumer::U16,
        Consumer::I32,
        Consumer::F32,
        Consumer::U64,
        Consumer::Nd,
        #[cfg(feature = "torch")]
        Consumer::Torch,
    ];
    let Ok(&consumer) = u.choose(consumers) else { return };
    let Ok(is_honest) = u.arbitrary::<bool>() else { return };
    let d = if is_honest {
        let dtype = match consumer {
            #[cfg(feature = "torch")]
            Consumer::Torch if u.ratio(2, 3).unwrap_or(true) => torch::dtype(&mut u).unwrap_or(DataType::F32),
            _ if u.ratio(2, 3).unwrap_or(true) => consumer.dtype(),
            _ => *u.choose(DTYPES).unwrap_or(&DTYPES[0]),
        };
        honest(&mut u, dtype)
    } else {
        Desc::arbitrary(&mut u)
    };
    let Ok(d) = d else { return };
    // Consumer stream: the host, or a fake stream whose work completes at once or
    // only when flushed (then the release must wait for the flush).
    let lane = u.int_in_range(0..=2u8).unwrap_or(0);
    let healthy = Faults::default();
    let fake = Fake::new(&[
        Spec { mode: Mode::Instant, faults: healthy },
        Spec { mode: Mode::Manual, faults: healthy },
    ]);
    let stream = match lane {
        0 => Stream::host(),
        l => fake.stream(l as usize - 1),
    };
    let (r, mut b) = d.import(&stream);
    if lane == 0 {
        crate::check_outcome(&d, &r, &b);
    }
    let h = match r {
        Ok(h) => h,
        Err(e) => {
            if is_honest {
                let write_refusal = matches!(
                    e,
                    Error::Validation(ValidationError::ReadOnly | ValidationError::OverlappingWrite { .. })
                );
                assert!(d.access == Access::Write && write_refusal, "an honest tensor refused: {e} ({d:?})");
            }
            b.release("refused");
            return;
        }
    };
    let at = inside(&h, &b);
    assert!(!is_honest || at.is_some() || h.num_elements() == 0, "an honest extent outside its allocation");
    // Kernels of the consumer stream that the release must wait for.
    if lane != 0 {
        fake.kernel(lane as usize - 1);
    }
    let kept = match consumer {
        Consumer::U8 => elements::<u8>(h, at),
        Consumer::U16 => elements::<u16>(h, at),
        Consumer::I32 => elements::<i32>(h, at),
        Consumer::F32 => elements::<f32>(h, at),
        Consumer::U64 => elements::<u64>(h, at),
        Consumer::Nd => ndarray_view(h, at),
        #[cfg(feature = "torch")]
        Consumer::Torch => torch::view(h, at),
        #[cfg(not(feature = "torch"))]
        Consumer::Torch => unreachable!(),
    };
    if kept.is_some() {
        assert_eq!(b.count.get(), 0, "the deleter ran while the consumer lives");
    }
    drop(kept);
    if lane == 2 {
        // The consumer's kernel has not completed: nothing may be released yet.
        assert_eq!(b.count.get(), 0, "released before the consumer stream's work completed");
    }
    reaper::flush_stream(&stream);
    b.release("after the consumer is dropped and its stream flushed");
}
