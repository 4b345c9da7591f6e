//! The errors handoff returns. Every variant names the field and the value at fault.

use crate::device::Device;

/// A `Result` with handoff's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a hand-off.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A DLPack descriptor failed validation (see [`ValidationError`]).
    #[error("invalid DLPack tensor: {0}")]
    Validation(#[from] ValidationError),

    /// Producer and consumer are on different devices, and no copy was allowed.
    #[error(
        "cross-device hand-off from {from} to {to} refused: handoff never copies \
         unless asked; make the consumer stream one of {from}, or allow a copy"
    )]
    CrossDevice {
        /// The producer's device.
        from: Device,
        /// The consumer's device.
        to: Device,
    },

    /// Two streams of different backends that cannot order work between them.
    #[error("cannot order {producer} work before {consumer} work: {reason}")]
    IncompatibleStreams {
        /// The producer stream's backend.
        producer: &'static str,
        /// The consumer stream's backend.
        consumer: &'static str,
        /// Why not.
        reason: String,
    },

    /// A stream handle that names a different stream on each thread (CUDA's
    /// per-thread default stream) used on a thread other than the one it was made on.
    #[error(
        "{stream} is the per-thread default stream of thread {owner}, and this is thread {here}, where \
         the same handle names another stream: use it on the thread that made it"
    )]
    WrongThread {
        /// The stream.
        stream: String,
        /// The thread it belongs to.
        owner: String,
        /// The calling thread.
        here: String,
    },

    /// A backend call failed (a CUDA driver error, a PJRT error, a mock misuse).
    #[error("{backend}: {call} failed: {message}")]
    Backend {
        /// The backend (`cuda`, `mock`, `pjrt`, ...).
        backend: &'static str,
        /// The call that failed.
        call: &'static str,
        /// The backend's own message.
        message: String,
    },

    /// CUDA was asked for but cannot be used on this machine.
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable {
        /// Why (no `libcuda`, no device, driver error, ...).
        reason: String,
    },

    /// A value cannot be described as a DLPack tensor, or an adapter refused it.
    #[error("{adapter}: {message}")]
    Adapter {
        /// The adapter that refused.
        adapter: &'static str,
        /// What is wrong and what to do instead.
        message: String,
    },

    /// A derived type's fields do not describe its storage (see [`crate::storage`]).
    #[error("{0}")]
    Storage(Box<StorageError>),
}

