//! Examples of handoff: run them with `cargo run -p handoff-examples --example <name>`.
//!
//! [`model`] is the model step that the `pipeline` demo and the `pipeline_gpu`
//! benchmark share; [`train`] the training step of the `train_step` example (a kernel's
//! gradient through its `jax.export` VJP).
#![warn(missing_docs)]

pub mod model;
pub mod train;
