//! `handoff-check`: for people who receive XLA programs. For each file, what it is (a
//! `jax.export` artifact: its function, platforms, inputs, outputs, VJP, calling
//! convention and StableHLO version; or StableHLO text or bytecode) and whether the
//! plugin compiles it, checked in a child process so that a damaged file cannot end
//! this one. Exit status 0 when every file compiled, 1 when one did not, 2 on bad usage.
//!
//! ```text
//! handoff-check [--plugin <PJRT plugin .so>] [--time-limit <seconds>] <file>...
//! ```
//! The plugin defaults to `HANDOFF_PJRT_PLUGIN`. With `HANDOFF_XLA_VERDICT_CACHE` set to
//! a directory, a file that passed there before is not checked again. Also the child
//! program a non-Rust host names in `HANDOFF_XLA_CHECKER` (it links handoff-xla).

use handoff_xla::{Client, ClientOptions, Kernel, LoadOptions, Plugin, Source};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

fn usage(why: &str) -> ExitCode {
    eprintln!(
        "handoff-check: {why}\nusage: handoff-check [--plugin <PJRT plugin .so>] [--time-limit <seconds>] <file>..."
    );
    ExitCode::from(2)
}

/// The producer string of MLIR bytecode (`StableHLO_v1.9.5` for a portable artifact),
/// after its magic and version.
fn producer(bytes: &[u8]) -> Option<String> {
    let rest = bytes.strip_prefix(b"ML\xefR")?;
    // The version, a prefix varint (small: one byte, its low bit set).
    let rest = rest.get(1..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok().map(str::to_owned)
}

fn describe(source: &Source) -> Vec<String> {
    match source {
        Source::Artifact(a) => {
            let list = |specs: &[handoff_xla::ArraySpec]| {
                specs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            };
            vec![
                format!("jax.export artifact of {}", a.function_name()),
                format!("platforms: {}", a.platforms().join(", ")),
                format!("inputs: ({})", list(a.inputs())),
                format!("outputs: ({})", list(a.outputs())),
                format!("VJP: {}", if a.has_vjp() { "serialized (vjp_order >= 1)" } else { "none" }),
                format!("calling convention: version {}", a.calling_convention_version()),
                format!(
                    "module: {}",
                    producer(a.module()).unwrap_or_else(|| "StableHLO (no producer string)".into())
                ),
            ]
        }
        Source::Program(p) if p.is_bytecode() => {
            vec![format!(
                "StableHLO bytecode: {}",
                producer(p.code()).unwrap_or_else(|| "no producer string".into())
            )]
        }
        Source::Program(_) => vec!["StableHLO text".into()],
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut plugin, mut limit, mut files) = (None, None, Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--plugin" => plugin = args.next().map(PathBuf::from),
            "--time-limit" => match args.next().and_then(|s| s.parse::<f64>().ok()) {
                Some(s) if s > 0.0 => limit = Some(Duration::from_secs_f64(s)),
                _ => return usage("--time-limit takes a number of seconds"),
            },
            "-h" | "--help" => return usage("checks XLA programs and jax.export artifacts"),
            _ => files.push(PathBuf::from(a)),
        }
    }
    if files.is_empty() {
        return usage("no file given");
    }
    let client = plugin
        .map_or_else(Plugin::from_env, Plugin::load)
        .and_then(|p| Client::new(p, &ClientOptions::default()));
    let client = match client {
        Ok(c) => c,
        Err(e) => return usage(&format!("no PJRT client: {e}")),
    };
    let mut options = LoadOptions::default();
    if let Some(l) = limit {
        options = options.time_limit(l);
    }
    let mut all = true;
    for file in &files {
        println!("{}:", file.display());
        match Source::from_file(file) {
            Ok(source) => describe(&source).iter().for_each(|l| println!("  {l}")),
            Err(e) => {
                println!("  refused: {e}");
                all = false;
                continue;
            }
        }
        let children = handoff_xla::isolation::children_run();
        match Kernel::load_with(&client, file, &options) {
            Ok(_) => {
                let how = if handoff_xla::isolation::children_run() > children {
                    "checked in a child process"
                } else {
                    "passed the check before (verdict kept)"
                };
                println!(
                    "  compiles on {} ({}), isolated: {how}",
                    client.platform(),
                    client.platform_version()
                )
            }
            Err(e) => {
                println!("  does not compile: {e}");
                all = false;
            }
        }
    }
    if all { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
