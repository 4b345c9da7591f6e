//! The harness shared by handoff's fuzz targets: foreign DLPack descriptors built
//! from fuzz input, owned by a context whose deleter counts its calls, and the
//! oracle that checks every outcome of `Handoff::from_raw` / `from_raw_legacy`.
//!
//! # What is sound to fuzz
//!
//! `Handoff::from_raw` promises to read, in order: the version (versioned only);
//! then, once the major version matches, the scalar fields; and `shape` / `strides`
//! only as `ndim` entries, only when `0 <= ndim <= MAX_NDIM`. It never dereferences
//! `data`. So the harness, playing an honest-but-wrong C producer, makes:
//!
//! - every scalar field arbitrary (version, flags, device, dtype code/bits/lanes,
//!   ndim, byte offset);
//! - `shape` and `strides` real heap arrays of exactly `ndim` entries when `ndim` is
//!   in bounds (a producer that lies about `ndim` *within* bounds is a producer
//!   overrunning its own arrays, which no consumer can detect: out of scope), and
//!   of an arbitrary, usually shorter, length when `ndim` is out of bounds, so that
//!   any read the validator makes past them is an AddressSanitizer report
//!   (cargo-fuzz builds with ASan);
//! - `data` null or a pointer into (or one past) a real allocation, at any offset
//!   and so any alignment. The validator never reads through it; the oracle reads
//!   the first and last element only when it has computed, independently, that the
//!   whole extent lies in the allocation.
//!
//! Shape values, strides and byte offsets are arbitrary: DLPack carries no
//! allocation size, so an importer cannot know whether a producer's extent fits its
//! memory. What it promises, and what the oracle checks, is that an accepted
//! tensor's extent fits in `isize` and that everything reads back as given.
//!
//! A descriptor may come with a NULL deleter (DLPack allows it: the producer keeps
//! ownership and frees the memory itself once the consumer is done). Then the
//! harness, as that producer, frees everything only after the consumer has let go
//! ([`Built::release`]); any later use by handoff is a use-after-free ASan reports.
//!
//! The managed tensors are built by `handoff_tests::Foreign`, the integration tests'
//! builder, whose deleter counts its calls and frees the metadata and the data.

use arbitrary::{Arbitrary, Unstructured};
use handoff::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion,
};
use handoff::{Access, Device, Error, Handoff, MAX_NDIM, Stream, ValidationError};
pub use handoff_tests::DeleterCount as Count;
use handoff_tests::Foreign;
use std::ffi::c_void;

/// Where the data pointer points.
#[derive(Debug, Clone, Copy)]
pub enum Data {
    /// Null.
    Null,
    /// `offset` bytes into the allocation (at most one past its end).
    Into(usize),
}

/// A foreign descriptor, field by field.
#[derive(Debug, Clone)]
pub struct Desc {
    pub legacy: bool,
    pub version: DLPackVersion,
    pub flags: u64,
    pub device: DLDevice,
    pub dtype: DLDataType,
    pub ndim: i32,
    /// Exactly `ndim` entries when `0 <= ndim <= MAX_NDIM`; otherwise any length.
    pub shape: Vec<i64>,
    pub null_shape: bool,
    /// `None` is a null strides pointer; otherwise as long as `shape`.
    pub strides: Option<Vec<i64>>,
    pub byte_offset: u64,
    pub data: Data,
    /// Bytes of the data allocation.
    pub alloc_len: usize,
    pub access: Access,
    /// The managed tensor's deleter is NULL: the producer frees it itself.
    pub null_deleter: bool,
}

