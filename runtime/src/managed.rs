//! The DLPack tensor of a hand-off, made in one allocation: dlpark's managed tensor,
//! its shape and strides, and its context (the producer's keep-alive and the stream
//! it goes back after) in place behind them. One allocation and one free per
//! hand-off, whatever the keep-alive.

use crate::error::{Error, Result, ValidationError};
use crate::reaper;
use crate::stream::Stream;
use crate::validate::{self, MAX_NDIM, Parts};
use dlpark::allocation::dynamic::Allocation;
use dlpark::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned};
use dlpark::{DlpackFlags, Managed, OpaqueContext};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::{ManuallyDrop, offset_of};
use std::ptr::NonNull;

/// What every [`Owner`] starts with, whatever its keep-alive: the hand-off's consumer
/// stream, whether the keep-alive goes back after the consumer's queued work (else at
/// once), and the thread that made the hand-off. [`Handoff`](crate::Handoff) reads it
/// through the context pointer, whatever `K` is.
#[repr(C)]
pub(crate) struct Head {
    consumer: ConsumerHandle,
    pub after_consumer: bool,
    /// The thread that made the hand-off: let go on another, the hand-off (and its
    /// keep-alive) is given back there (see [`reaper`]'s homes).
    pub home: Option<reaper::Home>,
}

/// Where a [`Head`] keeps its consumer stream's handle.
enum ConsumerHandle {
    /// A clone of the consumer's handle.
    Own(Stream),
    /// The handle the keep-alive holds of its release stream, which is the consumer
    /// stream (a value released in order on the stream it is handed to). Valid while
    /// the owner holds its keep-alive; only for a head that releases at once, whose
    /// drop never reads it (see [`Owner`]'s drop).
    // Saves a handle's clone and drop; guarded by "device same-stream export + import, drop untimed".
    InKeepAlive(NonNull<Stream>),
}

// SAFETY: a borrowed handle points into the keep-alive of the same owner (`K: Send`),
// moves with it to whichever thread drops it, and is only ever read as a `&Stream`
// (`Stream` is `Send + Sync`): the keep-alive's own code does not run while the owner
// holds it, so nothing writes the handle while a head is read.
unsafe impl Send for ConsumerHandle {}
// SAFETY: as above; `&ConsumerHandle` only reads the handle.
unsafe impl Sync for ConsumerHandle {}

impl Head {
    /// The hand-off's consumer stream.
    #[inline]
    pub fn consumer(&self) -> &Stream {
        match &self.consumer {
            ConsumerHandle::Own(stream) => stream,
            // SAFETY: a handle inside the keep-alive, which the owner holds until it is
            // dropped; a head is read only before that (a release at once never reads it).
            ConsumerHandle::InKeepAlive(stream) => unsafe { stream.as_ref() },
        }
    }
}

/// A value's own handle of the stream it is released on, for a [`Head`] to borrow:
/// what [`StreamOrdered::held_release_stream`](crate::StreamOrdered::held_release_stream)
/// returns. `None` for keep-alives that hold none.
pub(crate) type HeldStream<K> = Option<for<'k> fn(&'k K) -> Option<&'k Stream>>;

/// The DLPack context of a hand-off: its [`Head`] first (`repr(C)`), then the
/// producer's keep-alive, dropped once, by the owner's drop.
#[repr(C)]
pub(crate) struct Owner<K: Send + 'static> {
    pub head: Head,
    pub keep_alive: ManuallyDrop<K>,
}

impl<K: Send + 'static> Drop for Owner<K> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; nothing reads the keep-alive after its owner's drop.
        let k = unsafe { ManuallyDrop::take(&mut self.keep_alive) };
        let head = &self.head;
        // A head that borrows the keep-alive's handle releases at once (`finish`),
        // so the handle is not read once `k` has moved.
        let after = match &head.consumer {
            ConsumerHandle::Own(stream) if head.after_consumer => Some(stream),
            _ => None,
        };
        reaper::release_for(head.home, after, k);
    }
}

// `InPlace`'s safety rests on this: an owner of a `Send` keep-alive is `Send`.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Owner<Vec<u8>>>();
};

/// An [`Owner`] that lives inside the managed tensor's allocation: dlpark's deleter
/// drops the context first, then frees the allocation, so the owner is dropped in
/// place and never freed on its own.
struct InPlace<K: Send + 'static>(NonNull<Owner<K>>);

