//! The `handoff` command line: `handoff doctor` prints the registered adapters and
//! what was found of libtorch, PJRT plugins and CUDA, and why not.
//!
//! Adapters are found through the registry: an adapter crate linked into this
//! binary (as a feature of `handoff`) registers itself, and its probe answers its line.

// Link the adapters of the enabled features, so that they register themselves.
#[cfg(feature = "cuda")]
use handoff::adapters::cuda as _;
#[cfg(feature = "torch")]
use handoff::adapters::torch as _;
#[cfg(feature = "xla")]
use handoff::adapters::xla as _;

fn usage() -> &'static str {
    "usage: handoff doctor\n\n  doctor   print the registered adapters and what was found of libtorch, PJRT plugins and CUDA"
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("doctor") => print!("{}", handoff::doctor::report()),
        Some("-h" | "--help" | "help") => println!("{}", usage()),
        Some(other) => {
            eprintln!("unknown command `{other}`\n\n{}", usage());
            std::process::exit(2);
        }
        None => {
            eprintln!("{}", usage());
            std::process::exit(2);
        }
    }
}
