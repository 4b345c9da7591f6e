//! Examples of handoff: run them with `cargo run -p handoff-examples --example <name>`.
//!
//! [`model`] is the model step that the `pipeline` demo and the `pipeline_gpu`
//! benchmark share.
#![warn(missing_docs)]

pub mod model;