// SAFETY: `drop_raw` drops the owner in place, once (dlpark's deleter calls it once,
// before it frees the allocation that holds the owner); `Owner<K>` is `Send`, so any
// thread may drop it, and its drop does not unwind (the reaper catches a keep-alive's
// panic).
unsafe impl<K: Send + 'static> OpaqueContext for InPlace<K> {
    fn into_raw(self) -> *mut c_void {
        self.0.as_ptr().cast()
    }

    unsafe fn drop_raw(raw: *mut c_void) {
        if !raw.is_null() {
            // SAFETY: `raw` is the owner `finish` wrote, not dropped yet (above).
            unsafe { std::ptr::drop_in_place(raw.cast::<Owner<K>>()) }
        }
    }
}

/// A managed tensor's allocation with its shape and strides written and room for an
/// [`Owner<K>`] behind them: what [`lay_out`] checked and laid out while the
/// description is borrowed (from the keep-alive itself), before the keep-alive moves
/// in ([`finish`](Self::finish)). Dropping it frees the allocation.
pub(crate) struct Laid<K> {
    allocation: Allocation<DLManagedTensorVersioned>,
    /// The strides laid out are the compact ones (given so, or none given).
    pub compact: bool,
    ndim: usize,
    data: *mut c_void,
    device: DLDevice,
    dtype: DLDataType,
    byte_offset: u64,
    flags: DlpackFlags,
    owner: PhantomData<fn(K)>,
}

/// Checks `parts` and lays them out in one allocation that has room for an
/// [`Owner<K>`] too.
// Inlined with `finish` and their callers, so no `Laid` is copied through the stack ("host export + drop").
#[inline(always)]
pub(crate) fn lay_out<K: Send + 'static>(parts: &Parts<'_>) -> Result<Laid<K>> {
    let strides = dims(parts)?;
    let ndim = parts.shape.len();
    // The owner's 8-byte words after the shape and strides (which are 8-aligned), with
    // room to align it.
    let owner_words = (size_of::<Owner<K>>() + align_of::<Owner<K>>().saturating_sub(8)).div_ceil(8);
    let mut allocation = Allocation::<DLManagedTensorVersioned>::allocate(2 * ndim + owner_words)
        .map_err(|_| ValidationError::ShapeOverflow { shape: parts.shape.to_vec() })?;
    let extra = allocation.extra_mut();
    let (shape, rest) = extra.split_at_mut(ndim);
    shape.copy_from_slice(parts.shape);
    match strides {
        Strides::Given(given) => rest[..ndim].copy_from_slice(given),
        Strides::Compact => compact_into(parts.shape, &mut rest[..ndim]),
    }
    Ok(Laid {
        allocation,
        compact: matches!(strides, Strides::Compact),
        ndim,
        data: parts.data,
        device: parts.device,
        dtype: parts.dtype,
        byte_offset: parts.byte_offset,
        flags: parts.flags,
        owner: PhantomData,
    })
}

