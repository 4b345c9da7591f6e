//! Why a PyTorch tensor cannot be handed off, or a hand-off cannot become one.

use handoff_runtime::Device;

/// What the PyTorch adapter refuses, each naming the field and value at fault and
/// what to do instead. Converts into [`handoff_runtime::Error::Adapter`] with adapter
/// `"torch"` and this message.
///
/// ```
/// use handoff_torch::TorchError;
/// let e = TorchError::RequiresGrad { shape: vec![2, 3] };
/// assert!(e.to_string().contains("detach()"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TorchError {
    /// The `tch::Tensor` is undefined (holds no tensor).
    #[error("the tensor is undefined (defined() is false): there is nothing to hand off")]
    Undefined,

    /// `requires_grad` is true.
    #[error(
        "the tensor of shape {shape:?} requires grad (requires_grad() is true): a hand-off carries \
         no autograd history; export `tensor.detach()` instead (it shares the memory, no copy)"
    )]
    RequiresGrad {
        /// The tensor's shape.
        shape: Vec<i64>,
    },

    /// The layout is not strided (sparse COO/CSR/CSC/BSR/BSC, mkldnn, jagged).
    #[error(
        "layout is {layout}: DLPack describes only strided tensors; call `to_dense()` first \
         (that copies)"
    )]
    NotStrided {
        /// PyTorch's name of the layout.
        layout: String,
    },

    /// `is_conj()` is true: a lazily conjugated view.
    #[error(
        "the tensor is a conjugate view (is_conj() is true) whose conjugation is not resolved: \
         DLPack has no conjugate bit; call `resolve_conj()` first (that copies)"
    )]
    Conjugate,

    /// `is_neg()` is true: a lazily negated view.
    #[error(
        "the tensor is a negative view (is_neg() is true) whose negation is not resolved: \
         DLPack has no negative bit; call `resolve_neg()` first (that copies)"
    )]
    Negative,

    /// The scalar type has no DLPack dtype handoff exchanges.
    #[error("dtype {dtype} has no DLPack equivalent that handoff exchanges{hint}")]
    UnsupportedDtype {
        /// PyTorch's name of the dtype.
        dtype: String,
        /// What to do instead, if anything.
        hint: &'static str,
    },

    /// The tensor's device is not CPU or CUDA.
    #[error("device is {device}: handoff-torch exchanges CPU and CUDA tensors only")]
    UnsupportedDevice {
        /// PyTorch's name of the device.
        device: String,
    },

    /// More dimensions than a hand-off takes.
    #[error("ndim is {ndim}: handoff takes at most {max} dimensions")]
    TooManyDims {
        /// The tensor's number of dimensions.
        ndim: i32,
        /// The limit.
        max: i32,
    },

    /// A hand-off of a device PyTorch cannot view (the mock device).
    #[error("a PyTorch tensor cannot view memory of {device}: it takes host and CUDA memory")]
    ImportDevice {
        /// The hand-off's device.
        device: Device,
    },

    /// A hand-off dtype with no PyTorch scalar type.
    #[error("dtype {dtype} has no PyTorch scalar type; PyTorch 2.11 cannot view it")]
    ImportDtype {
        /// The hand-off's dtype name.
        dtype: String,
    },

    /// A negative stride, which PyTorch tensors cannot have.
    #[error("strides[{axis}] is {stride}: PyTorch tensors cannot have negative strides")]
    NegativeStride {
        /// The axis.
        axis: usize,
        /// Its stride.
        stride: i64,
    },

    /// A `READ_ONLY` hand-off imported without saying the tensor will not be written.
    #[error(
        "flags has READ_ONLY, but PyTorch tensors are always writable: import it with \
         `ImportOptions::new().read_only_ok()` and do not write to it"
    )]
    ReadOnly,

    /// A stream of another device than the memory's.
    #[error("stream {stream} is not a stream of {device}, where the memory lives")]
    StreamDevice {
        /// The stream named.
        stream: String,
        /// The memory's device.
        device: Device,
    },

    /// A stream that is not a CUDA stream where one is needed.
    #[error("stream {stream} is not a CUDA stream")]
    NotCudaStream {
        /// The stream named.
        stream: String,
    },

    /// A CUDA tensor or stream, but handoff-torch was built without its `cuda` feature.
    #[error(
        "{device} needs handoff-torch's `cuda` feature (and handoff-runtime's CUDA backend); \
         it was built without it"
    )]
    CudaFeatureOff {
        /// The device asked for.
        device: Device,
    },

    /// A CUDA graph capture that cannot be made or used ([`crate::graph`]).
    #[error("CUDA graph: {what}: {message}")]
    Graph {
        /// What failed: the step, the end of the capture, an input given for a replay.
        what: String,
        /// Why, with what to do about it.
        message: String,
    },

    /// A call into libtorch failed; `message` is PyTorch's.
    #[error("{call} failed in libtorch: {message}")]
    Shim {
        /// The shim function.
        call: &'static str,
        /// The C++ exception's message.
        message: String,
    },
}

impl From<TorchError> for handoff_runtime::Error {
    fn from(e: TorchError) -> handoff_runtime::Error {
        handoff_runtime::Error::Adapter { adapter: "torch", message: e.to_string() }
    }
}
