//! [`Dims`]: a few `i64`s (a shape, strides, or both) kept inline when they fit, so
//! that describing or viewing a tensor of the usual ranks allocates nothing.

use smallvec::SmallVec;

/// Up to [`Dims::INLINE`] values inline, more on the heap; reads as a `&[i64]`.
///
/// ```
/// use handoff_runtime::Dims;
/// let d = Dims::from(&[2i64, 3][..]);
/// assert_eq!(&d[..], &[2, 3]);
/// assert_eq!(&Dims::from(&[1i64; 20][..])[..], &[1; 20]);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Dims(SmallVec<[i64; Dims::INLINE]>);

impl Dims {
    /// How many values are kept without an allocation (a rank-4 shape and its strides).
    pub const INLINE: usize = 8;
}

impl From<&[i64]> for Dims {
    fn from(values: &[i64]) -> Dims {
        Dims(SmallVec::from_slice(values))
    }
}

impl std::ops::Deref for Dims {
    type Target = [i64];
    fn deref(&self) -> &[i64] {
        &self.0
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::Dims;

    #[test]
    fn dims_stay_inline_up_to_eight_values() {
        for n in [0usize, 1, Dims::INLINE, Dims::INLINE + 1, 20] {
            let values: Vec<i64> = (0..n as i64).collect();
            let dims = Dims::from(&values[..]);
            assert_eq!(&dims[..], &values[..]);
            assert_eq!(dims.0.spilled(), n > Dims::INLINE, "n = {n}");
            assert_eq!(format!("{dims:?}"), format!("{values:?}"));
        }
        assert_eq!(size_of::<Dims>(), 72);
    }
}
