//! Target `export`: the export paths, and several threads dropping hand-offs and
//! flushing at once.
//!
//! Each input makes up to eight values and exports each to the host or to a stream of
//! a fake device (see [`crate::fake`]: streams that complete at once, late, or when
//! flushed; waits that fail as the input says):
//!
//! - `Handoff::with_keep_alive` over a `Vec<u64>` keep-alive, with an arbitrary
//!   description (dtype, shape, strides, byte offset, read-only, is-copied; in the
//!   storage or not), a `describe` that may fail, and `Release::AfterConsumer` or
//!   `Immediately`;
//! - two `#[derive(DlpackExchange)]` types over `Vec` storage with arbitrary shape,
//!   strides and byte offset fields: [`Bytes`] (`Vec<u8>`, a `DataType` field, a
//!   device field, a producer stream field) and [`Floats`] (`Vec<f32>`, `usize`
//!   shape, `i64` strides, `usize` offset, no stream).
//!
//! Oracle, per value: a derived `describe` is accepted exactly when the harness's own
//! check passes (device is the storage's, dtype valid, dimensions >= 0, one stride per
//! dimension, and the extent — computed here in bits — lies in the storage), and then
//! every byte the hand-off reaches is read (ASan checks the reads stay in the `Vec`);
//! `with_keep_alive` gives back `describe`'s error, or refuses exactly the invalid
//! descriptions, or yields a hand-off equal to the description (compact strides
//! canonical); an `Ok` export is read through `Elements::<u8>::adopt` + `as_slice`
//! (compared with the storage's bytes) when its extent is in the storage.
//!
//! Then the hand-offs (or the `Elements` adopting them, or their raw DLPack pointers)
//! are spread over 1–3 threads, which enqueue "kernels" on the consumer streams, drop
//! them (or call the DLPack deleter) and call `flush_stream`/`flush`, all at once.
//! Every keep-alive holds a [`Guard`] whose drop checks: dropped at most once, and,
//! for a release after the consumer, only once the work enqueued on the consumer stream
//! before the drop has completed. At the end every flush returned (within 10 s),
//! `pending()` is 0 and every guard dropped exactly once.

use crate::fake::{self, Fake, Slot, Spec, ledger};
use crate::{byte_at, compact, extent};
use arbitrary::Unstructured;
use handoff::dtype::DataType;
use handoff::ffi::DLManagedTensorVersioned;
use handoff::storage::{Adopt, Elements, StorageError};
use handoff::{
    Device, Error, Export, Handoff, Ready, Release, Stream, StreamOrdered, TensorDesc, ValidationError,
    reaper,
};
use std::borrow::Cow;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// Lives in a keep-alive; its drop checks when the keep-alive goes.
pub struct Guard(usize);

impl Guard {
    fn new() -> Guard {
        let mut l = ledger();
        l.slots.push(Slot { armed: true, ..Slot::default() });
        Guard(l.slots.len() - 1)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut l = ledger();
        let fake = l.fake.clone();
        l.slots[self.0].drop_checked(self.0, fake.as_deref());
    }
}

/// A derived type over bytes, with every field the derive takes.
#[derive(handoff::DlpackExchange)]
pub struct Bytes {
    #[dlpack(data)]
    data: Vec<u8>,
    #[dlpack(shape)]
    shape: Vec<i64>,
    #[dlpack(strides)]
    strides: Option<Vec<i64>>,
    #[dlpack(byte_offset)]
    byte_offset: u64,
    #[dlpack(dtype)]
    dtype: DataType,
    #[dlpack(device)]
    device: Device,
    #[dlpack(stream)]
    stream: Option<Stream>,
    _guard: Guard,
}

/// A derived type over `f32`s: the dtype from the storage, host-ordered.
#[derive(handoff::DlpackExchange)]
pub struct Floats {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<i64>,
    #[dlpack(byte_offset)]
    byte_offset: usize,
    _guard: Guard,
}