fn pick<T: Copy>(
    u: &mut Unstructured<'_>,
    common: &[T],
    any: impl FnOnce(&mut Unstructured<'_>) -> arbitrary::Result<T>,
) -> arbitrary::Result<T> {
    // Mostly values that get past earlier checks, sometimes anything.
    if u.ratio(7, 8)? { Ok(*u.choose(common)?) } else { any(u) }
}

const DTYPES: &[(u8, u8)] = &[
    (0, 8),
    (0, 16),
    (0, 32),
    (0, 64),
    (1, 8),
    (1, 16),
    (1, 32),
    (1, 64),
    (2, 16),
    (2, 32),
    (2, 64),
    (4, 16),
    (5, 64),
    (5, 128),
    (6, 8),
    (7, 8),
    (8, 8),
    (9, 8),
    (10, 8),
    (11, 8),
    (12, 8),
    (13, 8),
    (14, 8),
    (15, 6),
    (16, 6),
    (17, 4),
    (2, 24),
    (6, 1),
];

impl<'a> Arbitrary<'a> for Desc {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let legacy = u.ratio(1, 4)?;
        let major = pick(u, &[1u32, 1, 1, 0, 2], |u| u.arbitrary())?;
        let minor = pick(u, &[0u32, 1, 2, 3], |u| u.arbitrary())?;
        let flags = pick(u, &[0u64, 0, 1, 2, 3, 4, 7], |u| u.arbitrary())?;
        let device_type = pick(u, &[1u32, 1, 2, 3, 12, 7, 10], |u| u.arbitrary())?;
        let device_id = pick(u, &[0i32, 0, 1, 7, -1], |u| u.arbitrary())?;
        let (code, bits) = pick(u, DTYPES, |u| Ok((u.arbitrary()?, u.arbitrary()?)))?;
        let lanes = pick(u, &[1u16, 1, 1, 0, 2, 4], |u| u.arbitrary())?;
        let ndim = pick(u, &[0i32, 1, 1, 2, 2, 3, 4, 8, 64, 65, -1], |u| u.arbitrary())?;
        let in_bounds = (0..=MAX_NDIM).contains(&ndim);
        let len = if in_bounds { ndim as usize } else { u.int_in_range(0..=4)? };
        let mut shape = Vec::with_capacity(len);
        for _ in 0..len {
            shape.push(pick(u, &[0i64, 1, 1, 2, 3, 4, 7, 16, -1, i64::MAX, 1 << 31], |u| u.arbitrary())?);
        }
        let null_shape = u.ratio(1, 32)?;
        let strides = if u.ratio(1, 6)? {
            None
        } else if u.ratio(1, 2)? {
            // Compact row-major, usually right.
            let mut s = vec![1i64; len];
            for i in (0..len.saturating_sub(1)).rev() {
                s[i] = s[i + 1].wrapping_mul(shape[i + 1].max(1));
            }
            Some(s)
        } else {
            let mut s = Vec::with_capacity(len);
            for _ in 0..len {
                s.push(pick(u, &[0i64, 1, 2, -1, 3, 8, i64::MAX, i64::MIN, 1 << 40], |u| u.arbitrary())?);
            }
            Some(s)
        };
        let byte_offset = pick(u, &[0u64, 0, 0, 1, 2, 4, 8, 16, u64::MAX, u64::MAX - 3], |u| u.arbitrary())?;
        let alloc_len = u.int_in_range(0..=512)?;
        let data = if u.ratio(1, 8)? { Data::Null } else { Data::Into(u.int_in_range(0..=alloc_len)?) };
        let access = if u.arbitrary()? { Access::Write } else { Access::Read };
        let null_deleter = u.ratio(1, 8)?;
        Ok(Desc {
            legacy,
            version: DLPackVersion { major, minor },
            flags,
            device: DLDevice { device_type: DLDeviceType(device_type), device_id },
            dtype: DLDataType::new(DLDataTypeCode(code), bits, lanes),
            ndim,
            shape,
            null_shape,
            strides,
            byte_offset,
            data,
            alloc_len,
            access,
            null_deleter,
        })
    }
}

/// The deleter a producer keeps for itself when it gives a NULL one.
enum OwnFree {
    Versioned(unsafe extern "C" fn(*mut DLManagedTensorVersioned)),
    Legacy(unsafe extern "C" fn(*mut DLManagedTensor)),
}