impl<K: Send + 'static> Laid<K> {
    /// Puts an owner of `keep_alive` in the room laid out for it, its [`Head`] saying
    /// `consumer`, `after_consumer` and the calling thread, and finishes the managed
    /// tensor, whose deleter drops the owner (so releases the keep-alive) and frees the
    /// allocation. Returns, with the tensor, the owner's [`Head`] (`Owner` is `repr(C)`
    /// with the head first), valid until the tensor's deleter runs. On error (none can
    /// happen: the rank was checked) the keep-alive is dropped, never seen by a consumer.
    ///
    /// When the release is at once and `held` finds, in the keep-alive, a handle of
    /// `consumer` itself (a value handed to the stream it is released on), the head
    /// points to that handle instead of cloning `consumer`.
    // Inlined: see `lay_out`.
    #[inline(always)]
    pub(crate) fn finish(
        self,
        consumer: &Stream,
        after_consumer: bool,
        keep_alive: K,
        held: HeldStream<K>,
    ) -> Result<(Managed<DLManagedTensorVersioned>, NonNull<Head>)> {
        let Laid { mut allocation, ndim, data, device, dtype, byte_offset, flags, .. } = self;
        // Where `held` finds the consumer's handle, asked before anything is built (it
        // is the keep-alive's code): at an offset inside the keep-alive's own bytes,
        // where it is found again once the keep-alive has moved in. A handle behind
        // a pointer (a box) is not borrowed: moving a box asserts it is unique.
        let held_at = match held {
            Some(held) if !after_consumer => held(&keep_alive)
                .filter(|s| *s == consumer)
                .map(|s| (s as *const Stream as usize).wrapping_sub(&raw const keep_alive as usize))
                .filter(|&offset| {
                    offset.checked_add(size_of::<Stream>()).is_some_and(|end| end <= size_of::<K>())
                }),
            _ => None,
        };
        // The shape, the strides and the owner, through one pointer taken once: the
        // tensor's pointers and the head's derive from it, and a later `extra_mut`
        // would make a new unique borrow of them all, which ends the earlier ones.
        let extra = allocation.extra_mut().as_mut_ptr();
        let at = extra.wrapping_add(2 * ndim) as *mut u8;
        let owner_at = at.wrapping_add(at.align_offset(align_of::<Owner<K>>())) as *mut Owner<K>;
        // Before the clone: a clone kept across this call stalls on its reload ("host export + drop").
        let home = reaper::home_here();
        // SAFETY: `owner_at` is aligned and inside the allocation (`lay_out` left room
        // for an `Owner<K>` and its alignment); not written yet.
        let context = InPlace(unsafe { NonNull::new_unchecked(owner_at) });
        let Ok(mut init) = allocation.initialize(context, ndim) else {
            let e = ValidationError::TooManyDims { ndim: ndim.min(i32::MAX as usize) as i32, max: MAX_NDIM };
            return Err(e.into());
        };
        let consumer = match held_at {
            // The handle at the same offset inside the keep-alive once in place (its
            // `ManuallyDrop` is `repr(transparent)`).
            Some(offset) => {
                let at = owner_at.wrapping_byte_add(offset_of!(Owner<K>, keep_alive) + offset);
                // SAFETY: not null: inside the allocation, as `owner_at` is.
                ConsumerHandle::InKeepAlive(unsafe { NonNull::new_unchecked(at.cast()) })
            }
            None => ConsumerHandle::Own(consumer.clone()),
        };
        // SAFETY: as above. From `initialize` on, the deleter drops the owner, so it is
        // written before anything can fail or unwind (cloning a handle never unwinds),
        // and nothing before `finish` runs the keep-alive's code. A borrowed handle is
        // the one `held` found, at the same offset inside the keep-alive once in place,
        // valid until the owner drops it.
        unsafe {
            let head = Head { consumer, after_consumer, home };
            owner_at.write(Owner { head, keep_alive: ManuallyDrop::new(keep_alive) });
        }
        let t = init.tensor_mut();
        t.shape = extra;
        // The strides follow the shape's `ndim` values in the same allocation; a
        // scalar has none (null, as dlpark leaves them).
        t.strides = if ndim == 0 { std::ptr::null_mut() } else { extra.wrapping_add(ndim) };
        init.set_data(data).set_device(device).set_dtype(dtype).set_byte_offset(byte_offset);
        // SAFETY: the flags are the producer's (IS_COPIED only when the memory is a
        // copy owned by this hand-off alone, as `TensorDesc::is_copied` requires).
        unsafe { init.set_flags_unchecked(flags) };
        // SAFETY: data, device and dtype describe memory the owner keeps alive until
        // the deleter runs; shape and strides are in the allocation itself.
        let managed = unsafe { init.finish() };
        // SAFETY: `owner_at` is not null (above); `Owner` is `repr(C)` with the head first.
        let head = unsafe { NonNull::new_unchecked(owner_at.cast::<Head>()) };
        Ok((managed, head))
    }
}

enum Strides<'a> {
    Given(&'a [i64]),
    Compact,
}

/// Checks the dimensions before anything is allocated, and picks the strides.
#[inline]
fn dims<'a>(parts: &Parts<'a>) -> Result<Strides<'a>> {
    let shape = parts.shape;
    if shape.len() > MAX_NDIM as usize {
        return Err(ValidationError::TooManyDims {
            ndim: shape.len().min(i32::MAX as usize) as i32,
            max: MAX_NDIM,
        }
        .into());
    }
    if let Some((axis, &value)) = shape.iter().enumerate().find(|(_, d)| **d < 0) {
        return Err(ValidationError::NegativeDimension { axis, value }.into());
    }
    match parts.strides {
        Some(s) if s.len() != shape.len() => Err(Error::Adapter {
            adapter: "export",
            message: format!("shape has {} dimensions but strides has {}", shape.len(), s.len()),
        }),
        Some(s) if !validate::is_compact(shape, s) => Ok(Strides::Given(s)),
        _ => {
            // Compact strides of the whole shape must not overflow (dlpark's rule).
            let fits = shape.iter().rev().try_fold(1i64, |stride, &d| stride.checked_mul(d)).is_some();
            if fits {
                Ok(Strides::Compact)
            } else {
                Err(ValidationError::ShapeOverflow { shape: shape.to_vec() }.into())
            }
        }
    }
}

