//! Host cost of the hand-off machinery on the CPU machine, so that a regression shows
//! without a GPU: export + drop of host memory, same-stream and cross-stream round
//! trips on device streams whose backend does nothing and lives as long as the
//! process, as CUDA's does (the runtime's share of a CUDA hand-off: the description
//! laid out and checked, the tensor imported; across streams, an event from the
//! thread's spares recorded and waited on, and the release queued behind another;
//! and the same two with the drop left out of the timing, as `handoff-cuda`'s GPU
//! benchmark times the hand-off one at a time against the project's host-cost targets),
//! mock same-stream and cross-stream round trips (record + wait + deferred release
//! included), and validation of a foreign DLPack tensor. `cargo bench -p
//! handoff-runtime`.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use handoff_runtime::mock::{Mock, MockTensor};
use handoff_runtime::testing::NoopBackend;
use handoff_runtime::{
    Device, Export, Handoff, Import, Ready, Result, Stream, StreamOrdered, TensorDesc, dtype::DataType, order,
};
use std::sync::Arc;

struct HostVec(Vec<f32>, [i64; 2]);

impl StreamOrdered for HostVec {
    fn device(&self) -> Device {
        Device::Host
    }
    fn stream(&self) -> Option<Stream> {
        None
    }
}

impl Export for HostVec {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        Ok(TensorDesc::new(self.0.as_ptr() as *mut _, Device::Host, DataType::F32, &self.1[..]))
    }
}

/// A device tensor shaped like `handoff-cuda`'s owned one: its memory, its stream
/// (with an owner, as a cudarc stream's), shape and strides; imported, the hand-off.
/// Within 128 bytes, as that one is: a larger value is moved by a call to `memmove`.
enum DeviceTensor {
    Owned { memory: Vec<f32>, stream: Stream, shape: Vec<i64>, strides: Vec<i64> },
    Imported(Handoff),
}

impl DeviceTensor {
    fn new(stream: &Stream) -> DeviceTensor {
        DeviceTensor::Owned {
            memory: vec![0.0; 256],
            stream: stream.clone(),
            shape: vec![16, 16],
            strides: vec![16, 1],
        }
    }

    fn on(&self) -> &Stream {
        match self {
            DeviceTensor::Owned { stream, .. } => stream,
            DeviceTensor::Imported(h) => h.consumer_stream(),
        }
    }
}

impl StreamOrdered for DeviceTensor {
    fn device(&self) -> Device {
        Device::Cuda(0)
    }
    fn stream(&self) -> Option<Stream> {
        Some(self.on().clone())
    }
    fn held_release_stream(&self) -> Option<&Stream> {
        Some(self.on())
    }
    fn ready_on(&self, consumer: &Stream) -> Result<Ready> {
        order(Some(self.on()), consumer)
    }
}

impl Export for DeviceTensor {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        match self {
            DeviceTensor::Owned { memory, shape, strides, .. } => {
                Ok(TensorDesc::new(memory.as_ptr() as *mut _, Device::Cuda(0), DataType::F32, &shape[..])
                    .with_strides(&strides[..]))
            }
            DeviceTensor::Imported(h) => Ok(h.desc()),
        }
    }
}

impl Import for DeviceTensor {
    fn from_handoff(handoff: Handoff) -> Result<DeviceTensor> {
        assert!(handoff.dtype() == DataType::F32 && handoff.is_contiguous());
        Ok(DeviceTensor::Imported(handoff))
    }
}

const _: () = assert!(size_of::<DeviceTensor>() <= 128);

/// A device backend whose calls do nothing (and count nothing): what is left is the
/// runtime's own work. Lives as long as the process, as the CUDA backend does
/// (`Stream::new_static`).
static IDLE: NoopBackend = NoopBackend::new(Device::Cuda(0));

fn bench(c: &mut Criterion) {
    let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(());
    let device = Stream::new_static(&IDLE, 0x1000).with_owner(owner.clone());
    let other = Stream::new_static(&IDLE, 0x2000).with_owner(owner);
    c.bench_function("device same-stream export + import + drop (idle backend)", |b| {
        b.iter_batched(
            || DeviceTensor::new(&device),
            |x| drop(black_box(x.export(&device).unwrap().import::<DeviceTensor>().unwrap())),
            criterion::BatchSize::SmallInput,
        )
    });
    // Its memory goes back on `device`, so the release waits for `other`'s work: one
    // event recorded and queued for the reaper, which finds it done at its next sweep.
    c.bench_function("device cross-stream export + import + drop (idle backend)", |b| {
        b.iter_batched(
            || DeviceTensor::new(&device),
            |x| drop(black_box(x.export(&other).unwrap().import::<DeviceTensor>().unwrap())),
            criterion::BatchSize::SmallInput,
        )
    });
    // The two figures `handoff-cuda`'s GPU benchmark takes one at a time, with the
    // drop (the release) left out of the timing, as there.
    for (name, consumer) in [
        ("device same-stream export + import, drop untimed (idle backend)", &device),
        ("device cross-stream export + import, drop untimed (idle backend)", &other),
    ] {
        c.bench_function(name, |b| {
            b.iter_batched(
                || DeviceTensor::new(&device),
                |x| x.export(consumer).unwrap().import::<DeviceTensor>().unwrap(),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    handoff_runtime::reaper::flush();

    let host = Stream::host();
    c.bench_function("host export + drop", |b| {
        b.iter_batched(
            || HostVec(vec![0.0; 16], [4, 4]),
            |v| drop(black_box(v.export(&host).unwrap())),
            criterion::BatchSize::SmallInput,
        )
    });

    let mock = Mock::new();
    let (s0, s1) = (mock.stream(0, "a"), mock.stream(0, "b"));
    c.bench_function("mock same-stream export + import + drop", |b| {
        b.iter_batched(
            || mock.tensor_f32(&s0, "x", &[4, 4], &[0.0; 16]),
            |x| {
                let y: MockTensor = x.export(&s0).unwrap().import().unwrap();
                drop(black_box(y));
            },
            criterion::BatchSize::SmallInput,
        )
    });
    c.bench_function("mock cross-stream export + import + drop", |b| {
        b.iter_batched(
            || mock.tensor_f32(&s0, "x", &[4, 4], &[0.0; 16]),
            |x| {
                let y: MockTensor = x.export(&s1).unwrap().import().unwrap();
                drop(black_box(y));
            },
            criterion::BatchSize::SmallInput,
        )
    });
    handoff_runtime::reaper::flush();

    c.bench_function("foreign DLPack import (validate + adopt) + drop", |b| {
        b.iter_batched(
            || HostVec(vec![0.0; 16], [4, 4]).export(&host).unwrap().into_raw(),
            // SAFETY: a fresh, owned managed tensor made by the line above.
            |raw| drop(black_box(unsafe { Handoff::from_raw(raw, &host, Default::default()) }.unwrap())),
            criterion::BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
