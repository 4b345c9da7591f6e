//! Target 2: the registry's by-name conversion with random names, values and
//! descriptors. Adapters linked: `mock` (the runtime's), `ndarray` (the example
//! third-party crate) and `fuzz-host` (below: any dtype of host memory, a thin
//! view of the hand-off).
//!
//! Every outcome is checked: an unknown name is `UnknownAdapter` naming it; an `Ok`
//! downcasts to the target adapter's type and holds the values given; every error is
//! a typed `RegistryError`; afterwards every keep-alive is gone (mock buffers
//! released, foreign deleters run exactly once, the reaper drained for the mock
//! streams) and the mock's hazard checker saw nothing.

use crate::Desc;
use arbitrary::{Arbitrary, Unstructured};
use handoff::dtype::{self, DataType};
use handoff::mock::{Kernel, Mock, MockTensor};
use handoff::registry::{self, Adapter, DeviceKind, RegistryError};
use handoff::{Device, Export, Handoff, Import, Result, Stream, StreamOrdered, TensorDesc, reaper};
use handoff_ndarray::NdTensor;
use std::cell::RefCell;

/// Host memory of any dtype, held as the hand-off it came in as.
pub struct HostView(Handoff);

impl StreamOrdered for HostView {
    fn device(&self) -> Device {
        self.0.device()
    }
    fn stream(&self) -> Option<Stream> {
        None
    }
}

impl Export for HostView {
    fn describe(&self) -> Result<TensorDesc<'_>> {
        let h = &self.0;
        let mut d = TensorDesc::new(h.data(), h.device(), h.dtype(), h.shape())
            .with_strides(h.strides())
            .with_byte_offset(h.byte_offset());
        d.read_only = h.is_read_only();
        Ok(d)
    }
}

impl Import for HostView {
    fn from_handoff(h: Handoff) -> Result<Self> {
        Ok(HostView(h))
    }
}

registry::submit! {
    Adapter::new("fuzz-host", "0.0.0")
        .devices(&[DeviceKind::Host])
        .dtypes(dtype::ALL)
        .exports::<HostView>()
        .imports::<HostView>()
}

struct World {
    mock: Mock,
    /// Producer and consumer on mock:0, a stream of mock:1.
    streams: [Stream; 3],
    uses: u32,
}

impl World {
    fn new() -> World {
        let mock = Mock::new();
        let streams = [mock.stream(0, "p"), mock.stream(0, "c"), mock.stream(1, "other")];
        World { mock, streams, uses: 0 }
    }
}

thread_local! {
    // The mock world keeps every buffer's history: start a fresh one now and then.
    static WORLD: RefCell<World> = RefCell::new(World::new());
}

const NAMES: &[&str] = &["mock", "ndarray", "fuzz-host", "", "torch", "Mock", "ndarray "];

fn name(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    if u.ratio(7, 8)? { Ok(u.choose(NAMES)?.to_string()) } else { u.arbitrary() }
}

#[derive(Debug)]
enum Value {
    Mock { stream: usize, shape: Vec<i64> },
    Nd { shape: Vec<usize> },
    Host(Box<Desc>),
    Wrong(u32),
}

fn small_shape(u: &mut Unstructured<'_>) -> arbitrary::Result<Vec<usize>> {
    let n = u.int_in_range(0..=3)?;
    (0..n).map(|_| u.int_in_range(0..=5)).collect()
}

impl<'a> Arbitrary<'a> for Value {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u.int_in_range(0..=3)? {
            0 => Value::Mock {
                stream: u.int_in_range(0..=2)?,
                shape: small_shape(u)?.into_iter().map(|d| d as i64).collect(),
            },
            1 => Value::Nd { shape: small_shape(u)? },
            2 => Value::Host(Box::new(Desc::arbitrary(u)?)),
            _ => Value::Wrong(u.arbitrary()?),
        })
    }
}

fn values(n: usize, seed: u8) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.5 + seed as f32).collect()
}

/// The f32 values a converted value holds, read on the host (after a mock sync).
fn read_back(mock: &Mock, out: &(dyn std::any::Any + Send)) -> Option<Vec<f32>> {
    if let Some(t) = out.downcast_ref::<MockTensor>() {
        mock.synchronize();
        return Some(mock.read_f32(t));
    }
    if let Some(t) = out.downcast_ref::<NdTensor<f32>>() {
        return Some(t.view().iter().copied().collect());
    }
    None
}

/// One conversion, checked.
pub fn fuzz_convert(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(by_import) = u.ratio(1, 3) else { return };
    WORLD.with(|w| {
        let mut w = w.borrow_mut();
        w.uses += 1;
        if w.uses > 256 {
            *w = World::new();
        }
        let w = &*w;
        let r = if by_import { import_case(w, &mut u) } else { convert_case(w, &mut u) };
        if r.is_err() {
            return;
        }
        for s in &w.streams {
            reaper::flush_stream(s);
        }
        assert_eq!(reaper::pending(), 0, "releases left queued after flushing");
        assert!(w.mock.hazards().is_empty(), "{:?}", w.mock.hazards());
    });
}

fn consumer(w: &World, u: &mut Unstructured<'_>) -> arbitrary::Result<Stream> {
    Ok(match u.int_in_range(0..=3)? {
        0 => Stream::host(),
        i => w.streams[i - 1].clone(),
    })
}

