//! The pipeline demo. Until the PyTorch and XLA adapters land it runs the protocol on
//! the mock device: a "model" stream produces activations, a "kernel" stream consumes
//! them through a hand-off, the result comes back, N times; then it checks the values,
//! reports hazards (none expected) and prints the hand-off stats.
//!
//! `cargo xtask demo -- --iters 100`

use handoff::mock::{Kernel, Mock, MockTensor};
use handoff::{Export, reaper, stats};

fn main() {
    let iters: usize = std::env::args()
        .skip_while(|a| a != "--iters")
        .nth(1)
        .map(|v| v.parse().expect("--iters takes a number"))
        .unwrap_or(100);
    let mock = Mock::new();
    let model = mock.stream(0, "model");
    let kernel = mock.stream(0, "xla-kernel");
    let before = stats::stats();
    let mut expected = 0.0f32;
    let mut x = mock.tensor_f32(&model, "x", &[1024], &[0.0; 1024]);
    for i in 0..iters {
        // The model step: x = x + 1 on the model stream.
        let id = x.buffer();
        mock.launch(
            &model,
            Kernel::new("model step").micros(40).reads(id).writes(id).run(move |k| {
                let v: Vec<f32> = k.read_f32(id).iter().map(|v| v + 1.0).collect();
                k.write_f32(id, &v);
            }),
        );
        // Hand x to the kernel stream, which doubles it into a fresh buffer.
        let seen: MockTensor = x.export(&kernel).expect("export").import().expect("import");
        let out = mock.tensor_f32(&kernel, "y", &[1024], &[0.0; 1024]);
        let (s, o) = (seen.buffer(), out.buffer());
        mock.launch(
            &kernel,
            Kernel::new("fused kernel").micros(10).reads(s).writes(o).run(move |k| {
                let v: Vec<f32> = k.read_f32(s).iter().map(|v| v * 2.0).collect();
                k.write_f32(o, &v);
            }),
        );
        drop(seen); // released only after the fused kernel is done
        // And back to the model stream.
        x = out.export(&model).expect("export back").import().expect("import back");
        expected = (expected + 1.0) * 2.0;
        if (i + 1) % (iters / 4).max(1) == 0 {
            println!(
                "iteration {:>5}/{iters} enqueued (device time so far: {} us)",
                i + 1,
                mock.now() / 1_000
            );
        }
    }
    mock.synchronize();
    println!("all work done after {} us of simulated device time", mock.now() / 1_000);
    let got = mock.read_f32(&x);
    let ok = got.iter().all(|&v| v == expected);
    reaper::flush_stream(&kernel);
    reaper::flush_stream(&model);
    let hazards = mock.hazards();
    let d = stats::stats().since(&before);
    println!("result: {} (every element {expected}, checked)", if ok { "correct" } else { "WRONG" });
    println!("hazards: {}", hazards.len());
    for h in &hazards {
        println!("  {h}");
    }
    println!("hand-off stats: {d}");
    println!("host syncs on the hand-off path: {} (the demo's own final sync is the mock's)", d.host_syncs);
    if !ok || !hazards.is_empty() {
        std::process::exit(1);
    }
}
