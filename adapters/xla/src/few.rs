//! [`Few`]: a list of a few values kept in place, so that a kernel call's input and
//! output buffers (one to four, mostly) take no allocation per call.

/// How many values a [`Few`] keeps without an allocation.
const INLINE: usize = 4;

/// Up to four values in place, more on the heap; always filled from the start.
pub(crate) enum Few<T> {
    Inline([Option<T>; INLINE]),
    Heap(Vec<Option<T>>),
}

impl<T> Few<T> {
    /// An empty list with room for `n` values (in place when `n` is at most four).
    pub(crate) fn with_capacity(n: usize) -> Few<T> {
        if n <= INLINE { Few::Inline([None, None, None, None]) } else { Few::Heap(Vec::with_capacity(n)) }
    }

    fn slots(&self) -> &[Option<T>] {
        match self {
            Few::Inline(items) => items,
            Few::Heap(items) => items,
        }
    }

    /// How many values it holds.
    pub(crate) fn len(&self) -> usize {
        self.slots().iter().take_while(|s| s.is_some()).count()
    }

    /// Adds `value` at the end (moving the list to the heap past four).
    pub(crate) fn push(&mut self, value: T) {
        let len = self.len();
        match self {
            Few::Inline(items) if len < INLINE => items[len] = Some(value),
            Few::Inline(items) => {
                let mut heap: Vec<Option<T>> = items.iter_mut().map(Option::take).collect();
                heap.push(Some(value));
                *self = Few::Heap(heap);
            }
            Few::Heap(items) => items.push(Some(value)),
        }
    }

    /// The values, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots().iter().map_while(Option::as_ref)
    }
}

impl<T> IntoIterator for Few<T> {
    type Item = T;
    type IntoIter = std::iter::Flatten<
        std::iter::Chain<std::array::IntoIter<Option<T>, INLINE>, std::vec::IntoIter<Option<T>>>,
    >;

    /// The values, in order (the slots after them are empty).
    fn into_iter(self) -> Self::IntoIter {
        let (inline, heap) = match self {
            Few::Inline(items) => (items, Vec::new()),
            Few::Heap(items) => ([None, None, None, None], items),
        };
        inline.into_iter().chain(heap).flatten()
    }
}

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
            assert_eq!(matches!(few, Few::Inline(_)), n <= 4, "n = {n}");
            assert_eq!(few.iter().copied().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
            assert_eq!(few.into_iter().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
        }
        assert!(matches!(Few::<u8>::with_capacity(5), Few::Heap(_)));
    }
}
