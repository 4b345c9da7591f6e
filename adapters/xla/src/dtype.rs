//! Element types: DLPack's (handoff's) and PJRT's `PJRT_Buffer_Type`, and XLA's
//! `PrimitiveType` (in HLO protos).

use crate::sys;
use handoff_runtime::dtype::DataType;
use std::ffi::c_int;

const TABLE: &[(DataType, c_int, i32)] = &[
    (DataType::BOOL, sys::BUFFER_TYPE_PRED, 1),
    (DataType::I8, sys::BUFFER_TYPE_S8, 2),
    (DataType::I16, sys::BUFFER_TYPE_S16, 3),
    (DataType::I32, sys::BUFFER_TYPE_S32, 4),
    (DataType::I64, sys::BUFFER_TYPE_S64, 5),
    (DataType::U8, sys::BUFFER_TYPE_U8, 6),
    (DataType::U16, sys::BUFFER_TYPE_U16, 7),
    (DataType::U32, sys::BUFFER_TYPE_U32, 8),
    (DataType::U64, sys::BUFFER_TYPE_U64, 9),
    (DataType::F16, sys::BUFFER_TYPE_F16, 10),
    (DataType::F32, sys::BUFFER_TYPE_F32, 11),
    (DataType::F64, sys::BUFFER_TYPE_F64, 12),
    (DataType::C64, sys::BUFFER_TYPE_C64, 15),
    (DataType::BF16, sys::BUFFER_TYPE_BF16, 16),
    (DataType::C128, sys::BUFFER_TYPE_C128, 18),
    (DataType::F8E5M2, sys::BUFFER_TYPE_F8E5M2, 19),
    (DataType::F8E4M3FN, sys::BUFFER_TYPE_F8E4M3FN, 20),
    (DataType::F8E4M3B11FNUZ, sys::BUFFER_TYPE_F8E4M3B11FNUZ, 23),
    (DataType::F8E5M2FNUZ, sys::BUFFER_TYPE_F8E5M2FNUZ, 24),
    (DataType::F8E4M3FNUZ, sys::BUFFER_TYPE_F8E4M3FNUZ, 25),
    (DataType::F8E4M3, sys::BUFFER_TYPE_F8E4M3, 28),
    (DataType::F8E3M4, sys::BUFFER_TYPE_F8E3M4, 29),
    (DataType::F4E2M1FN, sys::BUFFER_TYPE_F4E2M1FN, 32),
    (DataType::F8E8M0FNU, sys::BUFFER_TYPE_F8E8M0FNU, 33),
];

/// Every dtype an XLA buffer can hold (what the registry advertises).
pub const DTYPES: [DataType; TABLE.len()] = {
    let mut out = [DataType::BOOL; TABLE.len()];
    let mut i = 0;
    while i < TABLE.len() {
        out[i] = TABLE[i].0;
        i += 1;
    }
    out
};

/// The PJRT buffer type of a DLPack dtype, if PJRT has one.
pub fn to_pjrt(dtype: DataType) -> Option<c_int> {
    TABLE.iter().find(|(d, _, _)| *d == dtype).map(|(_, p, _)| *p)
}

/// The DLPack dtype of a PJRT buffer type.
pub fn from_pjrt(t: c_int) -> Option<DataType> {
    TABLE.iter().find(|(_, p, _)| *p == t).map(|(d, _, _)| *d)
}

/// The DLPack dtype of an XLA `PrimitiveType`.
pub fn from_primitive(t: i32) -> Option<DataType> {
    TABLE.iter().find(|(_, _, x)| *x == t).map(|(d, _, _)| *d)
}
