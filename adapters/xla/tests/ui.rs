//! The compile errors a user meets calling a kernel on a type that no linked adapter
//! exchanges (a `tch::Tensor` in a crate that never names `handoff_torch`): they say
//! which adapter to link. The text is committed in `ui/*.stderr`;
//! `TRYBUILD=overwrite cargo test -p handoff-xla --test ui` rewrites it.

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
