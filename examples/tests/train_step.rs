//! A `jax.export` artifact's VJP through tch on the CPU (CI, the CPU PJRT plugin of
//! `HANDOFF_PJRT_PLUGIN`): the gradient of a loss through the kernel on PyTorch tensors
//! against JAX's own values and PyTorch's autograd, zero copies, and SGD steps that
//! lower the loss.

mod common;

use common::cpu_client;
use handoff::stats;
use handoff_examples::train::{self, W_SHAPE, X_SHAPE};
use tch::{Device, Kind, Tensor};

/// JAX's inputs and values (`jax.vjp`, written by `adapters/xla/programs/export.py`).
#[allow(dead_code, reason = "the integer-valued function's values are handoff-xla's test")]
mod jax {
    include!("../../adapters/xla/programs/vjp_reference.rs");
}

/// The kernel (f32) against JAX (f32, same XLA): `max |a - b| / max(1, max |b|)`.
const JAX_TOL: f64 = 1e-5;
/// The kernel (f32) against PyTorch's autograd in f64.
const AUTOGRAD_TOL: f64 = 1e-4;

fn tensor(values: &[f32], shape: [i64; 2]) -> Tensor {
    Tensor::from_slice(values).reshape(shape)
}

#[test]
fn vjp_on_tch_tensors_matches_jax_cpu() {
    let Some(client) = cpu_client() else { return };
    let kernel = train::block_kernel(&client).unwrap();
    let (x, w) = (tensor(&jax::BLOCK_X, X_SHAPE), tensor(&jax::BLOCK_W, W_SHAPE));
    let ct = tensor(&jax::BLOCK_CT, X_SHAPE);
    let [y]: [Tensor; 1] = kernel.call([&x, &w]).unwrap();
    assert!(train::max_rel_diff(&y, &tensor(&jax::BLOCK_Y, X_SHAPE)).unwrap() <= JAX_TOL);
    let vjp = kernel.vjp().unwrap();
    let (grads, d) = stats::measure(|| vjp.call::<_, _, [Tensor; 2], _>([&x, &w, &ct]));
    let [dx, dw] = grads.unwrap();
    // Three tensors to XLA, two back, all views.
    assert_eq!((d.exports, d.copies), (5, 0));
    let (ex, ew) = (
        train::max_rel_diff(&dx, &tensor(&jax::BLOCK_DX, X_SHAPE)).unwrap(),
        train::max_rel_diff(&dw, &tensor(&jax::BLOCK_DW, W_SHAPE)).unwrap(),
    );
    println!("against jax.vjp: dx {ex:.1e}, dw {ew:.1e}");
    assert!(ex <= JAX_TOL && ew <= JAX_TOL, "dx {ex}, dw {ew}");
    // A cotangent of the wrong shape names the argument, before anything runs.
    let e = vjp.call::<_, _, [Tensor; 2], _>([&x, &w, &w]).unwrap_err();
    assert!(e.to_string().starts_with("input 2 of vjp(block): shape is f32[16, 16]"), "{e}");
}

#[test]
fn sgd_step_through_the_kernel_matches_autograd_cpu() {
    let Some(client) = cpu_client() else { return };
    let kernel = train::block_kernel(&client).unwrap();
    tch::manual_seed(7);
    let opts = (Kind::Float, Device::Cpu);
    let x = Tensor::randn(X_SHAPE, opts);
    let target = Tensor::randn(X_SHAPE, opts);
    let mut w = Tensor::randn(W_SHAPE, opts) / 4.0;
    let step = train::sgd_step(&kernel, &x, &w, &target, 0.5).unwrap();
    let (loss, dx, dw) = train::reference(&x, &w, &target).unwrap();
    assert!((step.loss - loss).abs() <= AUTOGRAD_TOL * loss.max(1.0), "{} vs {loss}", step.loss);
    let (ex, ew) = (train::max_rel_diff(&step.dx, &dx).unwrap(), train::max_rel_diff(&step.dw, &dw).unwrap());
    println!("against autograd (f64): dx {ex:.1e}, dw {ew:.1e}");
    assert!(ex <= AUTOGRAD_TOL && ew <= AUTOGRAD_TOL, "dx {ex}, dw {ew}");
    // The step is w - lr * dw, and the loss goes down over a few.
    assert!(train::max_rel_diff(&step.w, &(&w - step.dw.shallow_clone() * 0.5)).unwrap() <= 1e-7);
    let first = step.loss;
    w = step.w;
    for _ in 0..10 {
        w = train::sgd_step(&kernel, &x, &w, &target, 0.5).unwrap().w;
    }
    let last = train::sgd_step(&kernel, &x, &w, &target, 0.5).unwrap().loss;
    assert!(last < 0.9 * first, "loss {first} -> {last}");
}