/// `with_keep_alive`'s keep-alive.
struct Keep {
    data: Vec<u64>,
    _guard: Guard,
}

const DTYPES: &[DataType] = &[
    DataType::U8,
    DataType::I16,
    DataType::F32,
    DataType::F64,
    DataType::C128,
    DataType::F4E2M1FN,
    DataType::F6E2M3FN,
    DataType::BOOL,
];

/// A layout from fuzz input: small, mostly fitting values, sometimes not.
struct Layout {
    dtype: DataType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    byte_offset: u64,
    /// Storage bytes.
    len: usize,
}

impl Layout {
    fn arbitrary(u: &mut Unstructured<'_>) -> arbitrary::Result<Layout> {
        let dtype = if u.ratio(1, 16)? {
            handoff::ffi::DLDataType::new(
                handoff::ffi::DLDataTypeCode(u.int_in_range(0..=20)?),
                u.arbitrary()?,
                1,
            )
        } else {
            *u.choose(DTYPES)?
        };
        let ndim = u.int_in_range(0..=4usize)?;
        let big = [0i64, 1, 2, 3, 4, 5, 1 << 20, 1 << 40, -1];
        let shape: Vec<i64> = (0..ndim)
            .map(|_| if u.ratio(1, 10)? { Ok(*u.choose(&big)?) } else { u.int_in_range(0..=5) })
            .collect::<arbitrary::Result<_>>()?;
        let strides = match u.int_in_range(0..=3)? {
            0 => None,
            1 => compact(&shape),
            _ => {
                let n = if u.ratio(1, 10)? { u.int_in_range(0..=5)? } else { ndim };
                let odd = [0i64, -1, 1 << 20, -(1 << 20), 1 << 40];
                Some(
                    (0..n)
                        .map(|_| if u.ratio(1, 8)? { Ok(*u.choose(&odd)?) } else { u.int_in_range(-8..=8) })
                        .collect::<arbitrary::Result<_>>()?,
                )
            }
        };
        let bits = u32::from(dtype.bits.max(1));
        let strides_or_compact = strides.clone().or_else(|| compact(&shape)).unwrap_or_default();
        let ext = if strides_or_compact.len() == shape.len() {
            extent(&shape, &strides_or_compact, bits)
        } else {
            None
        };
        let (lo, hi) = ext.unwrap_or((0, 0));
        let es = u64::from(bits.div_ceil(8));
        // Usually an offset that leaves room for negative strides, sometimes any.
        let byte_offset = match u.int_in_range(0..=5)? {
            0 => u.int_in_range(0..=64)?,
            1 => *u.choose(&[u64::MAX, 1 << 40, 3])?,
            _ => ((-lo).max(0) as u64).div_ceil(es) * es + es * u.int_in_range(0..=2)?,
        };
        let need = (byte_offset as i128 + hi).clamp(0, 4096) as usize;
        let len = if u.ratio(3, 4)? { need + u.int_in_range(0..=8)? } else { u.int_in_range(0..=256)? };
        Ok(Layout { dtype, shape, strides, byte_offset, len })
    }

    /// Whether a derived `describe` must accept it over `len` bytes on the host.
    fn fits(&self, len: usize) -> bool {
        if handoff::dtype::check(self.dtype).is_err() || self.shape.iter().any(|&d| d < 0) {
            return false;
        }
        let Some(strides) = self.strides.clone().or_else(|| compact(&self.shape)) else { return false };
        if strides.len() != self.shape.len() {
            return false;
        }
        match extent(&self.shape, &strides, u32::from(self.dtype.bits)) {
            None => true,
            Some((lo, hi)) => {
                let off = self.byte_offset as i128;
                off + lo >= 0 && off + hi <= len as i128
            }
        }
    }

