//! Compile tests of `#[idempotent]`: handlers that must compile (`ui/pass`) and misuses that
//! must fail with an error at the offending tokens (`ui/fail`, with `.stderr` snapshots;
//! regenerate them with `TRYBUILD=overwrite cargo test --all-features --test macros ui::`).

#![cfg(feature = "macros")]

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    // The example of the attribute's docs.
    t.pass("macros/src/doc_example.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