/// Why a DLPack descriptor was refused. Each check of the import path has its own
/// variant; the foreign deleter has been called exactly once when one is returned.
///
/// # What a producer of bad input sees
///
/// A foreign tensor taken in by [`Handoff::from_raw`](crate::Handoff::from_raw) or
/// [`Handoff::from_raw_legacy`](crate::Handoff::from_raw_legacy) is checked before any of
/// its metadata is used, and refused with the first rule it breaks, as
/// [`Error::Validation`]: it displays as `invalid DLPack tensor: ` followed by the
/// variant's message. Each variant below says when it happens, shows its message for the
/// values of its test and names that test (in `tests/tests/import_validation.rs`); the
/// `import_raw` fuzz target checks the same for arbitrary combinations of fields. What
/// handoff lays out itself (an export's description) is checked by the same rules.
///
/// The order: the version first (a wrong major version reads nothing else), the flags
/// next, then the device and dtype; `ndim` before anything behind the `shape` and
/// `strides` pointers is read; the alignment of the first element last.
///
/// Accepted, not errors: null strides before DLPack 1.2 and in the legacy ABI (compact;
/// `null_strides_are_compact_before_1_2_and_required_from_1_2`,
/// `legacy_null_strides_are_compact`); null data with zero elements
/// (`null_data_with_elements`); `IS_COPIED`, which is reported
/// (`is_copied_is_reported_and_unknown_flags_refused`); 0-d tensors of every dtype
/// (`zero_dim_and_every_dtype_are_accepted`).
///
/// Not detectable by any importer, so not promised: a shape, strides or byte offset that
/// lies about the producer's own memory (DLPack has no size field), and an `ndim` larger
/// than the producer's own arrays but within [`MAX_NDIM`](crate::MAX_NDIM).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// The managed-tensor pointer was null.
    ///
    /// ```text
    /// managed tensor pointer is null
    /// ```
    ///
    /// Test: `import_validation::null_pointer`.
    #[error("managed tensor pointer is null")]
    NullPointer,

    /// `version.major` is not the one handoff speaks; no other field was read (the
    /// version is read first).
    ///
    /// ```text
    /// version.major is 2, handoff speaks DLPack 1.x; the deleter was called and no other field was read
    /// ```
    ///
    /// Test: `import_validation::major_version_mismatch_calls_the_deleter_and_reads_nothing_else`.
    #[error(
        "version.major is {major}, handoff speaks DLPack {expected}.x; the deleter was called and no other field was read"
    )]
    IncompatibleVersion {
        /// The tensor's major version.
        major: u32,
        /// The major version handoff implements.
        expected: u32,
    },

    /// `device.device_type` names a device handoff does not exchange (not host, CUDA or
    /// the mock device), or a CUDA or mock `device.device_id` is negative (a host
    /// tensor's `device_id` is not read).
    ///
    /// ```text
    /// device (device_type 7, device_id 0) is not exchanged: handoff takes host (1, 3; any device_id), CUDA (2) and the mock device (12) with device_id >= 0
    /// ```
    ///
    /// Test: `import_validation::unsupported_device`.
    #[error(
        "device (device_type {device_type}, device_id {device_id}) is not exchanged: \
         handoff takes host (1, 3; any device_id), CUDA (2) and the mock device (12) with device_id >= 0"
    )]
    UnsupportedDevice {
        /// `device.device_type`.
        device_type: u32,
        /// `device.device_id`.
        device_id: i32,
    },

    /// `dtype` is not a scalar DLPack dtype with a valid bit width: a vector dtype
    /// (`lanes` other than 1), an unknown type code, or a bit width its code does not have.
    ///
    /// ```text
    /// dtype (code 2, bits 32, lanes 4) is not a DLPack scalar dtype handoff exchanges
    /// ```
    ///
    /// Test: `import_validation::unsupported_dtypes`.
    #[error("dtype (code {code}, bits {bits}, lanes {lanes}) is not a DLPack scalar dtype handoff exchanges")]
    UnsupportedDtype {
        /// `dtype.code`.
        code: u8,
        /// `dtype.bits`.
        bits: u8,
        /// `dtype.lanes`.
        lanes: u16,
    },

    /// `ndim` is negative.
    ///
    /// ```text
    /// ndim is -1: it must be >= 0
    /// ```
    ///
    /// Test: `import_validation::ndim_bounds`.
    #[error("ndim is {ndim}: it must be >= 0")]
    NegativeNdim {
        /// `ndim`.
        ndim: i32,
    },

    /// `ndim` is above [`crate::MAX_NDIM`]; the shape is not read.
    ///
    /// ```text
    /// ndim is 1000000: handoff takes at most 64 dimensions
    /// ```
    ///
    /// Test: `import_validation::ndim_bounds`.
    #[error("ndim is {ndim}: handoff takes at most {max} dimensions")]
    TooManyDims {
        /// `ndim`.
        ndim: i32,
        /// The limit.
        max: i32,
    },

    /// `shape` is null although `ndim > 0`.
    ///
    /// ```text
    /// shape is null but ndim is 1
    /// ```
    ///
    /// Test: `import_validation::null_shape`.
    #[error("shape is null but ndim is {ndim}")]
    NullShape {
        /// `ndim`.
        ndim: i32,
    },

    /// `shape[axis]` is negative.
    ///
    /// ```text
    /// shape[1] is -3: dimensions must be >= 0
    /// ```
    ///
    /// Tests: `import_validation::negative_and_overflowing_shapes`,
    /// `import_validation::legacy_null_strides_are_compact`.
    #[error("shape[{axis}] is {value}: dimensions must be >= 0")]
    NegativeDimension {
        /// The axis.
        axis: usize,
        /// `shape[axis]`.
        value: i64,
    },

    /// The element count or the byte count of `shape` does not fit in `isize`. An empty
    /// tensor whose other dimensions multiply past `isize::MAX` is refused too, whatever
    /// the order of its dimensions.
    ///
    /// ```text
    /// shape [9223372036854775807, 4] has more elements than fit in isize
    /// ```
    ///
    /// Tests: `import_validation::negative_and_overflowing_shapes`,
    /// `import_validation::empty_shapes_whose_other_dimensions_overflow_are_refused_in_any_order`.
    #[error("shape {shape:?} has more elements than fit in isize")]
    ShapeOverflow {
        /// `shape`.
        shape: Vec<i64>,
    },

    /// `strides` is null with `ndim > 0` in DLPack 1.2 or later, which requires explicit
    /// strides. (Before 1.2, and in the legacy ABI, null strides mean compact.)
    ///
    /// ```text
    /// strides is null but DLPack 1.2 requires explicit strides for ndim 2
    /// ```
    ///
    /// Test: `import_validation::null_strides_are_compact_before_1_2_and_required_from_1_2`.
    #[error("strides is null but DLPack {major}.{minor} requires explicit strides for ndim {ndim}")]
    StridesRequired {
        /// `version.major`.
        major: u32,
        /// `version.minor`.
        minor: u32,
        /// `ndim`.
        ndim: i32,
    },

    /// The memory the shape and strides span (shape x strides x element size), in bytes,
    /// overflows `isize`.
    ///
    /// ```text
    /// shape [2, 2] with strides [4611686018427387903, 1] spans more than isize::MAX bytes of f32
    /// ```
    ///
    /// Test: `import_validation::extent_overflowing_isize`.
    #[error("shape {shape:?} with strides {strides:?} spans more than isize::MAX bytes of {dtype}")]
    ExtentOverflow {
        /// `shape`.
        shape: Vec<i64>,
        /// `strides`.
        strides: Vec<i64>,
        /// The dtype's name.
        dtype: String,
    },

    /// `data + byte_offset` overflows the address space.
    ///
    /// ```text
    /// byte_offset 18446744073709551613 added to data 0x... overflows the address space
    /// ```
    ///
    /// Test: `import_validation::byte_offset_overflow_and_misalignment`.
    #[error("byte_offset {byte_offset} added to data {data:#x} overflows the address space")]
    ByteOffsetOverflow {
        /// `data`.
        data: usize,
        /// `byte_offset`.
        byte_offset: u64,
    },

    /// `data + byte_offset` is not aligned for the dtype. Checked last, so a tensor
    /// refused only for this breaks no other rule: [`check_passed_on`](crate::check_passed_on)
    /// accepts it, and the Python package's `handoff.ordered` hands such host memory on
    /// unchanged to a foreign consumer, for that consumer to copy or refuse.
    ///
    /// ```text
    /// data 0x... + byte_offset 2 is not aligned to 4 bytes, as f32 needs
    /// ```
    ///
    /// Tests: `import_validation::byte_offset_overflow_and_misalignment`; for
    /// `check_passed_on`, the Python test
    /// `test_misaligned_host_memory_is_passed_on_unchanged_unless_another_field_is_wrong`.
    #[error("data {data:#x} + byte_offset {byte_offset} is not aligned to {align} bytes, as {dtype} needs")]
    Misaligned {
        /// `data`.
        data: usize,
        /// `byte_offset`.
        byte_offset: u64,
        /// The alignment the dtype needs.
        align: usize,
        /// The dtype's name.
        dtype: String,
    },

    /// `data` is null but the tensor has elements (null data with no elements is
    /// accepted).
    ///
    /// ```text
    /// data is null but the tensor has 4 elements
    /// ```
    ///
    /// Test: `import_validation::null_data_with_elements`.
    #[error("data is null but the tensor has {elements} elements")]
    NullData {
        /// The element count.
        elements: usize,
    },

    /// `data` is null but `byte_offset` is not 0: there is no address to offset from.
    ///
    /// ```text
    /// data is null but byte_offset is 2: a null data pointer takes byte_offset 0; put the address in data
    /// ```
    ///
    /// Test: `import_validation::null_data_with_a_byte_offset_is_refused`.
    #[error(
        "data is null but byte_offset is {byte_offset}: a null data pointer takes byte_offset 0; \
         put the address in data"
    )]
    NullDataOffset {
        /// `byte_offset`.
        byte_offset: u64,
    },

    /// The bytes the tensor reaches from `data + byte_offset` fall below address 0
    /// (negative strides) or past the top of the address space (one past the last byte
    /// must be an address too).
    ///
    /// ```text
    /// data 0x100 + byte_offset 0 with shape [4] and strides [-256] reaches bytes -3072..4 from there, which leaves the address space 0..=0xffffffffffffffff
    /// ```
    ///
    /// Test: `import_validation::extents_below_address_zero_or_past_the_top_are_refused`.
    #[error(
        "data {data:#x} + byte_offset {byte_offset} with shape {shape:?} and strides {strides:?} reaches \
         bytes {first_byte}..{end_byte} from there, which leaves the address space 0..={max:#x}",
        max = usize::MAX
    )]
    OutsideAddressSpace {
        /// `data`.
        data: usize,
        /// `byte_offset`.
        byte_offset: u64,
        /// `shape`.
        shape: Vec<i64>,
        /// `strides` (the compact ones when null).
        strides: Vec<i64>,
        /// The lowest byte reached, relative to `data + byte_offset` (0 or negative).
        first_byte: i64,
        /// One past the highest byte reached, relative to `data + byte_offset`.
        end_byte: u64,
    },

    /// A mutable import ([`Access::Write`](crate::Access::Write)) of a tensor whose
    /// strides reach one element from two indices (a read-only import of it is fine).
    ///
    /// ```text
    /// shape [2, 2] with strides [1, 1] reaches some element from two indices: a mutable import is refused (writes would race); import it read-only, or make it contiguous first
    /// ```
    ///
    /// Test: `import_validation::write_access_to_self_overlapping_strides_is_refused_and_reading_them_is_fine`.
    #[error(
        "shape {shape:?} with strides {strides:?} reaches some element from two indices: a mutable \
         import is refused (writes would race); import it read-only, or make it contiguous first"
    )]
    OverlappingWrite {
        /// `shape`.
        shape: Vec<i64>,
        /// `strides`.
        strides: Vec<i64>,
    },

    /// `flags` has `IS_SUBBYTE_TYPE_PADDED` for a sub-byte dtype: handoff exchanges
    /// sub-byte types packed only (on whole-byte dtypes the flag changes nothing).
    ///
    /// ```text
    /// flags has IS_SUBBYTE_TYPE_PADDED for f4e2m1fn (4 bits): handoff exchanges sub-byte dtypes packed only; pack the elements (no padding bits between them), or exchange them as u8
    /// ```
    ///
    /// Test: `import_validation::padded_sub_byte_dtypes_are_refused_and_the_flag_is_a_no_op_on_whole_bytes`.
    #[error(
        "flags has IS_SUBBYTE_TYPE_PADDED for {dtype} ({bits} bits): handoff exchanges sub-byte \
         dtypes packed only; pack the elements (no padding bits between them), or exchange them as u8"
    )]
    SubbytePadded {
        /// The dtype's name.
        dtype: String,
        /// `dtype.bits`.
        bits: u8,
    },

    /// A mutable import ([`Access::Write`](crate::Access::Write)) of a tensor whose
    /// `flags` has `READ_ONLY` (a read-only import keeps the flag).
    ///
    /// ```text
    /// flags has READ_ONLY: a mutable import is refused; import it read-only
    /// ```
    ///
    /// Test: `import_validation::read_only_refuses_mutable_import_and_is_kept_on_read`.
    #[error("flags has READ_ONLY: a mutable import is refused; import it read-only")]
    ReadOnly,

    /// `flags` has bits DLPack does not define; the flags are read right after the
    /// version, before any other field.
    ///
    /// ```text
    /// flags 0x10000000000 has bits DLPack does not define
    /// ```
    ///
    /// Test: `import_validation::is_copied_is_reported_and_unknown_flags_refused`.
    #[error("flags {flags:#x} has bits DLPack does not define")]
    UnknownFlags {
        /// `flags`.
        flags: u64,
    },
}