/// Writes compact row-major strides of `shape` (checked not to overflow).
fn compact_into(shape: &[i64], strides: &mut [i64]) {
    let mut stride = 1i64;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = stride;
        stride = stride.wrapping_mul(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlpark::ffi::DLDataType;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A keep-alive of any alignment that counts its drops and checks where it lives.
    #[repr(align(64))]
    struct Wide(Arc<AtomicUsize>);
    impl Drop for Wide {
        fn drop(&mut self) {
            assert_eq!(self as *const Wide as usize % 64, 0, "the owner is misaligned");
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn parts(shape: &[i64]) -> Parts<'_> {
        Parts {
            data: std::ptr::null_mut(),
            device: crate::Device::Host.to_dlpack(),
            dtype: DLDataType::F32,
            shape,
            strides: None,
            byte_offset: 0,
            flags: DlpackFlags::empty(),
        }
    }

    #[test]
    fn the_owner_lives_in_the_allocation_aligned_and_is_dropped_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        for shape in [&[][..], &[0, 3][..], &[2, 3, 4][..]] {
            let laid = lay_out::<Wide>(&parts(shape)).unwrap();
            assert!(laid.compact, "{shape:?}: no strides given, so compact ones laid out");
            let (managed, head) = laid.finish(&Stream::host(), false, Wide(drops.clone()), None).unwrap();
            // SAFETY: valid until the deleter runs (below).
            assert!(unsafe { head.as_ref() }.consumer().is_host());
            // SAFETY: owned and just built.
            let t = unsafe { managed.tensor() };
            assert_eq!(t.ndim as usize, shape.len());
            if !shape.is_empty() {
                // SAFETY: `ndim` values each, in the allocation.
                let (s, st) = unsafe {
                    (
                        std::slice::from_raw_parts(t.shape, shape.len()),
                        std::slice::from_raw_parts(t.strides, shape.len()),
                    )
                };
                assert_eq!(s, shape);
                assert_eq!(st, &dlpark::tensor::compact_strides(shape).unwrap()[..]);
            }
            let before = drops.load(Ordering::SeqCst);
            drop(managed);
            assert_eq!(drops.load(Ordering::SeqCst), before + 1, "{shape:?}: dropped once, by the deleter");
        }
    }

    /// A keep-alive holding a handle of its release stream in its own bytes and one
    /// behind a box.
    struct Holds {
        inline: Stream,
        boxed: Box<Stream>,
    }

    #[test]
    fn a_head_borrows_the_keep_alives_own_handle_of_its_consumer_instead_of_cloning_it() {
        let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(());
        let stream = Stream::host().with_owner(owner.clone());
        let other = Stream::host().with_owner(Arc::new(1u8));
        let handles = || Arc::strong_count(&owner);
        let inline: HeldStream<Holds> = Some(|k| Some(&k.inline));
        let boxed: HeldStream<Holds> = Some(|k| Some(&*k.boxed));
        // (consumer, released after it, what the keep-alive says it holds, borrowed)
        for (consumer, after, held, borrowed, what) in [
            (&stream, false, inline, true, "released at once, a handle in its own bytes"),
            (&stream, false, boxed, false, "a handle behind a box (moving it asserts it unique)"),
            (&stream, true, inline, false, "released after the consumer"),
            (&other, false, inline, false, "handed to another stream"),
            (&stream, false, None, false, "nothing held"),
        ] {
            let k = Holds { inline: stream.clone(), boxed: Box::new(stream.clone()) };
            let before = handles();
            let laid = lay_out::<Holds>(&parts(&[2, 3])).unwrap();
            let (managed, head) = laid.finish(consumer, after, k, held).unwrap();
            // SAFETY: the head and owner `finish` wrote, valid until the managed tensor
            // is dropped (below).
            let (head, owner) = unsafe { (head.as_ref(), &*head.as_ptr().cast::<Owner<Holds>>()) };
            let k = &*owner.keep_alive;
            if borrowed {
                assert_eq!(handles(), before, "{what}: no handle cloned");
                assert!(
                    std::ptr::eq(head.consumer(), &k.inline),
                    "{what}: the keep-alive's handle, where it is now"
                );
            } else {
                let own = usize::from(std::ptr::eq(consumer, &stream));
                assert_eq!(handles(), before + own, "{what}: the head holds a clone of its own");
            }
            assert!(head.consumer() == consumer, "{what}");
            drop(managed);
            crate::reaper::flush();
            assert_eq!(handles(), before - 2, "{what}: every handle let go once");
        }
    }

    #[test]
    fn bad_dimensions_are_refused_before_the_keep_alive_moves_in() {
        for (shape, strides) in
            [(&[2i64, -1][..], None), (&[2, 3][..], Some(&[1i64][..])), (&[i64::MAX, 4][..], None)]
        {
            let p = Parts { strides, ..parts(shape) };
            assert!(lay_out::<Wide>(&p).is_err(), "{shape:?} {strides:?}");
        }
        let too_many = [1i64; MAX_NDIM as usize + 1];
        assert!(matches!(
            lay_out::<Wide>(&parts(&too_many)),
            Err(Error::Validation(ValidationError::TooManyDims { .. }))
        ));
    }
}
