//! Seeded byte mutations of the committed `jax.export` artifacts, each loaded through
//! the isolated loader (`Kernel::load_bytes`): the tally of what the child did with
//! them, and this process alive at the end (it is the caller every load would have
//! killed). Mutations handoff's own format checks refuse never reach a child and are
//! counted apart.
//!
//! ```text
//! cargo run -p handoff-xla --release --example isolation_sweep -- [N per artifact] [seed] [keep dir]
//! ```
//! With a keep dir, each mutation that killed its child is written there.

use handoff_xla::{Client, Kernel, LoadOptions, Source, XlaError};
use std::path::PathBuf;
use std::time::Instant;

const ARTIFACTS: &[&str] = &[
    "ln_gelu_f32_8x16_cpu.jaxexport",
    "ln_gelu_f32_8x16_cpu_cuda.jaxexport",
    "residual_f32_8x16_cpu_cuda.jaxexport",
    "block_f32_8x16_cpu_vjp.jaxexport",
    "block_f32_8x16_cpu_cuda_vjp.jaxexport",
];

/// xorshift64*: the mutations are a function of the seed alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// `bytes` with 1 to 8 bytes overwritten, at places and with values from `rng`.
fn mutate(bytes: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut m = bytes.to_vec();
    for _ in 0..1 + rng.next() % 8 {
        let at = (rng.next() % m.len() as u64) as usize;
        m[at] = rng.next() as u8;
    }
    m
}

fn main() -> Result<(), XlaError> {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let seed: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1);
    let keep = args.get(3).map(PathBuf::from);
    let client = Client::from_env()?;
    let programs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("programs");
    let (mut format, mut passed, mut refused, mut died, mut other) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let started = Instant::now();
    // A mutation can make the plugin loop: ten seconds is far above any of these compiles.
    let options = LoadOptions::default().time_limit(std::time::Duration::from_secs(10));
    for name in ARTIFACTS {
        let bytes = std::fs::read(programs.join(name)).expect("a committed artifact");
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ name.len() as u64 | 1);
        for i in 0..n {
            let m = mutate(&bytes, &mut rng);
            if Source::from_bytes(m.clone(), None).is_err() {
                format += 1; // handoff's own checks: no child
                continue;
            }
            match Kernel::load_bytes(&client, m.clone(), &options) {
                Ok(_) => passed += 1,
                Err(XlaError::Refused { outcome, .. }) if outcome.starts_with("the plugin refused") => {
                    refused += 1
                }
                Err(XlaError::Refused { outcome, last_line, .. }) => {
                    died += 1;
                    println!("{name} mutation {i}: {outcome}; last line: {last_line}");
                    if let Some(dir) = &keep {
                        std::fs::create_dir_all(dir).expect("keep dir");
                        let file = dir.join(format!(
                            "{}-seed{seed}-{i}.jaxexport",
                            name.trim_end_matches(".jaxexport")
                        ));
                        std::fs::write(&file, &m).expect("write a kept mutation");
                    }
                }
                Err(e) => {
                    other += 1;
                    println!("{name} mutation {i}: {e}");
                }
            }
        }
    }
    println!(
        "isolation sweep: {} mutations ({n} of each of {} artifacts, seed {seed}) in {:.1} s: {format} refused by \
         handoff's format checks (no child), {passed} compiled, {refused} refused by the plugin, {died} ended their \
         child, {other} other errors; children run {}; this process alive",
        n * ARTIFACTS.len() as u64,
        ARTIFACTS.len(),
        started.elapsed().as_secs_f64(),
        handoff_xla::isolation::children_run(),
    );
    Ok(())
}