/// Why storage or a derived type's fields were refused. Each variant names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// A dimension or stride does not fit in `i64`.
    #[error("{field}[{axis}] is {value}: it does not fit in i64")]
    Overflow {
        /// The field (`shape`, `strides`).
        field: &'static str,
        /// The axis.
        axis: usize,
        /// The value.
        value: String,
    },
    /// A dimension or stride does not fit in the field's type on import.
    #[error("{field}[{axis}] is {value}: it does not fit in the field's type `{ty}`")]
    DoesNotFit {
        /// The field.
        field: &'static str,
        /// The axis (0 for scalars such as `byte_offset`).
        axis: usize,
        /// The value.
        value: i64,
        /// The field's type.
        ty: &'static str,
    },
    /// A fixed-size field has the wrong length on import.
    #[error("{field} has {len} dimensions but its type `{ty}` holds {expected}")]
    Rank {
        /// The field.
        field: &'static str,
        /// The hand-off's number of dimensions.
        len: usize,
        /// The field's length.
        expected: usize,
        /// The field's type.
        ty: &'static str,
    },
    /// A dimension is negative.
    #[error("shape[{axis}] is {value}: dimensions must be >= 0")]
    NegativeDimension {
        /// The axis.
        axis: usize,
        /// The value.
        value: i64,
    },
    /// Shape and strides differ in length.
    #[error("shape has {shape_len} dimensions but strides has {strides_len}; give one stride per dimension")]
    StridesLength {
        /// The shape's length.
        shape_len: usize,
        /// The strides' length.
        strides_len: usize,
    },
    /// The tensor reaches outside its storage.
    #[error(
        "shape {shape:?} with strides {strides:?} and byte_offset {byte_offset} of {dtype} spans bytes \
         {start}..{end}, but the storage holds {len} bytes; make the shape fit the data"
    )]
    OutOfBounds {
        /// The shape.
        shape: Vec<i64>,
        /// The strides (compact ones when none were given).
        strides: Vec<i64>,
        /// The byte offset.
        byte_offset: u64,
        /// The dtype's name.
        dtype: String,
        /// The first byte reached.
        start: i128,
        /// One past the last byte reached.
        end: i128,
        /// The storage's length in bytes.
        len: usize,
    },
    /// The hand-off's dtype is not the one the type holds.
    #[error("dtype is {found}, but `{ty}` holds {expected}; convert the tensor to {expected} first")]
    Dtype {
        /// The type imported into.
        ty: &'static str,
        /// What it holds.
        expected: String,
        /// What the hand-off has.
        found: String,
    },
    /// The hand-off's elements have another size than the storage's.
    #[error("dtype {found} has {bits} bits per element, but `{ty}` stores {elem_bits}-bit elements")]
    ElementSize {
        /// The storage type.
        ty: &'static str,
        /// The hand-off's dtype.
        found: String,
        /// Its bits.
        bits: u8,
        /// The storage's element bits.
        elem_bits: usize,
    },
    /// The hand-off is strided, and the type imported into has no strides field.
    #[error(
        "strides {strides:?} are not compact, and `{ty}` has no `#[dlpack(strides)]` field; add one, or make the tensor contiguous first"
    )]
    NotCompact {
        /// The type imported into.
        ty: &'static str,
        /// The hand-off's strides.
        strides: Vec<i64>,
    },
    /// The device a field names is not the one the storage's memory is on.
    #[error(
        "{field} is {device}, but the storage's memory is on {storage}; \
         set {field} to {storage}, or put the data in {device} storage"
    )]
    DeviceMismatch {
        /// The field (`device`).
        field: &'static str,
        /// The device the field names.
        device: Device,
        /// The device the storage's memory is on ([`Storage::device`](crate::storage::Storage::device)).
        storage: Device,
    },
    /// Negative strides reach before the first element, which storage cannot adopt.
    #[error(
        "strides {strides:?} reach before the first element; `{ty}` adopts tensors with non-negative strides only"
    )]
    NegativeStrides {
        /// The storage type.
        ty: &'static str,
        /// The strides.
        strides: Vec<i64>,
    },
}

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Self {
        Error::Storage(Box::new(e))
    }
}
