//! Every way a foreign DLPack tensor can be bad: each gets its own error variant,
//! and the foreign deleter runs exactly once, errors included.

use handoff::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLPackVersion};
use handoff::{Access, Error, Handoff, Stream, ValidationError};
use handoff_tests::Foreign;

fn import(f: Foreign, access: Access) -> (Result<Handoff, Error>, handoff_tests::DeleterCount) {
    let (ptr, count) = f.versioned();
    // SAFETY: `ptr` is a fresh tensor owned by this test.
    let r = unsafe { Handoff::from_raw(ptr, &Stream::host(), access) };
    (r, count)
}

fn refused(f: Foreign) -> ValidationError {
    refused_with(f, Access::Read)
}

fn refused_with(f: Foreign, access: Access) -> ValidationError {
    let (r, count) = import(f, access);
    let e = match r {
        Ok(h) => panic!("accepted a bad tensor: {h:?}"),
        Err(Error::Validation(e)) => e,
        Err(e) => panic!("not a validation error: {e}"),
    };
    assert_eq!(count.get(), 1, "deleter must run exactly once on error ({e})");
    let msg = e.to_string();
    assert!(!msg.is_empty());
    e
}

#[test]
fn a_good_tensor_is_accepted_and_released_once() {
    let (r, count) = import(Foreign::f32(&[2, 3]), Access::Write);
    let h = r.unwrap();
    assert_eq!(h.shape(), &[2, 3]);
    assert_eq!(h.strides(), &[3, 1]);
    // SAFETY: a host tensor of 6 f32 owned by the hand-off.
    let v = unsafe { std::slice::from_raw_parts(h.data_ptr() as *const f32, 6) };
    assert_eq!(v, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(count.get(), 0);
    drop(h);
    assert_eq!(count.get(), 1);
}

#[test]
fn null_pointer() {
    // SAFETY: null is allowed and refused.
    let r = unsafe { Handoff::from_raw(std::ptr::null_mut(), &Stream::host(), Access::Read) };
    assert!(matches!(r, Err(Error::Validation(ValidationError::NullPointer))));
}

#[test]
fn major_version_mismatch_calls_the_deleter_and_reads_nothing_else() {
    let mut f = Foreign::f32(&[4]);
    f.version = DLPackVersion { major: 2, minor: 0 };
    // Poison every other field: a reader would fail differently or crash.
    f.ndim = Some(-7);
    f.null_shape = true;
    f.data = Some(0x1);
    f.device = DLDevice { device_type: DLDeviceType(99), device_id: -3 };
    assert_eq!(refused(f), ValidationError::IncompatibleVersion { major: 2, expected: 1 });
}

#[test]
fn unsupported_device() {
    let mut f = Foreign::f32(&[4]);
    f.device = DLDevice { device_type: DLDeviceType::VULKAN, device_id: 0 };
    assert_eq!(refused(f), ValidationError::UnsupportedDevice { device_type: 7, device_id: 0 });
    let mut f = Foreign::f32(&[4]);
    f.device = DLDevice::cuda(-2);
    assert_eq!(refused(f), ValidationError::UnsupportedDevice { device_type: 2, device_id: -2 });
}

#[test]
fn unsupported_dtypes() {
    for (code, bits, lanes) in [(2u8, 32u8, 4u16), (99, 8, 1), (0, 7, 1), (2, 0, 1), (6, 1, 1)] {
        let mut f = Foreign::f32(&[4]);
        f.dtype = DLDataType::new(DLDataTypeCode(code), bits, lanes);
        assert_eq!(refused(f), ValidationError::UnsupportedDtype { code, bits, lanes });
    }
}

#[test]
fn ndim_bounds() {
    let mut f = Foreign::f32(&[4]);
    f.ndim = Some(-1);
    assert_eq!(refused(f), ValidationError::NegativeNdim { ndim: -1 });
    let mut f = Foreign::f32(&[4]);
    f.ndim = Some(1_000_000); // a reader would run off the shape array
    assert_eq!(refused(f), ValidationError::TooManyDims { ndim: 1_000_000, max: handoff::MAX_NDIM });
}

#[test]
fn null_shape() {
    let mut f = Foreign::f32(&[4]);
    f.null_shape = true;
    assert_eq!(refused(f), ValidationError::NullShape { ndim: 1 });
}

#[test]
fn negative_and_overflowing_shapes() {
    let mut f = Foreign::f32(&[2, 3]);
    f.shape = vec![2, -3];
    assert_eq!(refused(f), ValidationError::NegativeDimension { axis: 1, value: -3 });
    let mut f = Foreign::f32(&[2, 3]);
    f.shape = vec![i64::MAX, 4];
    f.strides = Some(vec![4, 1]);
    assert_eq!(refused(f), ValidationError::ShapeOverflow { shape: vec![i64::MAX, 4] });
}

#[test]
fn null_strides_are_compact_before_1_2_and_required_from_1_2() {
    let mut f = Foreign::f32(&[2, 3]);
    f.strides = None;
    f.version = DLPackVersion { major: 1, minor: 1 };
    let (r, count) = import(f, Access::Read);
    let h = r.unwrap();
    assert_eq!(h.strides(), &[3, 1]);
    drop(h);
    assert_eq!(count.get(), 1);

    let mut f = Foreign::f32(&[2, 3]);
    f.strides = None;
    f.version = DLPackVersion { major: 1, minor: 2 };
    assert_eq!(refused(f), ValidationError::StridesRequired { major: 1, minor: 2, ndim: 2 });
}

#[test]
fn legacy_null_strides_are_compact() {
    let mut f = Foreign::f32(&[3, 2]);
    f.strides = None;
    let (ptr, count) = f.legacy();
    // SAFETY: fresh tensor owned by the test.
    let h = unsafe { Handoff::from_raw_legacy(ptr, &Stream::host(), Access::Write) }.unwrap();
    assert_eq!(h.strides(), &[2, 1]);
    drop(h);
    assert_eq!(count.get(), 1);

    let mut f = Foreign::f32(&[3, 2]);
    f.shape = vec![3, -2];
    let (ptr, count) = f.legacy();
    // SAFETY: as above.
    let r = unsafe { Handoff::from_raw_legacy(ptr, &Stream::host(), Access::Read) };
    assert!(matches!(r, Err(Error::Validation(ValidationError::NegativeDimension { axis: 1, value: -2 }))));
    assert_eq!(count.get(), 1);
}

#[test]
fn extent_overflowing_isize() {
    let mut f = Foreign::f32(&[2, 2]);
    f.strides = Some(vec![i64::MAX / 2, 1]);
    let e = refused(f);
    assert!(
        matches!(e, ValidationError::ExtentOverflow { ref shape, ref strides, ref dtype }
        if shape == &[2, 2] && strides == &[i64::MAX / 2, 1] && dtype == "f32"),
        "{e:?}"
    );
}

#[test]
fn byte_offset_overflow_and_misalignment() {
    let mut f = Foreign::f32(&[2]);
    f.byte_offset = u64::MAX - 2;
    assert!(
        matches!(refused(f), ValidationError::ByteOffsetOverflow { byte_offset, .. } if byte_offset == u64::MAX - 2)
    );
    let mut f = Foreign::f32(&[2]);
    f.byte_offset = 2;
    assert!(
        matches!(refused(f), ValidationError::Misaligned { byte_offset: 2, align: 4, ref dtype, .. } if dtype == "f32")
    );
}

/// An empty tensor whose other dimensions multiply past `isize::MAX` is refused
/// whatever the order of its dimensions (it was taken with the zero first and refused
/// with it last: the count overflowed only before reaching the zero).
#[test]
fn empty_shapes_whose_other_dimensions_overflow_are_refused_in_any_order() {
    const BIG: i64 = 1 << 40;
    for shape in [vec![0, BIG, BIG], vec![BIG, 0, BIG], vec![BIG, BIG, 0, 0]] {
        let mut f = Foreign::f32(&[0]);
        f.strides = Some(vec![1; shape.len()]);
        f.shape = shape.clone();
        assert_eq!(refused(f), ValidationError::ShapeOverflow { shape });
    }
    // Within isize they are fine.
    let mut f = Foreign::f32(&[0]);
    f.shape = vec![0, 1 << 20, 1 << 20];
    f.strides = Some(vec![1, 1, 1]);
    assert_eq!(import(f, Access::Read).0.unwrap().num_elements(), 0);
}

#[test]
fn null_data_with_elements() {
    let mut f = Foreign::f32(&[2, 2]);
    f.data = Some(0);
    assert_eq!(refused(f), ValidationError::NullData { elements: 4 });
    // Null data is fine when there is nothing to point at.
    let mut f = Foreign::f32(&[0, 3]);
    f.data = Some(0);
    let (r, count) = import(f, Access::Read);
    assert_eq!(r.unwrap().num_elements(), 0);
    assert_eq!(count.get(), 1);
}

#[test]
fn read_only_refuses_mutable_import_and_is_kept_on_read() {
    let mut f = Foreign::f32(&[2]);
    f.flags = 1;
    assert_eq!(refused_with(f, Access::Write), ValidationError::ReadOnly);
    let mut f = Foreign::f32(&[2]);
    f.flags = 1;
    let (r, count) = import(f, Access::Read);
    let h = r.unwrap();
    assert!(h.is_read_only());
    drop(h);
    assert_eq!(count.get(), 1);
}

#[test]
fn is_copied_is_reported_and_unknown_flags_refused() {
    let mut f = Foreign::f32(&[2]);
    f.flags = 2;
    let (r, _count) = import(f, Access::Write);
    assert!(r.unwrap().is_copied());
    let mut f = Foreign::f32(&[2]);
    f.flags = 1 << 40;
    assert_eq!(refused(f), ValidationError::UnknownFlags { flags: 1 << 40 });
}

#[test]
fn zero_dim_and_every_dtype_are_accepted() {
    for &dtype in handoff::dtype::ALL {
        let mut f = Foreign::f32(&[]);
        f.dtype = dtype;
        let (r, count) = import(f, Access::Read);
        let h = r.unwrap_or_else(|e| panic!("{dtype:?}: {e}"));
        assert_eq!(h.shape(), &[] as &[i64]);
        assert_eq!(h.dtype(), dtype);
        drop(h);
        assert_eq!(count.get(), 1);
    }
}

#[test]
fn null_data_with_a_byte_offset_is_refused() {
    // Nothing to point at, but an offset from nothing: neither aligned nor meaningful.
    let mut f = Foreign::f32(&[0]);
    f.data = Some(0);
    f.byte_offset = 2;
    assert_eq!(refused(f), ValidationError::NullDataOffset { byte_offset: 2 });
    let mut f = Foreign::f32(&[0, 4]);
    f.data = Some(0);
    f.byte_offset = 16;
    assert_eq!(refused(f), ValidationError::NullDataOffset { byte_offset: 16 });
}

#[test]
fn write_access_to_self_overlapping_strides_is_refused_and_reading_them_is_fine() {
    for (shape, strides) in [
        (vec![4i64], vec![0i64]),       // broadcast: every index is element 0
        (vec![2, 2], vec![1, 1]),       // (0, 1) and (1, 0) are the same element
        (vec![3, 2], vec![1, 2]),       // (2, 0) and (0, 1)
        (vec![2, 1, 3], vec![2, 7, 1]), // rows of 3 two apart
    ] {
        let mut f = Foreign::f32(&[4]);
        f.shape = shape.clone();
        f.strides = Some(strides.clone());
        assert_eq!(
            refused_with(f, Access::Write),
            ValidationError::OverlappingWrite { shape: shape.clone(), strides: strides.clone() }
        );
        let mut f = Foreign::f32(&[4]);
        f.shape = shape.clone();
        f.strides = Some(strides.clone());
        let (r, count) = import(f, Access::Read);
        drop(r.unwrap_or_else(|e| panic!("{shape:?} {strides:?} read: {e}")));
        assert_eq!(count.get(), 1);
    }
    // Not overlapping: transposed, strided, size-1 and zero-stride-on-size-1 dims, empty.
    for (shape, strides) in [
        (vec![2i64, 2], vec![1i64, 2]),
        (vec![2, 3], vec![2, 3]),
        (vec![2], vec![3]),
        (vec![2, 1, 2], vec![2, 0, 1]),
        (vec![0, 4], vec![0, 0]),
        (vec![2, 2], vec![-2, 1]),
    ] {
        let mut f = Foreign::f32(&[3, 3]);
        f.byte_offset = 8;
        f.shape = shape.clone();
        f.strides = Some(strides.clone());
        let (r, _count) = import(f, Access::Write);
        drop(r.unwrap_or_else(|e| panic!("{shape:?} {strides:?} write: {e}")));
    }
}

#[test]
fn extents_below_address_zero_or_past_the_top_are_refused() {
    // Negative strides walking from a low address down past 0.
    let mut f = Foreign::f32(&[4]);
    f.data = Some(0x100);
    f.strides = Some(vec![-0x100]);
    assert_eq!(
        refused(f),
        ValidationError::OutsideAddressSpace {
            data: 0x100,
            byte_offset: 0,
            shape: vec![4],
            strides: vec![-0x100],
            first_byte: -3 * 0x100 * 4,
            end_byte: 4,
        }
    );
    // Positive strides wrapping past usize::MAX.
    let mut f = Foreign::f32(&[8]);
    f.data = Some(usize::MAX - 15);
    let e = refused(f);
    assert!(
        matches!(e, ValidationError::OutsideAddressSpace { data, first_byte: 0, end_byte: 32, .. }
            if data == usize::MAX - 15),
        "{e:?}"
    );
    // The byte offset counts: the first element is in range, the last is not.
    let mut f = Foreign::f32(&[2]);
    f.data = Some(usize::MAX - 63);
    f.byte_offset = 60;
    assert!(matches!(refused(f), ValidationError::OutsideAddressSpace { byte_offset: 60, end_byte: 8, .. }));
    // One past the last byte must be an address too (Rust's rule for allocations):
    // ending on the address space's last byte is refused, ending before it is fine
    // (nothing is read here).
    let mut f = Foreign::f32(&[4]);
    f.data = Some(usize::MAX - 15);
    assert!(matches!(refused(f), ValidationError::OutsideAddressSpace { end_byte: 16, .. }));
    let mut f = Foreign::f32(&[4]);
    f.data = Some(usize::MAX - 31);
    let (r, count) = import(f, Access::Read);
    drop(r.unwrap());
    assert_eq!(count.get(), 1);
}

#[test]
fn padded_sub_byte_dtypes_are_refused_and_the_flag_is_a_no_op_on_whole_bytes() {
    use handoff::dtype::DataType;
    for dtype in [DataType::F4E2M1FN, DataType::F6E2M3FN, DataType::F6E3M2FN] {
        let mut f = Foreign::f32(&[8]);
        f.dtype = dtype;
        f.strides = Some(vec![1]);
        f.flags = 4; // IS_SUBBYTE_TYPE_PADDED
        assert_eq!(
            refused(f),
            ValidationError::SubbytePadded { dtype: handoff::dtype::name(dtype), bits: dtype.bits }
        );
    }
    // Packed fp4: 8 elements in 4 bytes.
    let mut f = Foreign::f32(&[8]);
    f.dtype = DataType::F4E2M1FN;
    let (r, _count) = import(f, Access::Read);
    assert_eq!(r.unwrap().num_bytes(), 4);
    // Whole-byte dtypes are laid out the same padded or not.
    let mut f = Foreign::f32(&[8]);
    f.flags = 4;
    let (r, _count) = import(f, Access::Read);
    assert_eq!(r.unwrap().num_bytes(), 32);
}

#[test]
fn size_one_dims_strides_do_not_make_a_tensor_non_compact() {
    for (shape, strides, compact) in [
        (vec![8i64, 1], vec![1i64, 8], true), // torch.ones(1, 8).t()
        (vec![1, 8], vec![1, 1], true),
        (vec![1, 8], vec![99, 1], true),
        (vec![2, 1, 3], vec![3, 42, 1], true),
        (vec![1], vec![0], true),
        (vec![0, 3], vec![7, 5], true), // no elements: any strides
        (vec![2, 3], vec![3, 1], true),
        (vec![2, 3], vec![1, 2], false),
        (vec![2, 1, 3], vec![1, 1, 2], false),
        (vec![3], vec![2], false),
    ] {
        let mut f = Foreign::f32(&[8]);
        f.shape = shape.clone();
        f.strides = Some(strides.clone());
        let (r, _count) = import(f, Access::Read);
        let h = r.unwrap_or_else(|e| panic!("{shape:?} {strides:?}: {e}"));
        assert_eq!(h.is_contiguous(), compact, "shape {shape:?} strides {strides:?}");
    }
}
