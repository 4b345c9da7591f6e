//! Host cost of the PyTorch and XLA adapters on the CPU machine, so that a regression
//! shows without a GPU (the runtime's own host and mock hand-offs are in
//! `runtime/benches/handoff.rs`):
//!
//! - torch: export of a CPU tensor (+ drop), and export + import + drop;
//! - xla: export of a CPU PJRT buffer (+ drop), and import of host memory (a torch
//!   CPU tensor) as a zero-copy PJRT view (+ drop);
//! - the pipeline's round trip torch -> XLA view -> executed kernel -> torch;
//! - a kernel call on a tiny program, the same steps by hand, and the bare framework
//!   calls beneath them (`kernel call floor`): the call's own share on this machine is
//!   the first figure less the last.
//!
//! The XLA benchmarks need `HANDOFF_PJRT_PLUGIN` (a CPU plugin: `cargo xtask env`);
//! without it they are left out with a message.
//!
//! ```text
//! eval "$(cargo xtask env)"; cargo bench -p handoff-examples --bench adapters
//! ```

use criterion::{Criterion, criterion_group, criterion_main};
use handoff::{Export, Stream, dtype::DataType, transfer_into};
use handoff_examples::model::{Backend, Dtype, Pipeline};
use handoff_torch::CurrentStream;
use handoff_xla::Buffer;
use std::hint::black_box;
use tch::{Device, Kind, Tensor};

fn torch(c: &mut Criterion) {
    let host = Stream::host();
    let x = Tensor::zeros([256, 256], (Kind::Float, Device::Cpu));
    c.bench_function("torch cpu export + drop", |b| {
        b.iter(|| drop(black_box(handoff_torch::export(&x, &host).unwrap())))
    });
    c.bench_function("torch cpu export + import + drop", |b| {
        b.iter(|| {
            let h = handoff_torch::export(&x, &host).unwrap();
            drop(black_box(handoff_torch::import(h).unwrap()));
        })
    });
}

fn xla(c: &mut Criterion) {
    if std::env::var_os(handoff_xla::PLUGIN_ENV).is_none() {
        println!("xla benchmarks left out: {} is not set (`cargo xtask env`)", handoff_xla::PLUGIN_ENV);
        return;
    }
    let p = match Pipeline::new(Backend::Cpu, Dtype::F32, 256, 0) {
        Ok(p) => p,
        Err(e) => {
            println!("xla benchmarks left out: {e}");
            return;
        }
    };
    let host = Stream::host();
    let x = p.initial_x(1).unwrap();
    let client = p.client().clone();
    let y: Buffer = p.xla_kernel().call1(&x).unwrap();
    y.block_until_ready().unwrap();
    c.bench_function("xla cpu buffer export + drop", |b| {
        b.iter(|| drop(black_box(y.clone().export(&host).unwrap())))
    });
    c.bench_function("xla cpu view import of a torch tensor + drop", |b| {
        b.iter(|| drop(black_box(transfer_into::<Buffer, _, _>(&x, &client).unwrap())))
    });
    // The same as the GPU benchmark's torch -> XLA: export to the client's ready
    // stream, then import.
    let ready = client.ready_stream(p.xla_kernel().device()).unwrap();
    c.bench_function("xla cpu view of a torch tensor, exported then imported, + drop", |b| {
        b.iter(|| drop(black_box(client.import(handoff_torch::export(&x, &ready).unwrap()).unwrap())))
    });
    // Beneath the view: PyTorch's describe and PJRT's view of the same memory, bare.
    let (shape, device) = (x.size(), p.xla_kernel().device().clone());
    c.bench_function("xla cpu view floor: describe, bare view, destroy", |b| {
        b.iter(|| {
            let data = handoff_torch::bare_calls::describe(&x).unwrap();
            // SAFETY: `x`'s compact f32 host array, alive for the whole iteration.
            let view =
                unsafe { handoff_xla::bare_calls::view(&client, &device, data, DataType::F32, &shape, 0) };
            drop(black_box(view.unwrap()));
        })
    });
    c.bench_function("xla cpu buffer -> torch tensor + drop", |b| {
        b.iter(|| drop(black_box(transfer_into::<Tensor, _, _>(&y, &CurrentStream).unwrap())))
    });
    c.bench_function("pipeline kernel 256x256 f32: torch -> xla execute -> torch", |b| {
        b.iter(|| drop(black_box(p.kernel(&x).unwrap())))
    });
    handoff::reaper::flush();
    kernel_call(c, &client);
}

/// The one-call kernel on a tiny program (4x8 f32), where the execution costs little
/// and the call's own machinery shows, beside the same steps composed by hand from
/// the public pieces (torch export, XLA view, execute, XLA export, torch import).
fn kernel_call(c: &mut Criterion, client: &handoff_xla::Client) {
    let program = concat!(env!("CARGO_MANIFEST_DIR"), "/../adapters/xla/programs/gelu_scale_f32_4x8.mlir");
    let kernel = match handoff_xla::Kernel::load(client, program) {
        Ok(k) => k,
        Err(e) => {
            println!("kernel call benchmarks left out: {e}");
            return;
        }
    };
    let x = Tensor::ones([4, 8], (Kind::Float, Device::Cpu));
    let host = Stream::host();
    c.bench_function("kernel call 4x8 f32: torch -> xla execute -> torch", |b| {
        b.iter(|| drop(black_box(kernel.call1::<_, _, Tensor, _>(&x).unwrap())))
    });
    let ready = kernel.ready_stream().clone();
    c.bench_function("the same steps by hand: export, view, execute, export, import", |b| {
        b.iter(|| {
            let view = client.import(handoff_torch::export(&x, &ready).unwrap()).unwrap();
            let mut outs = kernel.executable().execute(&[&view]).unwrap();
            drop(view);
            let y = outs.remove(0);
            drop(black_box(handoff_torch::import(y.export(&host).unwrap()).unwrap()))
        })
    });
    // The calls a perfect adapter could not avoid, with nothing of handoff around them
    // (no stream to order on this CPU plugin): PyTorch's describe, PJRT's view and
    // execute, the output's address, PyTorch's `from_blob`.
    let device = kernel.device();
    let (shape, strides) = ([4i64, 8], [8i64, 1]);
    c.bench_function("kernel call floor: describe, view, execute, data pointer, from_blob", |b| {
        b.iter(|| {
            let data = handoff_torch::bare_calls::describe(&x).unwrap();
            // SAFETY: `x`'s compact 4x8 f32 host array, alive for the whole iteration;
            // stream 0: host memory has no device work to order.
            let view =
                unsafe { handoff_xla::bare_calls::view(client, device, data, DataType::F32, &shape, 0) }
                    .unwrap();
            let outs = handoff_xla::bare_calls::execute(kernel.executable(), &[&view]).unwrap();
            drop(view);
            let y = handoff_xla::bare_calls::data_pointer(&outs[0]).unwrap();
            // SAFETY: the output's compact 4x8 f32 host array, alive until `outs` drops
            // after the tensor.
            let t = unsafe {
                handoff_torch::bare_calls::from_blob(
                    y,
                    &shape,
                    &strides,
                    DataType::F32,
                    handoff::Device::Host,
                )
            };
            drop(black_box(t.unwrap()));
            drop(outs);
        })
    });
    handoff::reaper::flush();
}

criterion_group!(benches, torch, xla);
criterion_main!(benches);
