//! Every fuzz target's kept inputs, replayed on the stable toolchain (no libFuzzer, no
//! sanitizer): `regressions/<target>/*` (inputs that once failed, see
//! `regressions/README.md`) and the committed seeds `corpus/<target>/*`, each through
//! the target's `fuzz_*` function, whose oracle panics on a wrong outcome.
//! `cargo xtask test` runs this (`cargo test --manifest-path fuzz/Cargo.toml`).

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["regressions", "corpus"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
        files.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file()));
    }
    files.sort();
    files
}

fn replay(target: &str, fuzz: fn(&[u8]), at_least: usize) {
    let files = inputs(target);
    assert!(files.len() >= at_least, "{target}: {} inputs, expected at least {at_least}", files.len());
    for f in &files {
        eprintln!("{target}: replaying {}", f.display());
        fuzz(&std::fs::read(f).unwrap());
    }
    println!("{target}: {} inputs replayed", files.len());
}

#[test]
fn import_raw() {
    replay("import_raw", handoff_fuzz::fuzz_import, 1);
}

#[test]
fn registry_convert() {
    replay("registry_convert", handoff_fuzz::registry::fuzz_convert, 1);
}

#[test]
fn reaper_faults() {
    replay("reaper_faults", handoff_fuzz::reaper_faults::fuzz_reaper, 1);
}

#[test]
fn consume() {
    replay("consume", handoff_fuzz::consume::fuzz_consume, 1);
}

#[test]
fn export() {
    replay("export", handoff_fuzz::export::fuzz_export, 1);
}

#[test]
fn artifact() {
    // With the CPU plugin (`HANDOFF_PJRT_PLUGIN`, set by the xtask), the kept module
    // whose compile throws reaches the plugin and must be a typed error.
    replay("artifact", handoff_fuzz::xla::fuzz_artifact, 2);
}

#[test]
fn stablehlo() {
    replay("stablehlo", handoff_fuzz::xla::fuzz_stablehlo, 1);
}
