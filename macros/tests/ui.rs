//! UI tests of `#[derive(DlpackExchange)]`: the passing forms compile (and run),
//! and each misuse is a spanned error whose text is committed in `ui/fail/*.stderr`.
//! `TRYBUILD=overwrite cargo test -p handoff-macros` rewrites the `.stderr` files.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
