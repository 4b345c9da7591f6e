//! A training step through a kernel JAX compiled, with its gradient: the `train_step`
//! example and its test share it.
//!
//! The kernel is the pipeline's block `y = x + gelu_tanh(layernorm(x @ w))` (layer norm
//! over the last axis, eps 1e-5, no affine), exported by JAX for `("cpu", "cuda")` with
//! its VJP (`exported.serialize(vjp_order=1)`, `adapters/xla/programs/export.py`). A
//! PyTorch program (through tch) trains `w` on the loss `mean((y - target)²)`:
//!
//! 1. forward: `let [y]: [Tensor; 1] = kernel.call([&x, &w])?` (x and w to XLA, y back,
//!    no copy);
//! 2. the loss and its gradient with respect to `y` in PyTorch:
//!    `dy = 2 (y - target) / numel`;
//! 3. backward: `let [dx, dw]: [Tensor; 2] = kernel.vjp()?.call([&x, &w, &dy])?` (the
//!    primals, then the cotangent of each output; the cotangent of each input back);
//! 4. one SGD step in PyTorch: `w - lr * dw`.
//!
//! The check ([`reference()`]) is the same loss differentiated by PyTorch's autograd
//! alone, in f64.
//!
//! ```no_run
//! use handoff_examples::train;
//! use tch::{Device, Kind, Tensor};
//! let client = handoff_xla::Client::from_env()?;
//! let kernel = train::block_kernel(&client)?;
//! let opts = (Kind::Float, Device::Cpu);
//! let (x, target) = (Tensor::randn([8, 16], opts), Tensor::randn([8, 16], opts));
//! let w = Tensor::randn([16, 16], opts) / 4.0;
//! let step = train::sgd_step(&kernel, &x, &w, &target, 0.5)?;
//! assert_eq!(step.w.size(), [16, 16]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::model::{EPS, Result};
use handoff_xla::{Client, CompileOptions, Kernel, Source};
use tch::{Kind, Tensor};

/// The block `x + gelu_tanh(layernorm(x @ w))` for `x: f32[8, 16]`, `w: f32[16, 16]`,
/// exported by JAX for `("cpu", "cuda")` with its VJP (embedded: the binary runs from
/// anywhere).
pub const BLOCK_VJP: &[u8] = include_bytes!("../adapters/xla/programs/block_f32_8x16_cpu_cuda_vjp.jaxexport");

/// The shape of `x` (and of `y` and the target).
pub const X_SHAPE: [i64; 2] = [8, 16];
/// The shape of `w`.
pub const W_SHAPE: [i64; 2] = [16, 16];

/// Compiles the block ([`BLOCK_VJP`]) for the client's first device; its VJP is
/// compiled on the first [`Kernel::vjp`].
pub fn block_kernel(client: &Client) -> Result<Kernel> {
    let source = Source::from_bytes(BLOCK_VJP.to_vec(), None)?;
    Ok(Kernel::compile(client, source, &CompileOptions::default())?)
}

/// What one SGD step computed.
#[derive(Debug)]
pub struct Step {
    /// The loss before the step, `mean((y - target)²)`.
    pub loss: f64,
    /// The kernel's output `y`.
    pub y: Tensor,
    /// The gradient of the loss with respect to `x`, from the kernel's VJP.
    pub dx: Tensor,
    /// The gradient of the loss with respect to `w`, from the kernel's VJP.
    pub dw: Tensor,
    /// `w` after the step: `w - lr * dw`.
    pub w: Tensor,
}

/// `mean((y - target)²)` and its gradient with respect to `y`, `2 (y - target) / numel`.
pub fn loss_and_cotangent(y: &Tensor, target: &Tensor) -> Result<(f64, Tensor)> {
    let diff = y.f_sub(target)?;
    let loss = diff.f_square()?.f_mean(Kind::Double)?.f_double_value(&[])?;
    let dy = diff.f_mul_scalar(2.0 / diff.numel() as f64)?;
    Ok((loss, dy))
}

/// One SGD step on `w` through the kernel: forward with [`Kernel::call`], the loss and
/// its cotangent in PyTorch ([`loss_and_cotangent`]), backward with the kernel's VJP,
/// the update in PyTorch. The tensors are the caller's (they must not require grad:
/// autograd does not see through the kernel, the VJP is the backward pass).
pub fn sgd_step(kernel: &Kernel, x: &Tensor, w: &Tensor, target: &Tensor, lr: f64) -> Result<Step> {
    let [y]: [Tensor; 1] = kernel.call([x, w])?;
    let (loss, dy) = loss_and_cotangent(&y, target)?;
    let [dx, dw]: [Tensor; 2] = kernel.vjp()?.call([x, w, &dy])?;
    let w = w.f_sub(&dw.f_mul_scalar(lr)?)?;
    Ok(Step { loss, y, dx, dw, w })
}

/// The block in PyTorch alone: `x + gelu_tanh(layernorm(x @ w))`, in `x`'s kind.
pub fn block_torch(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let h = x.f_matmul(w)?;
    let mean = h.f_mean_dim([-1i64].as_slice(), true, h.kind())?;
    let centered = h.f_sub(&mean)?;
    let var = centered.f_square()?.f_mean_dim([-1i64].as_slice(), true, h.kind())?;
    let normed = centered.f_mul(&var.f_add_scalar(EPS)?.f_rsqrt()?)?;
    Ok(x.f_add(&normed.f_gelu("tanh")?)?)
}

/// The loss and its gradients with respect to `x` and `w` by PyTorch's autograd alone,
/// in f64 (returned in f64): the reference of [`sgd_step`].
pub fn reference(x: &Tensor, w: &Tensor, target: &Tensor) -> Result<(f64, Tensor, Tensor)> {
    let x = x.f_to_kind(Kind::Double)?.f_detach()?.set_requires_grad(true);
    let w = w.f_to_kind(Kind::Double)?.f_detach()?.set_requires_grad(true);
    let target = target.f_to_kind(Kind::Double)?;
    let loss = block_torch(&x, &w)?.f_sub(&target)?.f_square()?.f_mean(Kind::Double)?;
    loss.f_backward()?;
    Ok((loss.f_double_value(&[])?, x.grad(), w.grad()))
}

/// `max |a - b| / max(1, max |b|)`, in f64.
pub fn max_rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (a, b) = (a.f_to_kind(Kind::Double)?, b.f_to_kind(Kind::Double)?);
    let diff = a.f_sub(&b)?.f_abs()?.f_max()?.f_double_value(&[])?;
    let scale = b.f_abs()?.f_max()?.f_double_value(&[])?.max(1.0);
    Ok(diff / scale)
}
