//! Examples of handoff: run them with `cargo run -p handoff-examples --example <name>`.
//!
//! [`model`] is the model step that the `pipeline` demo and the `pipeline_gpu`
//! benchmark share; [`train`] the training step of the `train_step` example (a kernel's
//! gradient through its `jax.export` VJP).
#![warn(missing_docs)]

pub mod model;
pub mod train;

/// The README's Rust blocks, compiled as doctests of this crate, which has every adapter
/// (`cargo test -p handoff-examples --doc`); those marked `no_run` need a plugin or a GPU
/// to run. `cargo xtask layout` checks that this stays.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;
