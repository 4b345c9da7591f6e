//! # handoff
//!
//! Tensors passed between frameworks — PyTorch, XLA, custom CUDA buffers and your
//! own types — without a copy and without the CPU ever waiting. See the README.
pub use handoff_runtime::*;
