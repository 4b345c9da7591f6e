//! Element types: DLPack's `DLDataType`, through `dlpark`.
//!
//! Every scalar dtype DLPack defines is exchanged (ints, uints, f16, bf16, f32, f64,
//! complex, bool, the fp8/fp6/fp4 families). Vector dtypes (`lanes > 1`) are refused.

use crate::error::ValidationError;
pub use dlpark::DlpackElement as Element;
pub use dlpark::ffi::{DLDataType as DataType, DLDataTypeCode as DataTypeCode};

/// A short name for a dtype, as frameworks print it (`f32`, `bf16`, `f8e4m3fn`, ...).
///
/// ```
/// use handoff_runtime::dtype::{name, DataType};
/// assert_eq!(name(DataType::BF16), "bf16");
/// ```
pub fn name(dtype: DataType) -> String {
    let base = match (dtype.code, dtype.bits) {
        (DataTypeCode::INT, b) => format!("i{b}"),
        (DataTypeCode::UINT, b) => format!("u{b}"),
        (DataTypeCode::FLOAT, b) => format!("f{b}"),
        (DataTypeCode::BFLOAT, 16) => "bf16".into(),
        (DataTypeCode::COMPLEX, b) => format!("c{b}"),
        (DataTypeCode::BOOL, 8) => "bool".into(),
        (DataTypeCode::FLOAT8_E3M4, 8) => "f8e3m4".into(),
        (DataTypeCode::FLOAT8_E4M3, 8) => "f8e4m3".into(),
        (DataTypeCode::FLOAT8_E4M3B11FNUZ, 8) => "f8e4m3b11fnuz".into(),
        (DataTypeCode::FLOAT8_E4M3FN, 8) => "f8e4m3fn".into(),
        (DataTypeCode::FLOAT8_E4M3FNUZ, 8) => "f8e4m3fnuz".into(),
        (DataTypeCode::FLOAT8_E5M2, 8) => "f8e5m2".into(),
        (DataTypeCode::FLOAT8_E5M2FNUZ, 8) => "f8e5m2fnuz".into(),
        (DataTypeCode::FLOAT8_E8M0FNU, 8) => "f8e8m0fnu".into(),
        (DataTypeCode::FLOAT6_E2M3FN, 6) => "f6e2m3fn".into(),
        (DataTypeCode::FLOAT6_E3M2FN, 6) => "f6e3m2fn".into(),
        (DataTypeCode::FLOAT4_E2M1FN, 4) => "f4e2m1fn".into(),
        (code, bits) => format!("dtype(code={}, bits={bits})", code.0),
    };
    if dtype.lanes == 1 { base } else { format!("{base}x{}", dtype.lanes) }
}

/// Checks that a dtype is one DLPack defines, with a bit width valid for its code
/// and one lane — or PyTorch's `float4_e2m1fn_x2`, two packed 4-bit floats in a byte,
/// which it exports as two lanes of `FLOAT4_E2M1FN`.
///
/// ```
/// use handoff_runtime::dtype::{check, DataType, DataTypeCode};
/// assert!(check(DataType::F8E4M3FN).is_ok());
/// assert!(check(DataType::new(DataTypeCode::FLOAT4_E2M1FN, 4, 2)).is_ok()); // float4_e2m1fn_x2
/// assert!(check(DataType::new(DataTypeCode::FLOAT, 24, 1)).is_err());
/// assert!(check(DataType::new(DataTypeCode::FLOAT, 32, 4)).is_err()); // a vector type
/// ```
pub fn check(dtype: DataType) -> Result<(), ValidationError> {
    let err =
        || ValidationError::UnsupportedDtype { code: dtype.code.0, bits: dtype.bits, lanes: dtype.lanes };
    if dtype.lanes == 2 && dtype.code == DataTypeCode::FLOAT4_E2M1FN && dtype.bits == 4 {
        return Ok(());
    }
    if dtype.lanes != 1 {
        return Err(err());
    }
    let ok = match dtype.code {
        DataTypeCode::INT | DataTypeCode::UINT => matches!(dtype.bits, 8 | 16 | 32 | 64),
        DataTypeCode::FLOAT => matches!(dtype.bits, 16 | 32 | 64),
        DataTypeCode::BFLOAT => dtype.bits == 16,
        DataTypeCode::COMPLEX => matches!(dtype.bits, 64 | 128),
        DataTypeCode::BOOL => dtype.bits == 8,
        DataTypeCode::FLOAT6_E2M3FN | DataTypeCode::FLOAT6_E3M2FN => dtype.bits == 6,
        DataTypeCode::FLOAT4_E2M1FN => dtype.bits == 4,
        c if (DataTypeCode::FLOAT8_E3M4.0..=DataTypeCode::FLOAT8_E8M0FNU.0).contains(&c.0) => dtype.bits == 8,
        _ => false,
    };
    if ok { Ok(()) } else { Err(err()) }
}

/// The alignment a pointer to elements of `dtype` needs, in bytes
/// (the element size for 1-, 2-, 4- and 8-byte types; 8 for 16-byte complex,
/// as `std::complex<double>` has; 1 for packed sub-byte types).
pub fn alignment(dtype: DataType) -> usize {
    match dtype.element_size() {
        0 | 1 => 1,
        n if n >= 16 => 8,
        n => n,
    }
}

/// Every dtype handoff exchanges, for tests and capability tables.
pub const ALL: &[DataType] = &[
    DataType::BOOL,
    DataType::I8,
    DataType::I16,
    DataType::I32,
    DataType::I64,
    DataType::U8,
    DataType::U16,
    DataType::U32,
    DataType::U64,
    DataType::F16,
    DataType::BF16,
    DataType::F32,
    DataType::F64,
    DataType::C64,
    DataType::C128,
    DataType::F8E3M4,
    DataType::F8E4M3,
    DataType::F8E4M3B11FNUZ,
    DataType::F8E4M3FN,
    DataType::F8E4M3FNUZ,
    DataType::F8E5M2,
    DataType::F8E5M2FNUZ,
    DataType::F8E8M0FNU,
    DataType::F6E2M3FN,
    DataType::F6E3M2FN,
    DataType::F4E2M1FN,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_dtype_is_accepted_and_named() {
        for &d in ALL {
            check(d).unwrap();
            assert!(!name(d).starts_with("dtype("), "{d:?}");
        }
        assert_eq!(name(DataType::C64), "c64");
        assert_eq!(alignment(DataType::C128), 8);
        assert_eq!(alignment(DataType::F4E2M1FN), 1);
    }

    #[test]
    fn bad_dtypes_are_refused() {
        for d in [
            DataType::new(DataTypeCode::FLOAT, 32, 4),
            DataType::new(DataTypeCode::BOOL, 1, 1),
            DataType::new(DataTypeCode(99), 8, 1),
            DataType::new(DataTypeCode::INT, 7, 1),
        ] {
            assert!(matches!(check(d), Err(ValidationError::UnsupportedDtype { .. })), "{d:?}");
        }
    }
}
