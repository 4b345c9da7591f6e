//! [`Storage`] for the standard library's owned slices: `Vec<T>`, `Box<[T]>`,
//! `Arc<[T]>` (read-only: shared).

use super::{Storage, Typed};
use crate::dtype::Element;
use std::ffi::c_void;
use std::sync::Arc;

// SAFETY: a Vec's heap buffer keeps its address when the Vec is moved, and holds
// `len` initialized elements.
unsafe impl<T: Element + Send> Storage for Vec<T> {
    fn data_ptr(&self) -> *mut c_void {
        self.as_ptr() as *mut c_void
    }
    fn byte_len(&self) -> usize {
        std::mem::size_of_val(&self[..])
    }
}
impl<T: Element + Send> Typed for Vec<T> {
    type Elem = T;
}

// SAFETY: as for Vec: the boxed slice is on the heap.
unsafe impl<T: Element + Send> Storage for Box<[T]> {
    fn data_ptr(&self) -> *mut c_void {
        self.as_ptr() as *mut c_void
    }
    fn byte_len(&self) -> usize {
        std::mem::size_of_val(&self[..])
    }
}
impl<T: Element + Send> Typed for Box<[T]> {
    type Elem = T;
}

// SAFETY: the shared slice is on the heap and lives while this handle does; it is
// shared, so consumers get it read-only.
unsafe impl<T: Element + Send + Sync> Storage for Arc<[T]> {
    fn data_ptr(&self) -> *mut c_void {
        self.as_ptr() as *mut c_void
    }
    fn byte_len(&self) -> usize {
        std::mem::size_of_val(&self[..])
    }
    fn read_only(&self) -> bool {
        true
    }
}
impl<T: Element + Send + Sync> Typed for Arc<[T]> {
    type Elem = T;
}
