//! [`Few`]: a list of a few values kept in place, so that a kernel call's input and
//! output buffers (one to four, mostly) take no allocation per call.

/// Up to four values in place, more on the heap.
pub(crate) type Few<T> = smallvec::SmallVec<[T; 4]>;

#[cfg(test)]
mod tests {
    use super::Few;

    #[test]
    fn a_few_values_stay_in_place_and_more_move_to_the_heap_in_order() {
        for n in [0usize, 1, 4, 5, 9] {
            let mut few = Few::with_capacity(2);
            for i in 0..n {
                few.push(i);
            }
            assert_eq!(few.len(), n);
            assert_eq!(few.spilled(), n > 4, "n = {n}");
            assert_eq!(few.iter().copied().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
            assert_eq!(few.into_iter().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
        }
        assert!(Few::<u8>::with_capacity(5).spilled());
    }
}
