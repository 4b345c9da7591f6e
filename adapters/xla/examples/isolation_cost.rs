//! The cost of the isolated loader per load, beside an in-process load of the same
//! bytes: a StableHLO text program and a `jax.export` artifact with its VJP, on the
//! plugin in `HANDOFF_PJRT_PLUGIN` (the CPU or the CUDA plugin). Each isolated load gets
//! bytes no verdict is kept for (the text program with a comment of its own, the
//! artifact with trailing bytes of its own), so every one runs a child. Medians of
//! `N` loads, ms.
//!
//! ```text
//! cargo run -p handoff-xla --release --example isolation_cost -- [N]
//! ```

use handoff_xla::{Client, Kernel, LoadOptions, XlaError};
use std::time::Instant;

/// Makes load `i`'s bytes unlike any other load's (so a child runs for each).
type Unique = fn(&[u8], usize) -> Vec<u8>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), XlaError> {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    let client = Client::from_env()?;
    // Embedded: the GPU bundle runs this far from the tree it was built in.
    let text = include_bytes!("../programs/ln_gelu_f32_64x64.mlir").to_vec();
    let artifact = if client.is_gpu() {
        include_bytes!("../programs/block_f32_8x16_cpu_cuda_vjp.jaxexport").to_vec()
    } else {
        include_bytes!("../programs/block_f32_8x16_cpu_vjp.jaxexport").to_vec()
    };
    let cases: [(&str, Vec<u8>, Unique); 2] = [
        ("StableHLO text (ln_gelu 64x64)", text, |b, i| {
            let mut v = b.to_vec();
            v.extend_from_slice(format!("\n// load {i} of {}\n", std::process::id()).as_bytes());
            v
        }),
        ("jax.export artifact with VJP (block 8x16)", artifact, |b, i| {
            let mut v = b.to_vec();
            v.extend_from_slice(format!("\0load {i} of {}", std::process::id()).as_bytes());
            v
        }),
    ];
    println!(
        "plugin {} ({}, {})",
        client.plugin().path().display(),
        client.platform(),
        client.platform_version()
    );
    for (what, bytes, unique) in cases {
        let (mut trusted, mut isolated) = (Vec::new(), Vec::new());
        for i in 0..n + 1 {
            let t = Instant::now();
            let k = Kernel::load_bytes(&client, bytes.clone(), &LoadOptions::trusted())?;
            if what.contains("VJP") {
                k.vjp()?; // the child compiles the VJP too
            }
            let in_process = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let k = Kernel::load_bytes(&client, unique(&bytes, i), &LoadOptions::default())?;
            if what.contains("VJP") {
                k.vjp()?;
            }
            let with_child = t.elapsed().as_secs_f64() * 1e3;
            if i > 0 {
                trusted.push(in_process);
                isolated.push(with_child);
            }
        }
        let (t, i) = (median(trusted), median(isolated));
        println!(
            "{what}: in-process {t:.1} ms, isolated {i:.1} ms (+{:.1} ms, {:.2}x), median of {n}",
            i - t,
            i / t
        );
    }
    Ok(())
}
