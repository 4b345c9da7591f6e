//! How many heap allocations handoff makes on the calling thread per hand-off and per
//! kernel call (a counting global allocator; PyTorch's and PJRT's own C++ allocations
//! are not counted, nor the reaper's thread). The hot paths allocate one DLPack tensor
//! per hand-off and nothing else: a regression here is host time on every call.
//!
//! Needs the CPU PJRT plugin of `HANDOFF_PJRT_PLUGIN` (`cargo xtask env`).

mod common;

use common::cpu_client;
use handoff::{
    Device, Export, Ready, Release, Stream, StreamOrdered, TensorDesc, dtype::DataType, transfer_into,
};
use handoff_torch::CurrentStream;
use handoff_xla::{Buffer, Kernel, ViewOptions};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tch::{Kind, Tensor};

/// Counts the allocations of the calling thread.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn counted() {
    // A const thread-local without a destructor: touching it never allocates.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        // SAFETY: forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The allocations `f` makes per call on this thread, over 100 calls after 100 of
/// warm-up (rounded down: a list that grows once in a while is not counted per call).
fn per_call(mut f: impl FnMut()) -> usize {
    (0..100).for_each(|_| f());
    let before = ALLOCATIONS.with(Cell::get);
    (0..100).for_each(|_| f());
    (ALLOCATIONS.with(Cell::get) - before) / 100
}

#[test]
fn a_hand_off_allocates_its_dlpack_tensor_and_nothing_else() {
    let host = Stream::host();
    let x = Tensor::ones([4, 8], (Kind::Float, tch::Device::Cpu));
    let export = per_call(|| drop(handoff_torch::export(&x, &host).unwrap()));
    assert_eq!(export, 1, "a torch export: its DLPack tensor");
    let round_trip =
        per_call(|| drop(handoff_torch::import(handoff_torch::export(&x, &host).unwrap()).unwrap()));
    assert_eq!(round_trip, 1, "torch -> torch: the storage owns the hand-off itself, no box around it");
    let Some(client) = cpu_client() else { return };
    let y: Buffer = transfer_into(&x, &client).unwrap();
    let xla_export = per_call(|| drop(y.clone().export(&host).unwrap()));
    assert_eq!(xla_export, 1, "an XLA export: its DLPack tensor");
    let to_torch = per_call(|| drop(transfer_into::<Tensor, _, _>(&y, &CurrentStream).unwrap()));
    assert_eq!(to_torch, 1, "XLA -> torch: the export's DLPack tensor, no box in the import");
    // A shared view of foreign memory: the export and the buffer's record (PJRT's
    // callback owns the hand-off itself); with a watch, the view's owner too.
    let view = per_call(|| drop(transfer_into::<Buffer, _, _>(&x, &client).unwrap()));
    assert_eq!(view, 2, "torch -> XLA buffer");
    let watched = ViewOptions::default().watched();
    let watched_view =
        per_call(|| drop(client.import_with(handoff_torch::export(&x, &host).unwrap(), watched).unwrap()));
    assert_eq!(watched_view, 3, "torch -> XLA buffer with a watch");
}

#[test]
fn a_kernel_call_allocates_one_dlpack_tensor_per_hand_off() {
    let Some(client) = cpu_client() else { return };
    let program = include_str!("../../adapters/xla/programs/gelu_scale_f32_4x8.mlir");
    let kernel = Kernel::compile(&client, handoff_xla::Program::text(program), &Default::default()).unwrap();
    let x = Tensor::ones([4, 8], (Kind::Float, tch::Device::Cpu));
    let call = per_call(|| drop(kernel.call1::<_, _, Tensor, _>(&x).unwrap()));
    // torch -> XLA: the export alone (the input is a bare view that owns its
    // hand-off); XLA -> torch: the output's export alone (no buffer record, no box).
    assert_eq!(call, 2, "a kernel call on a PyTorch tensor, back to PyTorch");
    handoff::reaper::flush();
}

/// Host memory of 4x8 `f32`, 64-byte aligned (XLA's CPU client views it in place),
/// that counts its drops.
struct Counted {
    data: Box<Aligned>,
    drops: Arc<AtomicUsize>,
}

#[repr(align(64))]
struct Aligned([f32; 32]);

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

impl StreamOrdered for Counted {
    fn device(&self) -> Device {
        Device::Host
    }
    fn stream(&self) -> Option<Stream> {
        None
    }
}

impl Export for Counted {
    fn describe(&self) -> handoff::Result<TensorDesc<'_>> {
        Ok(TensorDesc::new(self.data.0.as_ptr() as *mut _, Device::Host, DataType::F32, &[4i64, 8][..]))
    }
}

#[test]
fn a_kernel_calls_input_is_released_once_after_its_execution() {
    let Some(client) = cpu_client() else { return };
    let program = include_str!("../../adapters/xla/programs/gelu_scale_f32_4x8.mlir");
    let kernel = Kernel::compile(&client, handoff_xla::Program::text(program), &Default::default()).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    for i in 1..=20 {
        let input = Counted { data: Box::new(Aligned([0.5; 32])), drops: drops.clone() };
        let y: Tensor = kernel.call1(input).unwrap();
        assert_eq!(y.size(), [4, 8]);
        handoff::reaper::flush();
        assert_eq!(drops.load(Ordering::SeqCst), i, "call {i}: its input released exactly once");
    }
    // The same memory handed off without the kernel: released once too.
    let h =
        Counted { data: Box::new(Aligned([0.5; 32])), drops: drops.clone() }.export(&Stream::host()).unwrap();
    assert_eq!((h.ready(), h.release()), (Ready::Elided, Release::AfterConsumer));
    drop(h);
    handoff::reaper::flush();
    assert_eq!(drops.load(Ordering::SeqCst), 21);
}