// ----------------------------------------------------------------- GPU

/// The CUDA client, or `None` after printing why not (failing when
/// `HANDOFF_REQUIRE_GPU=1`, as the GPU bundle sets).
fn gpu_client() -> Option<handoff_xla::Client> {
    use handoff_examples::model;
    let why = model::cuda_unavailable()
        .or_else(|| model::plugin(model::Backend::Cuda).err().map(|e| e.to_string()));
    if let Some(why) = why {
        assert!(
            std::env::var_os("HANDOFF_REQUIRE_GPU").is_none_or(|v| v != "1"),
            "a GPU is required (HANDOFF_REQUIRE_GPU=1) but: {why}"
        );
        println!("SKIPPED: {why}");
        return None;
    }
    let plugin = model::plugin(model::Backend::Cuda).unwrap();
    let options = handoff_xla::ClientOptions::default().preallocate(false);
    Some(handoff_xla::Client::new(plugin, &options).unwrap())
}

/// The `("cpu", "cuda")` VJP artifact on PyTorch CUDA tensors: platform index 1, JAX's
/// (CPU) values within 1e-4, autograd's too, and no host sync in the forward and
/// backward calls.
#[test]
fn vjp_on_tch_cuda_tensors_gpu() {
    handoff_torch::init();
    let Some(client) = gpu_client() else { return };
    let kernel = train::block_kernel(&client).unwrap();
    let vjp = kernel.vjp().unwrap();
    let cuda = |t: Tensor| t.to_device(Device::Cuda(0));
    let (x, w) = (cuda(tensor(&jax::BLOCK_X, X_SHAPE)), cuda(tensor(&jax::BLOCK_W, W_SHAPE)));
    let ct = cuda(tensor(&jax::BLOCK_CT, X_SHAPE));
    tch::Cuda::synchronize(0);
    let (out, d) = stats::measure(|| -> handoff_xla::Result<_> {
        let [y]: [Tensor; 1] = kernel.call([&x, &w])?;
        let [dx, dw]: [Tensor; 2] = vjp.call([&x, &w, &ct])?;
        Ok((y, dx, dw))
    });
    let (y, dx, dw) = out.unwrap();
    assert_eq!((d.host_syncs, d.copies), (0, 0), "forward and backward enqueued, nothing copied");
    let tol = 1e-4;
    for (got, want, shape, what) in [
        (&y, &jax::BLOCK_Y[..], X_SHAPE, "y"),
        (&dx, &jax::BLOCK_DX[..], X_SHAPE, "dx"),
        (&dw, &jax::BLOCK_DW[..], W_SHAPE, "dw"),
    ] {
        assert_eq!(got.device(), Device::Cuda(0));
        let e = train::max_rel_diff(&got.to_device(Device::Cpu), &tensor(want, shape)).unwrap();
        println!("CUDA {what} against jax.vjp (CPU): {e:.1e}");
        assert!(e <= tol, "{what}: {e}");
    }
    tch::manual_seed(3);
    let target = Tensor::randn(X_SHAPE, (Kind::Float, Device::Cuda(0)));
    let step = train::sgd_step(&kernel, &x, &w, &target, 0.5).unwrap();
    let (_, rdx, rdw) = train::reference(&x, &w, &target).unwrap();
    let (ex, ew) =
        (train::max_rel_diff(&step.dx, &rdx).unwrap(), train::max_rel_diff(&step.dw, &rdw).unwrap());
    println!("CUDA against autograd (f64): dx {ex:.1e}, dw {ew:.1e}");
    assert!(ex <= AUTOGRAD_TOL && ew <= AUTOGRAD_TOL, "dx {ex}, dw {ew}");
}