/// A descriptor materialised as a foreign managed tensor.
pub struct Built {
    /// Calls of the deleter (for a NULL deleter: of the producer's own free).
    pub count: Count,
    pub versioned: *mut DLManagedTensorVersioned,
    pub legacy: *mut DLManagedTensor,
    /// The data pointer given (null or into the allocation).
    pub data: *mut c_void,
    /// The allocation's start and length in bytes.
    pub alloc: (usize, usize),
    /// With a NULL deleter: the free the producer does itself, once the consumer is done.
    own_free: Option<OwnFree>,
}

impl Built {
    /// Whether the managed tensor's deleter is NULL.
    pub fn null_deleter(&self) -> bool {
        self.own_free.is_some()
    }

    /// The consumer is done with the tensor (dropped, or refused it): its deleter must
    /// have run exactly once, or, when it is NULL, nothing ran and the producer frees
    /// the memory now (a later use by the consumer is a use-after-free ASan reports).
    pub fn release(&mut self, what: &str) {
        match self.own_free.take() {
            None => assert_eq!(self.count.get(), 1, "{what}: the deleter must have run exactly once"),
            Some(free) => {
                assert_eq!(
                    self.count.get(),
                    0,
                    "{what}: a NULL deleter, yet the producer's memory was freed"
                );
                // SAFETY: the pointer and the function were made together by
                // `Foreign`; the consumer is done with it and has no deleter to call.
                unsafe {
                    match free {
                        OwnFree::Versioned(f) => f(self.versioned),
                        OwnFree::Legacy(f) => f(self.legacy),
                    }
                }
                assert_eq!(self.count.get(), 1);
            }
        }
    }
}

impl Desc {
    /// Builds the managed tensor (versioned or legacy as `self.legacy` says).
    pub fn build(&self) -> Built {
        let mut bytes = vec![0u64; self.alloc_len.div_ceil(8)];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = 0x0101_0101_0101_0101u64.wrapping_mul(i as u64 + 1);
        }
        // Moving the Vec into the builder keeps its heap buffer where it is.
        let base = bytes.as_mut_ptr() as usize;
        let data = match self.data {
            Data::Null => 0,
            // offset <= alloc_len <= the Vec's byte length: in or one past it.
            Data::Into(off) => base + off,
        };
        let foreign = Foreign {
            bytes,
            data: Some(data),
            device: self.device,
            dtype: self.dtype,
            ndim: Some(self.ndim),
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            null_shape: self.null_shape,
            byte_offset: self.byte_offset,
            flags: self.flags,
            version: self.version,
        };
        let (mut versioned, mut legacy) = (std::ptr::null_mut(), std::ptr::null_mut());
        let (count, free) = if self.legacy {
            let (m, count) = foreign.legacy();
            legacy = m;
            // SAFETY: `m` is the fresh managed tensor `Foreign` just made, ours alone.
            (count, unsafe { (*m).deleter.take() }.map(OwnFree::Legacy))
        } else {
            let (m, count) = foreign.versioned();
            versioned = m;
            // SAFETY: as above.
            (count, unsafe { (*m).deleter.take() }.map(OwnFree::Versioned))
        };
        let own_free = if self.null_deleter {
            free
        } else {
            // SAFETY: as above: the deleter goes back in place.
            unsafe {
                match free {
                    Some(OwnFree::Legacy(f)) => (*legacy).deleter = Some(f),
                    Some(OwnFree::Versioned(f)) => (*versioned).deleter = Some(f),
                    None => unreachable!("Foreign always sets a deleter"),
                }
            }
            None
        };
        Built { count, versioned, legacy, data: data as *mut c_void, alloc: (base, self.alloc_len), own_free }
    }

    /// Imports it through `from_raw` or `from_raw_legacy` on `consumer`.
    pub fn import(&self, consumer: &Stream) -> (Result<Handoff, Error>, Built) {
        let b = self.build();
        // SAFETY: a fresh managed tensor owned by this call, built as the module docs say.
        let r = unsafe {
            if self.legacy {
                Handoff::from_raw_legacy(b.legacy, consumer, self.access)
            } else {
                Handoff::from_raw(b.versioned, consumer, self.access)
            }
        };
        (r, b)
    }

    fn flags(&self) -> u64 {
        if self.legacy { 0 } else { self.flags }
    }
}

