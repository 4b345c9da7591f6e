//! A PyTorch program (through tch) training through a kernel JAX compiled: forward with
//! `kernel.call`, backward with `kernel.vjp()?.call`, SGD in PyTorch
//! ([`handoff_examples::train`]).
//!
//! The kernel is the pipeline's block `y = x + gelu_tanh(layernorm(x @ w))`, a
//! `jax.export` artifact serialized with its VJP (`serialize(vjp_order=1)`); the loss,
//! `mean((y - target)²)`, and the update are PyTorch's. It checks the kernel's gradient
//! against PyTorch's autograd of the same math in f64 and against a central finite
//! difference of the loss through the kernel's forward, then runs the steps and checks
//! that the loss went down; it exits non-zero when a check fails.
//!
//! ```text
//! eval "$(cargo xtask env)"; cargo run -p handoff-examples --example train_step -- --steps 50
//! ```

use handoff_examples::model::{self, Backend, PipelineError};
use handoff_examples::train::{self, W_SHAPE, X_SHAPE};
use handoff_xla::{Client, ClientOptions};
use std::process::ExitCode;
use tch::{Kind, Tensor};

const USAGE: &str = "usage: train_step [--device cpu|cuda] [--steps N] [--lr RATE] [--seed N]";

/// The kernel's gradient (f32) against autograd's (f64): `max |a - b| / max(1, max |b|)`.
const GRAD_TOL: f64 = 1e-4;
/// The directional derivative `<dw, d>` against the central difference of the loss
/// through the kernel's forward (f32), relative.
const FD_TOL: f64 = 1e-2;

struct Args {
    device: Backend,
    steps: usize,
    lr: f64,
    seed: i64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { device: Backend::Cpu, steps: 20, lr: 0.5, seed: 0 };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} takes a value"));
        match a.as_str() {
            "--device" => {
                args.device = match value("--device")?.as_str() {
                    "cpu" => Backend::Cpu,
                    "cuda" => Backend::Cuda,
                    v => return Err(format!("--device: {v:?} is not cpu or cuda")),
                }
            }
            "--steps" => args.steps = value("--steps")?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--lr" => args.lr = value("--lr")?.parse().map_err(|e| format!("--lr: {e}"))?,
            "--seed" => args.seed = value("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            "-h" | "--help" => return Err(String::new()),
            "--" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("train_step: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Before any tch CUDA query: loads libtorch_cuda.so where it exists.
    handoff_torch::init();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("train_step: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<bool, PipelineError> {
    let (device, options) = match args.device {
        Backend::Cpu => (tch::Device::Cpu, ClientOptions::default()),
        Backend::Cuda => {
            if let Some(why) = model::cuda_unavailable() {
                return Err(PipelineError::NoCuda(why));
            }
            // XLA shares the GPU with PyTorch.
            (tch::Device::Cuda(0), ClientOptions::default().preallocate(false))
        }
    };
    let client = Client::new(model::plugin(args.device)?, &options)?;
    let kernel = train::block_kernel(&client)?;
    println!(
        "{} on {}: VJP {} takes {} inputs (primals, then the output's cotangent), returns {}",
        kernel.name(),
        args.device.name(),
        kernel.vjp()?.name(),
        kernel.vjp()?.parameters().map_or(0, |p| p.len()),
        kernel.vjp()?.outputs().len(),
    );

    tch::manual_seed(args.seed);
    let opts = (Kind::Float, device);
    let x = Tensor::f_randn(X_SHAPE, opts)?;
    let target = Tensor::f_randn(X_SHAPE, opts)?;
    let mut w = Tensor::f_randn(W_SHAPE, opts)?.f_div_scalar(4.0)?;
    let mut ok = true;

    // The gradient, three ways: the kernel's VJP, autograd in f64, a finite difference.
    let step = train::sgd_step(&kernel, &x, &w, &target, args.lr)?;
    let (ref_loss, ref_dx, ref_dw) = train::reference(&x, &w, &target)?;
    let (ex, ew) = (train::max_rel_diff(&step.dx, &ref_dx)?, train::max_rel_diff(&step.dw, &ref_dw)?);
    let loss_diff = (step.loss - ref_loss).abs() / ref_loss.max(1.0);
    println!("loss {:.6} (autograd f64: {ref_loss:.6}, relative difference {loss_diff:.1e})", step.loss);
    println!(
        "dx vs autograd: {ex:.1e}, dw vs autograd: {ew:.1e} (tolerance {GRAD_TOL:.0e}, relative to max |grad|)"
    );
    ok &=
        check("kernel gradient matches autograd", ex <= GRAD_TOL && ew <= GRAD_TOL && loss_diff <= GRAD_TOL);

    let dir = Tensor::f_randn(W_SHAPE, opts)?;
    let dir = dir.f_div_scalar(dir.f_norm()?.f_double_value(&[])?)?;
    let eps = 1e-2;
    let loss_at = |w: &Tensor| -> Result<f64, PipelineError> {
        let [y]: [Tensor; 1] = kernel.call([&x, w])?;
        Ok(train::loss_and_cotangent(&y, &target)?.0)
    };
    let fd = (loss_at(&w.f_add(&dir.f_mul_scalar(eps)?)?)? - loss_at(&w.f_sub(&dir.f_mul_scalar(eps)?)?)?)
        / (2.0 * eps);
    let directional = step.dw.f_mul(&dir)?.f_sum(Kind::Double)?.f_double_value(&[])?;
    let fd_err = (fd - directional).abs() / directional.abs().max(1e-3);
    println!(
        "<dw, d> {directional:.6}, central difference {fd:.6} (relative {fd_err:.1e}, tolerance {FD_TOL:.0e})"
    );
    ok &= check("kernel gradient matches the finite difference", fd_err <= FD_TOL);

    // Training: the loss goes down.
    let first = step.loss;
    w = step.w;
    let mut last = first;
    for i in 1..args.steps {
        let step = train::sgd_step(&kernel, &x, &w, &target, args.lr)?;
        if i % 10 == 0 {
            println!("step {i}: loss {:.6}", step.loss);
        }
        last = step.loss;
        w = step.w;
    }
    let [y]: [Tensor; 1] = kernel.call([&x, &w])?;
    let final_loss = train::loss_and_cotangent(&y, &target)?.0;
    println!("{} SGD steps (lr {}): loss {first:.6} -> {final_loss:.6}", args.steps, args.lr);
    ok &= check("the loss went down", final_loss < first && last < first);
    Ok(ok)
}

fn check(what: &str, passed: bool) -> bool {
    println!("{}: {what}", if passed { "ok" } else { "FAILED" });
    passed
}