fn convert_case(w: &World, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
    let (from, to) = (name(u)?, name(u)?);
    let value = Value::arbitrary(u)?;
    let stream = consumer(w, u)?;
    let seed: u8 = u.arbitrary()?;
    let mut buffer = None;
    let mut foreign = None;
    let mut expect: Option<Vec<f32>> = None;
    let boxed: registry::AnyTensor = match &value {
        Value::Mock { stream: s, shape } => {
            let n = shape.iter().product::<i64>() as usize;
            let v = values(n, seed);
            let t = w.mock.tensor_f32(&w.streams[*s], "x", shape, &v);
            buffer = Some(t.buffer());
            expect = Some(v);
            Box::new(t)
        }
        Value::Nd { shape } => {
            let v = values(shape.iter().product(), seed);
            expect = Some(v.clone());
            Box::new(NdTensor::from(ndarray::ArrayD::from_shape_vec(shape.clone(), v).expect("shape")))
        }
        Value::Host(d) => {
            let (r, mut b) = d.import(&Stream::host());
            crate::check_outcome(d, &r, &b);
            match r {
                Ok(h) => {
                    foreign = Some(b);
                    Box::new(HostView(h))
                }
                Err(_) => {
                    b.release("refused");
                    return Ok(());
                }
            }
        }
        Value::Wrong(x) => Box::new(*x),
    };
    let result = registry::convert(boxed, &from, &to, &stream);
    let known = |n: &str| registry::find(n).is_ok();
    match result.as_ref().map_err(|e| &e.error) {
        Err(RegistryError::UnknownAdapter { name, known: list }) => {
            let missing = if !known(&from) { &from } else { &to };
            assert_eq!(name, missing);
            assert!(list.contains("mock") && list.contains("fuzz-host"), "{list}");
        }
        Err(e) => {
            assert!(known(&from) && known(&to), "{e}");
            assert!(!e.to_string().is_empty());
            match e {
                RegistryError::WrongType { adapter, .. } => assert_eq!(*adapter, from),
                RegistryError::CannotImport { .. } | RegistryError::CannotExport { .. } => {
                    panic!("every linked adapter imports and exports: {e}")
                }
                _ => {}
            }
        }
        Ok(out) => {
            assert!(known(&from) && known(&to));
            let ok = match to.as_str() {
                "mock" => out.is::<MockTensor>(),
                "ndarray" => out.is::<NdTensor<f32>>(),
                "fuzz-host" => out.is::<HostView>(),
                other => panic!("converted to an unknown adapter {other}"),
            };
            assert!(ok, "the result is not {to}'s type");
            if let Some(t) = out.downcast_ref::<MockTensor>() {
                assert_eq!(t.stream(), &stream, "a mock result works on the consumer stream");
                w.mock.launch(&stream, Kernel::new("use").micros(1).reads(t.buffer()));
            }
            // Read back only values this harness made (honest extents): a foreign
            // descriptor's shape may lie about its memory, which no importer can
            // see (DLPack carries no size), and reading it all would overrun.
            if let Some(want) = &expect
                && let Some(got) = read_back(&w.mock, &**out)
            {
                assert_eq!(&got, want, "{from} -> {to} changed the values");
            }
        }
    }
    drop(result);
    for s in &w.streams {
        reaper::flush_stream(s);
    }
    if let Some(b) = buffer {
        w.mock.synchronize();
        assert!(w.mock.is_released(b), "the mock producer's buffer was not released");
    }
    if let Some(mut b) = foreign {
        b.release("after the conversion");
    }
    Ok(())
}

fn import_case(w: &World, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
    let to = name(u)?;
    let d = Desc::arbitrary(u)?;
    let stream = consumer(w, u)?;
    let mut b = d.build();
    // SAFETY: a fresh managed tensor owned by this call (see the crate docs).
    let r = unsafe {
        if d.legacy {
            Handoff::from_raw_legacy(b.legacy, &stream, d.access)
        } else {
            Handoff::from_raw(b.versioned, &stream, d.access)
        }
    };
    let Ok(h) = r else {
        b.release("refused");
        return Ok(());
    };
    let (device, dtype): (Device, DataType) = (h.device(), h.dtype());
    let result = registry::find(&to).map(|a| (a, a.import(h, &stream)));
    match &result {
        Err(e) => assert!(matches!(e, RegistryError::UnknownAdapter { .. }), "{e}"),
        Ok((a, Ok(out))) => {
            assert!(a.supports_device(device) && a.supports_dtype(dtype));
            assert_eq!(b.count.get(), 0, "the deleter ran while the import lives");
            if let Some(v) = out.downcast_ref::<HostView>() {
                assert_eq!(v.0.shape(), &d.shape[..]);
            }
        }
        Ok((a, Err(e))) => match e {
            RegistryError::UnsupportedDevice { .. } => assert!(!a.supports_device(device)),
            RegistryError::UnsupportedDtype { .. } => assert!(!a.supports_dtype(dtype)),
            RegistryError::Failed { step: "import", .. } => {}
            other => panic!("unexpected import error: {other}"),
        },
    }
    drop(result);
    reaper::flush_stream(&stream);
    b.release("after the import");
    Ok(())
}