/// Compact row-major strides of `shape`, `None` when they overflow `i64`.
pub fn compact(shape: &[i64]) -> Option<Vec<i64>> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].checked_mul(shape[i + 1])?;
    }
    Some(s)
}

/// Whether `strides` lay `shape` out compact and row-major, by DLPack's and
/// PyTorch's reading (strides of size-1 dimensions, and of tensors with no elements,
/// do not matter); the harness's own version of handoff's one rule.
pub fn is_compact(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let Some(want) = compact(shape) else { return false };
    shape.iter().zip(strides).zip(&want).all(|((&d, s), w)| d == 1 || s == w)
}

/// The bytes `shape`/`strides` of `bits`-bit elements reach, relative to the first
/// element: `(lo, hi)`, the lowest byte and one past the highest (sub-byte elements
/// packed); `None` without elements. Computed here on its own, in bits, for the
/// oracles (shape and stride values must keep the sums within `i128`).
pub fn extent(shape: &[i64], strides: &[i64], bits: u32) -> Option<(i128, i128)> {
    if shape.iter().any(|&d| d <= 0) {
        return None;
    }
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&d, &s) in shape.iter().zip(strides) {
        let step = (d as i128 - 1) * s as i128;
        if step < 0 { lo += step } else { hi += step }
    }
    let bits = bits as i128;
    Some(((lo * bits).div_euclid(8), ((hi + 1) * bits + 7).div_euclid(8)))
}

/// The byte the producer wrote at offset `k` of a harness allocation (see `Desc::build`).
pub fn byte_at(k: usize) -> u8 {
    0x0101_0101_0101_0101u64.wrapping_mul(k as u64 / 8 + 1).to_le_bytes()[k % 8]
}

