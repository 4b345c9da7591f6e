//! [`Dims`]: a few `i64`s (a shape, strides, or both) kept inline when they fit, so
//! that describing or viewing a tensor of the usual ranks allocates nothing.

/// Up to [`Dims::INLINE`] values inline, more on the heap; reads as a `&[i64]`.
///
/// ```
/// use handoff_runtime::Dims;
/// let d = Dims::from(&[2i64, 3][..]);
/// assert_eq!(&d[..], &[2, 3]);
/// assert_eq!(&Dims::from(&[1i64; 20][..])[..], &[1; 20]);
/// ```
#[derive(Clone)]
pub struct Dims(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, values: [i64; Dims::INLINE] },
    Heap(Vec<i64>),
}

impl Dims {
    /// How many values are kept without an allocation (a rank-4 shape and its strides).
    pub const INLINE: usize = 8;
}

impl From<&[i64]> for Dims {
    fn from(values: &[i64]) -> Dims {
        if values.len() <= Dims::INLINE {
            // Filled where it is returned: an array filled first and then moved in
            // would be read back from stores just made, which stalls.
            let mut dims = Dims(Repr::Inline { len: values.len() as u8, values: [0; Dims::INLINE] });
            if let Repr::Inline { values: inline, .. } = &mut dims.0 {
                inline[..values.len()].copy_from_slice(values);
            }
            dims
        } else {
            Dims(Repr::Heap(values.to_vec()))
        }
    }
}

impl std::ops::Deref for Dims {
    type Target = [i64];
    fn deref(&self) -> &[i64] {
        match &self.0 {
            Repr::Inline { len, values } => &values[..*len as usize],
            Repr::Heap(v) => v,
        }
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Dims {
    fn eq(&self, other: &Dims) -> bool {
        self[..] == other[..]
    }
}
impl Eq for Dims {}
