//! PyTorch's scalar types (`c10::ScalarType` values) and DLPack's dtypes.

use handoff_runtime::dtype::DataType;

/// `c10::ScalarType` values (c10/core/ScalarType.h, PyTorch 2.11) with their DLPack
/// dtype, for every scalar type DLPack and handoff have in common.
const TABLE: &[(i32, DataType)] = &[
    (0, DataType::U8),
    (1, DataType::I8),
    (2, DataType::I16),
    (3, DataType::I32),
    (4, DataType::I64),
    (5, DataType::F16),
    (6, DataType::F32),
    (7, DataType::F64),
    (9, DataType::C64),
    (10, DataType::C128),
    (11, DataType::BOOL),
    (15, DataType::BF16),
    (23, DataType::F8E5M2),
    (24, DataType::F8E4M3FN),
    (25, DataType::F8E5M2FNUZ),
    (26, DataType::F8E4M3FNUZ),
    (27, DataType::U16),
    (28, DataType::U32),
    (29, DataType::U64),
    (44, DataType::F8E8M0FNU),
];

/// Every dtype the torch adapter exchanges, for the registry: the DLPack side of
/// [`TABLE`].
pub(crate) const DTYPES: [DataType; TABLE.len()] = {
    let mut dtypes = [DataType::U8; TABLE.len()];
    let mut i = 0;
    while i < TABLE.len() {
        dtypes[i] = TABLE[i].1;
        i += 1;
    }
    dtypes
};

/// The DLPack dtype of a `c10::ScalarType`, if handoff exchanges it.
pub(crate) fn to_dlpack(scalar_type: i32) -> Option<DataType> {
    TABLE.iter().find(|(s, _)| *s == scalar_type).map(|&(_, d)| d)
}

/// The `c10::ScalarType` of a DLPack dtype, if PyTorch has it.
pub(crate) fn from_dlpack(dtype: DataType) -> Option<i32> {
    TABLE.iter().find(|(_, d)| *d == dtype).map(|&(s, _)| s)
}

/// What to tell a user whose dtype is refused.
pub(crate) fn hint(scalar_type: i32) -> &'static str {
    match scalar_type {
        8 => "; DLPack's complex32 is not exchanged: convert with `to_kind(Kind::ComplexFloat)` (a copy)",
        12..=14 | 16 | 17 => ": a quantized tensor; call `dequantize()` first (a copy)",
        45 => ": float4_e2m1fn_x2 packs two values per byte; view it as uint8 first",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_a_bijection_of_valid_dtypes() {
        for &(s, d) in TABLE {
            handoff_runtime::dtype::check(d).unwrap();
            assert_eq!(from_dlpack(d), Some(s));
            assert_eq!(to_dlpack(s), Some(d));
        }
        assert_eq!(to_dlpack(8), None);
        assert_eq!(from_dlpack(DataType::F4E2M1FN), None);
    }
}
