//! Examples of handoff: run them with `cargo run -p handoff-examples --example <name>`.
