//! `cargo xtask <command>`: everything a fresh machine needs, in one place.
//!
//! - `setup`  install what the adapters need into `.deps/` (reused when present)
//! - `env`    print the environment variables the build and tests use, as `export` lines
//! - `test`   setup, then the layout check, `cargo fmt --check`, clippy (`-D warnings`) and
//!   every test, of the workspace and of `fuzz/` (its own workspace: the fuzz targets' kept
//!   inputs run through `fuzz/tests/regressions.rs`)
//! - `layout` the layout check alone: no module cycle, imports by module path and no
//!   renaming re-export, every source file over 500 lines listed, every path
//!   docs/ARCHITECTURE.md names present, every function its walk names in its file;
//!   every GPU log in docs/gpu-runs/ cited by a document, every cited one present, at
//!   most 100; and the README's first examples in its first 60 lines, its words within
//!   budget (see layout.rs)
//! - `demo`   setup, then build and run the pipeline demo (`-- --help` for its options)
//! - `doctor` setup, then `handoff doctor` built with every adapter: what is registered and
//!   what was found of libtorch, PJRT and CUDA on this machine
//! - `miri`   the runtime's unit tests under Miri, with both borrow models (needs a nightly
//!   toolchain with the `miri` component; not part of `test`)
//! - `gpu-bundle`  build the GPU tests and benchmarks into `gpu-bundle/` with a `run.sh` (see bundle.rs);
//!   `--baseline <rev>` adds the host-cost benchmarks built at `rev` and an `ab.sh` that
//!   runs both builds in turns (see bundle/baseline.rs); `--prev-wheel <file>` an earlier Python
//!   wheel for the training A/B

mod bundle;
mod deps;
mod layout;
mod python;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = root();
    let result = match args.first().map(String::as_str) {
        Some("setup") => deps::setup(&root).map(|_| ()),
        Some("env") => deps::setup(&root).map(|env| {
            for (k, v) in env.vars() {
                println!("export {k}={v:?}");
            }
        }),
        Some("test") => test(&root, &args[1..]),
        Some("demo") => demo(&root, &args[1..]),
        Some("doctor") => doctor(&root),
        Some("miri") => miri(&root),
        Some("layout") => layout::check(&root),
        Some("gpu-bundle") => bundle::gpu_bundle(&root, &args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <setup|env|test|layout|demo|doctor|miri|gpu-bundle> [args]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Runs `cargo` with the set-up environment, failing on a non-zero exit.
pub fn cargo(root: &Path, env: &deps::Env, args: &[&str]) -> Result<(), String> {
    cargo_with(root, env, &[], args)
}

/// [`cargo`] with extra environment variables.
fn cargo_with(root: &Path, env: &deps::Env, extra: &[(&str, &str)], args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root).args(args);
    for (k, v) in env.vars() {
        cmd.env(k, v);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    println!("xtask: cargo {}", args.join(" "));
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("cargo {} failed ({status})", args.join(" "))) }
}

fn test(root: &Path, extra: &[String]) -> Result<(), String> {
    let env = deps::setup(root)?;
    let lint = !extra.iter().any(|a| a == "--no-lint");
    // A full run, built once: no incremental state (it doubled the workspace crates'
    // share of target/).
    let full = [("CARGO_INCREMENTAL", "0")];
    let cargo = |args: &[&str]| cargo_with(root, &env, &full, args);
    if lint {
        // What docs/ARCHITECTURE.md says of the layout (cycles, sizes, paths): no build.
        layout::check(root)?;
        cargo(&["fmt", "--all", "--check"])?;
        cargo(&["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"])?;
        // The API docs, with every warning (a broken link) an error.
        cargo_with(
            root,
            &env,
            &[full[0], ("RUSTDOCFLAGS", "-D warnings")],
            &["doc", "--workspace", "--no-deps", "--all-features"],
        )?;
    }
    cargo(&["test", "--workspace", "--all-features", "--no-fail-fast"])?;
    // Every fuzz target's kept inputs (fuzz/regressions/<target>/, and the committed
    // seeds), through each target's function on stable: fuzz/ is its own workspace, so
    // the workspace test above does not see it. It builds in the workspace's target
    // directory (same profile, so the dependencies both use are built once); the nightly
    // sanitizer builds of fuzz/run.sh stay in fuzz/target/.
    let fuzz = ["--manifest-path", "fuzz/Cargo.toml", "--target-dir", "target"];
    if lint {
        cargo(&["fmt", "--manifest-path", "fuzz/Cargo.toml", "--check"])?;
        cargo(&[&["clippy"][..], &fuzz, &["--all-targets", "--", "-D", "warnings"]].concat())?;
    }
    cargo(&[&["test"][..], &fuzz, &["--test", "regressions"]].concat())?;
    // The Python package (python/, outside the workspace): its lint, wheel and pytest.
    python::test(root, lint)?;
    println!("xtask: all tests passed");
    Ok(())
}

/// The runtime's unit tests under Miri, which checks the unsafe code (the hand-off's
/// tensor and owner in one allocation, the reaper's erased values) for undefined
/// behaviour, once with Stacked Borrows and once with Tree Borrows. Skipped: the CUDA
/// tests (they load libcuda, a C call Miri cannot make) and the fork test (`fork`).
/// The reaper's thread lives as long as the process, so leaks are not checked.
fn miri(root: &Path) -> Result<(), String> {
    let args = [
        "+nightly",
        "miri",
        "test",
        "-p",
        "handoff-runtime",
        "--lib",
        "--",
        "--skip",
        "cuda::",
        "--skip",
        "forked",
    ];
    for flags in ["-Zmiri-ignore-leaks", "-Zmiri-ignore-leaks -Zmiri-tree-borrows"] {
        println!("xtask: MIRIFLAGS={flags:?} cargo {}", args.join(" "));
        // rustup's `cargo`, which picks the nightly toolchain (not the cargo running
        // this task, which rustup pinned to its own).
        let status = Command::new("cargo")
            .current_dir(root)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env("MIRIFLAGS", flags)
            .args(args)
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            return Err(format!(
                "Miri ({flags}) failed ({status}); it needs `rustup component add --toolchain nightly miri`"
            ));
        }
    }
    println!("xtask: the runtime's unit tests passed under Miri (both borrow models)");
    Ok(())
}

/// `handoff doctor` with every adapter built in, in the environment `env` prints.
fn doctor(root: &Path) -> Result<(), String> {
    let env = deps::setup(root)?;
    cargo(
        root,
        &env,
        &["run", "--release", "--bin", "handoff", "--features", "torch,xla,cuda", "--", "doctor"],
    )
}

fn demo(root: &Path, extra: &[String]) -> Result<(), String> {
    let env = deps::setup(root)?;
    let mut args =
        vec!["run", "--release", "-p", "handoff-examples", "--example", "pipeline", "--all-features", "--"];
    args.extend(extra.iter().map(String::as_str));
    cargo(root, &env, &args)
}