/// Checks an outcome of [`Desc::import`] against the descriptor, without dropping it.
///
/// # Panics
/// When the outcome is inconsistent: the fuzzer reports the input.
pub fn check_outcome(d: &Desc, r: &Result<Handoff, Error>, b: &Built) {
    let known = 0b111u64;
    match r {
        Err(Error::Validation(e)) => {
            let expected = if b.null_deleter() { 0 } else { 1 };
            assert_eq!(b.count.get(), expected, "deleter must have run exactly once on error {e:?}");
            assert!(!e.to_string().is_empty());
            // What must be refused first, whatever else is wrong.
            if !d.legacy && d.version.major != 1 {
                assert_eq!(*e, ValidationError::IncompatibleVersion { major: d.version.major, expected: 1 });
            } else if d.flags() & !known != 0 {
                assert_eq!(*e, ValidationError::UnknownFlags { flags: d.flags() });
            }
        }
        Err(e) => panic!("an import error that is not a ValidationError: {e}"),
        Ok(h) => {
            assert_eq!(b.count.get(), 0, "deleter ran while the hand-off lives");
            assert!(d.legacy || d.version.major == 1);
            assert_eq!(d.flags() & !known, 0);
            assert!(
                !(d.access == Access::Write && d.flags() & 1 != 0),
                "a READ_ONLY tensor imported for write"
            );
            assert_eq!(h.device(), Device::from_dlpack(d.device).expect("accepted device"));
            assert_eq!(h.dtype(), d.dtype);
            handoff::dtype::check(d.dtype).expect("accepted dtype is valid");
            assert!((0..=MAX_NDIM).contains(&d.ndim));
            assert!(!d.null_shape || d.ndim == 0);
            assert_eq!(h.shape(), &d.shape[..]);
            assert!(d.shape.iter().all(|&x| x >= 0));
            let strides = match &d.strides {
                Some(s) => s.clone(),
                None => {
                    assert!(
                        d.legacy || d.ndim == 0 || !d.version.supports(DLPackVersion { major: 1, minor: 2 })
                    );
                    compact(&d.shape).expect("compact strides of an accepted shape")
                }
            };
            // Compact memory carries canonical strides (those of size-1 dimensions, and
            // of tensors with no elements, do not matter).
            let strides = if is_compact(&d.shape, &strides) {
                compact(&d.shape).expect("canonical strides of an accepted compact tensor")
            } else {
                strides
            };
            assert_eq!(h.strides(), &strides[..]);
            assert_eq!(h.data(), b.data);
            assert_eq!(h.byte_offset(), d.byte_offset);
            assert_eq!(h.is_read_only(), d.flags() & 1 != 0);
            assert_eq!(h.is_copied(), d.flags() & 2 != 0);
            assert_eq!(h.consumer_stream(), &Stream::host());
            // Element count and bytes, independently and checked.
            let elements = d.shape.iter().try_fold(1u128, |a, &x| a.checked_mul(x as u128)).unwrap();
            assert_eq!(h.num_elements() as u128, elements);
            let bytes = (elements * d.dtype.bits as u128).div_ceil(8);
            assert!(bytes <= isize::MAX as u128);
            assert_eq!(h.num_bytes() as u128, bytes);
            if elements > 0 {
                assert!(!b.data.is_null(), "null data accepted with {elements} elements");
                let start = b.data as u128 + d.byte_offset as u128;
                let align = handoff::dtype::alignment(d.dtype) as u128;
                assert_eq!(start % align, 0, "misaligned start accepted");
                // The extent, in bytes from the first element: [lo, hi).
                let esize = d.dtype.element_size() as i128;
                let (mut lo, mut hi) = (0i128, 0i128);
                for (&n, &s) in d.shape.iter().zip(&strides) {
                    let reach = (n as i128 - 1) * s as i128;
                    if reach < 0 { lo += reach } else { hi += reach }
                }
                let span = (hi - lo + 1) * esize;
                assert!(span <= isize::MAX as i128, "extent of {span} bytes accepted");
                let (a0, alen) = (b.alloc.0 as i128, b.alloc.1 as i128);
                let first = start as i128 + lo * esize;
                let last = start as i128 + hi * esize + esize;
                if first >= a0 && last <= a0 + alen {
                    // The producer told the truth: the whole extent is in its memory.
                    // Read the lowest and highest element through the hand-off's
                    // pointer (ASan checks these are in the allocation).
                    let p = h.data_ptr();
                    assert_eq!(p as i128, start as i128);
                    // SAFETY: both byte ranges lie in the live allocation (checked above).
                    unsafe {
                        let lo_p = p.wrapping_offset((lo * esize) as isize);
                        let hi_p = p.wrapping_offset((hi * esize) as isize);
                        std::hint::black_box(std::ptr::read_volatile(lo_p));
                        std::hint::black_box(std::ptr::read_volatile(hi_p.add(esize as usize - 1)));
                    }
                    if strides == compact(&d.shape).unwrap_or_default() {
                        assert!(h.is_contiguous());
                        assert!(h.num_bytes() as i128 <= a0 + alen - start as i128);
                    }
                }
            }
        }
    }
}

/// Target 1: import, check, drop, check the deleter ran exactly once.
pub fn fuzz_import(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(d) = Desc::arbitrary(&mut u) else { return };
    let host = Stream::host();
    let (r, mut b) = d.import(&host);
    check_outcome(&d, &r, &b);
    if let Ok(h) = r {
        // A round trip through the raw pointer, as a C consumer would take it.
        let raw = if u.arbitrary().unwrap_or(false) {
            Some(h.into_raw())
        } else {
            drop(h);
            None
        };
        if let Some(raw) = raw {
            assert_eq!(b.count.get(), 0);
            // SAFETY: owned by us after into_raw; the deleter is the hand-off's own.
            unsafe {
                let del = (*raw).deleter.expect("a hand-off always has a deleter");
                del(raw);
            }
        }
    }
    // Host consumer: the release is immediate (no reaper involved).
    b.release("after the hand-off is dropped");
}

pub mod consume;
pub mod export;
pub mod fake;
pub mod reaper_faults;
pub mod registry;
pub mod xla;
