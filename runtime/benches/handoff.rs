//! Host cost of the hand-off machinery on the CPU machine, so that a regression shows
//! without a GPU: export + drop of host memory, mock same-stream and cross-stream
//! round trips (record + wait + deferred release included), and validation of a
//! foreign DLPack tensor. `cargo bench -p handoff-runtime`.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use handoff_runtime::mock::{Mock, MockTensor};
use handoff_runtime::{Device, Export, Handoff, Result, Stream, StreamOrdered, TensorDesc, dtype::DataType};

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

fn bench(c: &mut Criterion) {
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