    /// Whether a hand-off cannot carry it (`ShapeOverflow`): its elements take more
    /// than `isize::MAX` bytes (however little memory zero strides make them reach),
    /// or its non-zero dimensions multiply past `isize::MAX` (an empty shape such as
    /// `[0, 2^40, 2^40]`, whatever the order of its dimensions).
    fn unrepresentable(&self) -> bool {
        let n = self.shape.iter().try_fold(1u128, |a, &d| a.checked_mul(u128::try_from(d).ok()?));
        let too_many = n
            .and_then(|n| n.checked_mul(u128::from(self.dtype.bits)))
            .is_none_or(|b| b.div_ceil(8) > isize::MAX as u128);
        let nonzero = self
            .shape
            .iter()
            .filter(|&&d| d != 0)
            .try_fold(1u128, |a, &d| a.checked_mul(u128::try_from(d).ok()?));
        too_many || nonzero.is_none_or(|n| n > isize::MAX as u128)
    }
}

/// What a thread drops (its fields are only ever dropped).
#[allow(dead_code)]
enum Droppable {
    Handoff(Handoff),
    Raw(RawHandoff),
    Adopted(Elements<u8>),
}

struct RawHandoff(*mut DLManagedTensorVersioned);
// SAFETY: a hand-off's DLPack pointer, owned alone by this value; hand-offs are Send.
unsafe impl Send for RawHandoff {}

impl Drop for RawHandoff {
    fn drop(&mut self) {
        // SAFETY: from `Handoff::into_raw`, called once: as a C consumer would.
        unsafe {
            let del = (*self.0).deleter.expect("a hand-off always has a deleter");
            del(self.0);
        }
    }
}

struct Out {
    what: Droppable,
    slot: usize,
    lane: Option<usize>,
    kernel: bool,
}

/// Reads every byte an accepted hand-off reaches, when its extent is in `storage`
/// (address, bytes): through `Elements::<u8>` when the extent does not reach before
/// the first element, else the lowest and highest byte; returns what to drop later.
fn read(h: Handoff, storage: (usize, usize)) -> Droppable {
    let Some((lo, hi)) = extent(h.shape(), h.strides(), u32::from(h.dtype().bits)) else {
        return Droppable::Handoff(h);
    };
    let first = h.data_ptr() as i128 - storage.0 as i128;
    if first + lo < 0 || first + hi > storage.1 as i128 {
        // with_keep_alive was told of memory outside the keep-alive: not read.
        return Droppable::Handoff(h);
    }
    if lo < 0 {
        // SAFETY: both bytes are in the storage (checked just above), which lives.
        unsafe {
            std::hint::black_box(std::ptr::read_volatile(h.data_ptr().offset(lo as isize)));
            std::hint::black_box(std::ptr::read_volatile(h.data_ptr().offset(hi as isize - 1)));
        }
        return Droppable::Handoff(h);
    }
    let e = Elements::<u8>::adopt(h).expect("u8 storage adopts any tensor with non-negative extent");
    let s = e.as_slice().expect("host bytes");
    assert_eq!(s.len() as i128, hi);
    std::hint::black_box(s.iter().map(|&b| b as u64).sum::<u64>());
    Droppable::Adopted(e)
}

