//! # handoff
//!
//! Tensors passed between frameworks — PyTorch, XLA, custom CUDA buffers and your
//! own types — without a copy and without the CPU ever waiting. See the README.
pub use handoff_runtime::*;

pub mod doctor;

/// The adapters, each behind the feature of its name.
pub mod adapters {
    /// PyTorch tensors through `tch` (feature `torch`).
    #[cfg(feature = "torch")]
    pub use handoff_torch as torch;

    /// XLA through the PJRT C API (feature `xla`).
    #[cfg(feature = "xla")]
    pub use handoff_xla as xla;

    /// cudarc `CudaSlice` buffers (feature `cuda`).
    #[cfg(feature = "cuda")]
    pub use handoff_cuda as cuda;
}

/// `#[derive(DlpackExchange)]`: `StreamOrdered`, `Export` and (when the storage can
/// adopt foreign memory) `Import` for your own tensor type.
///
/// Fields: `#[dlpack(data)]` (any [`storage::Storage`]: `Vec<T>`, `Box<[T]>`,
/// `Arc<[T]>`, [`storage::Elements<T>`], which also adopts), `#[dlpack(shape)]`, and
/// optionally `#[dlpack(strides)]` (absent or `None` = compact), `#[dlpack(byte_offset)]`,
/// `#[dlpack(dtype)]` (a `DataType`; or `#[dlpack(dtype = f32)]` on the struct; or
/// from the storage's element type), `#[dlpack(device)]` (must be the storage's device; absent = the storage's),
/// `#[dlpack(stream)]` (a `Stream` or `Option<Stream>`; absent = host-ordered).
/// `#[dlpack(crate = "path")]` names handoff when it is not `::handoff`.
///
/// ```
/// use handoff::{DlpackExchange, Stream, transfer, dtype::Element, storage::Elements};
///
/// #[derive(DlpackExchange)]
/// struct MyTensor<T: Element> {
///     #[dlpack(data)]
///     data: Elements<T>,
///     #[dlpack(shape)]
///     shape: Vec<usize>,
///     label: String, // other fields are kept on export, defaulted on import
/// }
///
/// let a = MyTensor { data: Elements::from(vec![1.0f32, 2.0, 3.0, 4.0]), shape: vec![2, 2], label: "a".into() };
/// let b: MyTensor<f32> = transfer(a, &Stream::host()).unwrap();
/// assert_eq!(b.data.as_slice(), Some(&[1.0, 2.0, 3.0, 4.0][..]));
/// assert_eq!((b.shape, b.label), (vec![2, 2], String::new()));
/// ```
pub use handoff_macros::DlpackExchange;
