//! An example third-party adapter: `ndarray` host arrays exchanged through handoff.
//!
//! It depends on `handoff` alone, and registers itself with one `submit!`: any
//! program that links this crate finds it in `handoff::registry` as `"ndarray"`.
//!
//! [`NdTensor<T>`] is either an owned `ndarray::ArrayD<T>` or a view of another
//! framework's host memory (imported, no copy, the producer's memory kept alive
//! until dropped); both export without a copy.
//!
//! ```
//! use handoff::{Stream, registry};
//! use handoff_ndarray::NdTensor;
//!
//! let a = NdTensor::from(ndarray::ArrayD::from_shape_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap());
//! let v = registry::convert(Box::new(a), "ndarray", "ndarray", &Stream::host()).unwrap();
//! let v = v.downcast::<NdTensor<f32>>().unwrap();
//! assert!(v.is_view());
//! assert_eq!(v.view()[[1, 0]], 3.0);
//! ```

use handoff::dtype::{DataType, Element};
use handoff::registry::{self, Adapter, DeviceKind};
use handoff::{Device, Error, Export, Handoff, Import, Result, Stream, StreamOrdered, TensorDesc};
use ndarray::{ArrayD, ArrayViewD, IxDyn, ShapeBuilder};
use std::ptr::NonNull;

const NAME: &str = "ndarray";

registry::submit! {
    Adapter::new(NAME, env!("CARGO_PKG_VERSION"))
        .about("ndarray host arrays (example third-party adapter)")
        .devices(&[DeviceKind::Host])
        .dtypes(&[DataType::F32])
        .exports::<NdTensor<f32>>()
        .imports::<NdTensor<f32>>()
}

/// An `ndarray` array of host memory: owned, or a view of another framework's.
pub struct NdTensor<T> {
    inner: Inner<T>,
}

enum Inner<T> {
    Owned(ArrayD<T>),
    Viewed { handoff: Handoff, shape: Vec<usize>, strides: Vec<usize> },
}

impl<T> From<ArrayD<T>> for NdTensor<T> {
    fn from(a: ArrayD<T>) -> Self {
        NdTensor { inner: Inner::Owned(a) }
    }
}

impl<T: Element> NdTensor<T> {
    /// The array (no copy).
    pub fn view(&self) -> ArrayViewD<'_, T> {
        match &self.inner {
            Inner::Owned(a) => a.view(),
            Inner::Viewed { handoff, shape, strides } => {
                let dims = IxDyn(shape).strides(IxDyn(strides));
                // An empty tensor may come with a null data pointer (PyTorch exports
                // every empty tensor so); ndarray needs a non-null, aligned one always.
                // Its strides are all 0 (`from_handoff`), so no axis ever moves it.
                let ptr = if shape.contains(&0) {
                    NonNull::<T>::dangling().as_ptr().cast_const()
                } else {
                    handoff.data_ptr() as *const T
                };
                // SAFETY: `ptr` is non-null and aligned: dangling for no elements (and
                // then never offset: zero strides); otherwise `from_handoff` checked
                // that the memory is host memory of `T` elements with non-negative
                // strides, and the hand-off was validated (non-null data, alignment,
                // extent within the address space) and keeps the memory alive as long
                // as `self`, which the view borrows.
                unsafe { ArrayViewD::from_shape_ptr(dims, ptr) }
            }
        }
    }

    /// Whether it views another framework's memory.
    pub fn is_view(&self) -> bool {
        matches!(self.inner, Inner::Viewed { .. })
    }

    /// Copies the elements into an owned array (the only copy this adapter makes,
    /// and only when asked).
    pub fn to_owned(&self) -> ArrayD<T>
    where
        T: Clone,
    {
        self.view().to_owned()
    }
}

impl<T: Element> StreamOrdered for NdTensor<T> {
    fn device(&self) -> Device {
        Device::Host
    }
    fn stream(&self) -> Option<Stream> {
        None
    }
}

impl<T: Element + Send> Export for NdTensor<T> {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        let v = self.view();
        let shape: Vec<i64> = v.shape().iter().map(|&d| d as i64).collect();
        let strides: Vec<i64> = v.strides().iter().map(|&s| s as i64).collect();
        let mut desc =
            TensorDesc::new(v.as_ptr() as *mut _, Device::Host, T::DTYPE, shape).with_strides(strides);
        if let Inner::Viewed { handoff, .. } = &self.inner {
            desc.read_only = handoff.is_read_only();
        }
        Ok(desc)
    }
}

fn refuse<T>(message: String) -> Result<T> {
    Err(Error::Adapter { adapter: NAME, message })
}

impl<T: Element> Import for NdTensor<T> {
    fn from_handoff(handoff: Handoff) -> Result<Self> {
        if handoff.device() != Device::Host {
            return refuse(format!("device is {}: ndarray views host memory only", handoff.device()));
        }
        if handoff.dtype() != T::DTYPE {
            return refuse(format!(
                "dtype is {}, but NdTensor<{}> holds {}",
                handoff::dtype::name(handoff.dtype()),
                std::any::type_name::<T>(),
                handoff::dtype::name(T::DTYPE)
            ));
        }
        let shape: Vec<usize> = handoff.shape().iter().map(|&d| d as usize).collect();
        if shape.contains(&0) {
            // ndarray refuses shapes whose non-zero dimensions multiply past isize::MAX,
            // even with no elements: refuse them here, by name.
            let nonzero = shape.iter().filter(|&&d| d != 0).try_fold(1usize, |a, &d| a.checked_mul(d));
            if nonzero.is_none_or(|n| n > isize::MAX as usize) {
                return refuse(format!("shape {shape:?} has more positions than ndarray can index"));
            }
            // No elements: the strides do not matter, and zero ones never move the
            // dangling pointer the view of nothing uses.
            let strides = vec![0; shape.len()];
            return Ok(NdTensor { inner: Inner::Viewed { handoff, shape, strides } });
        }
        let mut strides = Vec::with_capacity(shape.len());
        for (axis, &s) in handoff.strides().iter().enumerate() {
            match usize::try_from(s) {
                Ok(s) => strides.push(s),
                Err(_) => return refuse(format!("strides[{axis}] is {s}: negative strides are not viewed")),
            }
        }
        Ok(NdTensor { inner: Inner::Viewed { handoff, shape, strides } })
    }
}