/// Exports one value; returns what to drop, or `None` when it was refused.
fn one(u: &mut Unstructured<'_>, streams: &[Stream]) -> arbitrary::Result<Option<Out>> {
    let lane = u.int_in_range(0..=streams.len())?.checked_sub(1);
    let consumer = lane.map_or_else(Stream::host, |l| streams[l].clone());
    let layout = Layout::arbitrary(u)?;
    let (kernel, raw) = (u.arbitrary()?, u.ratio(1, 4)?);
    let guard = Guard::new();
    let slot = guard.0;
    // The result, the storage's (address, bytes), and whether the release is at once.
    let (r, storage, immediate) = match u.int_in_range(0..=2)? {
        0 => {
            // with_keep_alive: any description over the keep-alive's memory.
            let describe_fails = u.ratio(1, 16)?;
            let release = if u.ratio(1, 4)? { Release::Immediately } else { Release::AfterConsumer };
            let (read_only, is_copied) = (u.arbitrary()?, u.arbitrary()?);
            let keep = Keep { data: (0..layout.len.div_ceil(8) as u64).collect(), _guard: guard };
            let storage = (keep.data.as_ptr() as usize, layout.len.div_ceil(8) * 8);
            let align = handoff::dtype::alignment(layout.dtype) as u64;
            let start = (storage.0 as u64).checked_add(layout.byte_offset);
            let valid =
                layout.fits(storage.1) && !layout.unrepresentable() && start.is_some_and(|s| s % align == 0);
            let r = Handoff::with_keep_alive(
                keep,
                |k| {
                    if describe_fails {
                        return Err(Error::Adapter { adapter: "fuzz", message: "describe failed".into() });
                    }
                    let data = k.data.as_ptr() as *mut std::ffi::c_void;
                    let mut d = TensorDesc::new(data, Device::Host, layout.dtype, layout.shape.clone())
                        .with_byte_offset(layout.byte_offset);
                    d.strides = layout.strides.clone().map(Cow::Owned);
                    d.read_only = read_only;
                    d.is_copied = is_copied;
                    Ok(d)
                },
                &consumer,
                Ready::Elided,
                release,
            );
            match &r {
                Err(Error::Adapter { adapter: "fuzz", .. }) => assert!(describe_fails),
                Err(e) => {
                    assert!(!describe_fails && !valid, "with_keep_alive refused a valid description: {e}");
                    assert!(
                        matches!(e, Error::Validation(_) | Error::Adapter { adapter: "export", .. }),
                        "{e}"
                    );
                }
                Ok(h) => {
                    assert!(!describe_fails);
                    check_same(h, &layout, storage.0);
                    assert_eq!((h.is_read_only(), h.is_copied()), (read_only, is_copied));
                }
            }
            // Immediately: the caller says the memory goes back in order by itself.
            (r, storage, release == Release::Immediately)
        }
        1 => {
            let device =
                if u.ratio(1, 8)? { *u.choose(&[Device::Cuda(0), Device::Mock(90)])? } else { Device::Host };
            let producer = u.int_in_range(0..=streams.len())?.checked_sub(1);
            let data: Vec<u8> = (0..layout.len).map(byte_at).collect();
            let storage = (data.as_ptr() as usize, data.len());
            let v = Bytes {
                data,
                shape: layout.shape.clone(),
                strides: layout.strides.clone(),
                byte_offset: layout.byte_offset,
                dtype: layout.dtype,
                device,
                stream: producer.map(|p| streams[p].clone()),
                _guard: guard,
            };
            let fits = device == Device::Host && layout.fits(storage.1);
            check_describe(v.describe(), fits, &layout, storage.0);
            // A `Vec` is freed by the host when the value drops, not in order on its
            // stream: even to a consumer on the producer's own stream, the release
            // must wait for the consumer's queued work (fuzz/regressions/export/
            // derived-vec-stream-released-at-once found it released at once).
            assert_eq!(v.release_stream(), None, "a derived type over Vec storage releases in stream order");
            let r = v.export(&consumer);
            check_export(&r, fits, &layout, storage.0);
            (r, storage, false)
        }
        _ => {
            let n = layout.len.div_ceil(4);
            let data: Vec<f32> = (0..n).map(|i| f32::from_le_bytes([byte_at(4 * i); 4])).collect();
            let storage = (data.as_ptr() as usize, n * 4);
            let strides = layout.strides.clone().or_else(|| compact(&layout.shape)).unwrap_or_default();
            let v = Floats {
                data,
                // A negative dimension becomes one that does not fit in i64.
                shape: layout.shape.iter().map(|&d| d as usize).collect(),
                strides: strides.clone(),
                byte_offset: layout.byte_offset as usize,
                _guard: guard,
            };
            let l = Layout { dtype: DataType::F32, strides: Some(strides), ..layout };
            let fits = l.fits(storage.1);
            check_describe(v.describe(), fits, &l, storage.0);
            let r = v.export(&consumer);
            check_export(&r, fits, &l, storage.0);
            (r, storage, false)
        }
    };
    // A refused value's keep-alive is dropped (at once, or behind the consumer
    // stream): the final check finds it dropped.
    let Ok(h) = r else { return Ok(None) };
    let lane = lane.filter(|_| !immediate);
    {
        let fake = ledger().fake.clone().expect("a fake device");
        let need = lane.map_or(0, |l| fake.work(l));
        let mut l = ledger();
        l.slots[slot].lane = lane;
        l.slots[slot].need = need;
    }
    let what = match read(h, storage) {
        Droppable::Handoff(h) if raw => Droppable::Raw(RawHandoff(h.into_raw())),
        w => w,
    };
    Ok(Some(Out { what, slot, lane, kernel }))
}

