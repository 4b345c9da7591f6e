//! [`Erased`]: a keep-alive of any `Send` type, as releases queue and homes hold
//! them, kept in place when it is small (a hand-off, an external reference, a tensor
//! handle), so that queueing one allocates nothing.

use std::mem::{MaybeUninit, align_of, size_of};

/// Room for a value kept in place.
type Words = MaybeUninit<[usize; 2]>;

/// A `Send` value of some type, in two words when it fits (else boxed, the box in
/// them), dropped by the function kept with it.
pub(crate) struct Erased {
    words: Words,
    drop: unsafe fn(*mut Words),
}

// SAFETY: only made from `Send` values (`Erased::new`), moved and dropped whole.
unsafe impl Send for Erased {}

impl Erased {
    /// Erases `value`'s type; no allocation when it fits in two words.
    pub(crate) fn new<K: Send + 'static>(value: K) -> Erased {
        if fits::<K>() {
            // SAFETY: checked just above.
            unsafe { Erased::in_place(value) }
        } else {
            // SAFETY: a box is one word.
            unsafe { Erased::in_place(Box::new(value)) }
        }
    }

    /// # Safety
    /// `K` must fit in `Words` ([`fits`]).
    unsafe fn in_place<K: Send + 'static>(value: K) -> Erased {
        let mut words = Words::uninit();
        // SAFETY: `K` fits in `words` in size and alignment (the caller's promise);
        // the value is dropped once, by `drop_as::<K>`.
        unsafe { words.as_mut_ptr().cast::<K>().write(value) };
        Erased { words, drop: drop_as::<K> }
    }
}

impl Drop for Erased {
    fn drop(&mut self) {
        // SAFETY: `drop` is the dropper of the value `in_place` wrote in `words`, and
        // this is the only place it runs.
        unsafe { (self.drop)(&mut self.words) }
    }
}

/// Whether a `K` fits in [`Words`].
const fn fits<K>() -> bool {
    size_of::<K>() <= size_of::<Words>() && align_of::<K>() <= align_of::<Words>()
}

/// Drops the `K` in `words`.
///
/// # Safety
/// `words` must hold a `K` written by [`Erased::in_place`], not dropped yet.
unsafe fn drop_as<K>(words: *mut Words) {
    // SAFETY: the caller's promise; `K` is aligned there (`fits`).
    unsafe { std::ptr::drop_in_place(words.cast::<K>()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts its drops.
    struct Counted<const N: usize>(Arc<AtomicUsize>, [u64; N]);

    impl<const N: usize> Drop for Counted<N> {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn small_and_large_values_are_dropped_once_each() {
        let drops = Arc::new(AtomicUsize::new(0));
        assert!(fits::<Counted<1>>() && !fits::<Counted<4>>());
        let kept = vec![
            Erased::new(Counted::<1>(drops.clone(), [7])),
            Erased::new(Counted::<4>(drops.clone(), [1, 2, 3, 4])),
            Erased::new(Box::new(Counted::<0>(drops.clone(), [])) as Box<dyn Send>),
            Erased::new(()),
        ];
        let moved: Vec<Erased> = kept.into_iter().collect();
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        drop(moved);
        assert_eq!(drops.load(Ordering::SeqCst), 3);
        std::mem::forget(Erased::new(Counted::<1>(drops.clone(), [0])));
        assert_eq!(drops.load(Ordering::SeqCst), 3, "a forgotten value is never dropped");
    }
}