/// A hand-off equals the description it was made from.
fn check_same(h: &Handoff, l: &Layout, data: usize) {
    assert_eq!(h.data() as usize, data);
    assert_eq!(h.device(), Device::Host);
    assert_eq!(h.dtype(), l.dtype);
    assert_eq!(h.shape(), &l.shape[..]);
    assert_eq!(h.byte_offset(), l.byte_offset);
    let given = l.strides.clone().or_else(|| compact(&l.shape)).expect("accepted strides");
    if crate::is_compact(&l.shape, &given) {
        assert_eq!(Some(h.strides().to_vec()), compact(&l.shape), "compact strides are canonical");
    } else {
        assert_eq!(h.strides(), &given[..]);
    }
}

/// A derived `describe`: accepted exactly when the layout fits the storage.
fn check_describe(r: handoff::Result<TensorDesc<'_>>, fits: bool, l: &Layout, data: usize) {
    match r {
        Ok(d) => {
            assert!(fits, "describe accepted a layout outside its storage: {l:?}");
            assert_eq!((d.data as usize, d.device, d.read_only), (data, Device::Host, false));
        }
        Err(e) => {
            assert!(!fits, "describe refused a layout that fits: {e}");
            assert!(
                matches!(
                    e,
                    Error::Storage(_)
                        | Error::Validation(
                            ValidationError::UnsupportedDtype { .. } | ValidationError::ShapeOverflow { .. }
                        )
                ),
                "{e}"
            );
            if let Error::Storage(s) = &e {
                assert!(!matches!(**s, StorageError::OutOfBounds { .. }) || !fits);
            }
        }
    }
}

/// A derived export: refused when describe is, when the elements take more than
/// `isize::MAX` bytes (a derived `describe` checks the extent, which zero strides keep
/// small, not the count), when the first element's address overflows or is
/// misaligned, or when the fake stream's wait failed; else the hand-off is the
/// description.
fn check_export(r: &handoff::Result<Handoff>, fits: bool, l: &Layout, data: usize) {
    match r {
        Ok(h) => {
            assert!(fits);
            check_same(h, l, data);
            assert!(!h.is_read_only() && !h.is_copied());
        }
        Err(e) => {
            let start = (data as u64).checked_add(l.byte_offset);
            let why = match e {
                Error::Backend { call: "wait", .. } => true,
                Error::Validation(ValidationError::ByteOffsetOverflow { .. }) => start.is_none(),
                Error::Validation(ValidationError::ShapeOverflow { .. }) => l.unrepresentable(),
                Error::Validation(ValidationError::Misaligned { .. }) => {
                    start.is_some_and(|s| s % handoff::dtype::alignment(l.dtype) as u64 != 0)
                }
                _ => !fits,
            };
            assert!(why, "export refused without a reason: {e} ({l:?})");
        }
    }
}

impl std::fmt::Debug for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} shape {:?} strides {:?} byte_offset {} over {} bytes",
            handoff::dtype::name(self.dtype),
            self.shape,
            self.strides,
            self.byte_offset,
            self.len
        )
    }
}

enum Act {
    Drop(Out),
    Flush(Option<usize>),
    Kernel(usize),
}

/// One input.
pub fn fuzz_export(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(n) = u.int_in_range(1..=3usize) else { return };
    let Ok(mut specs) =
        (0..n).map(|_| Spec::arbitrary(&mut u, false, false)).collect::<arbitrary::Result<Vec<_>>>()
    else {
        return;
    };
    // Only waits fail here (an export's `ready_on`): a failed record or query leaks its
    // keep-alive on purpose, which `reaper_faults` checks; here every one comes back.
    for s in specs.iter_mut() {
        if u.ratio(1, 4).unwrap_or(false) {
            s.faults.wait = u.arbitrary().unwrap_or(0);
        }
    }
    assert_eq!(reaper::pending(), 0, "an earlier input left releases queued");
    let fake = Fake::new(&specs);
    let streams: Vec<Stream> = (0..n).map(|i| fake.stream(i)).collect();
    fake::start(&fake);
    let mut outs = Vec::new();
    let count = u.int_in_range(1..=8).unwrap_or(1);
    for _ in 0..count {
        match one(&mut u, &streams) {
            Ok(Some(o)) => outs.push(o),
            Ok(None) => {}
            Err(_) => break,
        }
    }
    // Spread the drops over threads, with flushes and kernels between them.
    let threads = u.int_in_range(1..=3usize).unwrap_or(1);
    let mut plans: Vec<Vec<Act>> = (0..threads).map(|_| Vec::new()).collect();
    for o in outs {
        let t = u.int_in_range(0..=threads - 1).unwrap_or(0);
        if u.ratio(1, 3).unwrap_or(false) {
            let lane = u.int_in_range(0..=n).unwrap_or(0).checked_sub(1);
            plans[t].push(Act::Flush(lane));
        }
        if u.ratio(1, 4).unwrap_or(false) {
            plans[t].push(Act::Kernel(u.int_in_range(0..=n - 1).unwrap_or(0)));
        }
        plans[t].push(Act::Drop(o));
    }
    for p in plans.iter_mut() {
        if u.ratio(1, 2).unwrap_or(false) {
            let lane = u.int_in_range(0..=n).unwrap_or(0).checked_sub(1);
            p.push(Act::Flush(lane));
        }
    }
    let barrier = Arc::new(Barrier::new(threads));
    let (tx, rx) = mpsc::channel();
    let mut handles = Vec::new();
    for plan in plans {
        let (fake, streams, barrier, tx) = (fake.clone(), streams.clone(), barrier.clone(), tx.clone());
        handles.push(std::thread::spawn(move || {
            barrier.wait();
            for act in plan {
                match act {
                    Act::Kernel(lane) => {
                        fake.kernel(lane);
                    }
                    Act::Flush(None) => reaper::flush(),
                    Act::Flush(Some(lane)) => reaper::flush_stream(&streams[lane]),
                    Act::Drop(o) => {
                        if let Some(lane) = o.lane {
                            let need = if o.kernel { fake.kernel(lane) } else { fake.work(lane) };
                            ledger().slots[o.slot].need = need;
                        }
                        drop(o.what);
                    }
                }
            }
            let _ = tx.send(());
        }));
    }
    drop(tx);
    for _ in 0..threads {
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "a thread dropping hand-offs and flushing did not finish within 10 s"
        );
    }
    // Done: joined so that its exit (thread-local destructors) is over before the
    // leak check that follows each input.
    for h in handles {
        h.join().expect("a dropping thread panicked");
    }
    reaper::flush();
    assert_eq!(reaper::pending(), 0, "releases left queued after flush()");
    let l = ledger();
    for (i, s) in l.slots.iter().enumerate() {
        assert!(s.dropped, "keep-alive {i} was never dropped");
    }
}
