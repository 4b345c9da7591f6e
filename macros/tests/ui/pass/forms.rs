// Every passing form: generic, fixed dtype, runtime dtype, strides as Option or
// plain, byte offset, device and stream fields, tuple structs, crate override.
use handoff::dtype::{DataType, Element};
use handoff::storage::Elements;
use handoff::{Device, DlpackExchange, Export, Stream, StreamOrdered, transfer};
use std::sync::Arc;

#[derive(DlpackExchange)]
struct Generic<T: Element> {
    #[dlpack(data)]
    data: Elements<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    name: String,
}

#[derive(DlpackExchange)]
#[dlpack(dtype = f32)]
struct Fixed {
    #[dlpack(data)]
    bytes: Elements<u8>,
    #[dlpack(shape)]
    dims: [i64; 2],
    #[dlpack(strides)]
    strides: Option<[i64; 2]>,
    #[dlpack(byte_offset)]
    offset: u64,
}

#[derive(DlpackExchange)]
struct Runtime {
    #[dlpack(data)]
    bytes: Elements<u8>,
    #[dlpack(shape)]
    shape: Box<[i64]>,
    #[dlpack(strides)]
    strides: Vec<i64>,
    #[dlpack(dtype)]
    dtype: DataType,
    #[dlpack(device)]
    device: Device,
    #[dlpack(stream)]
    stream: Option<Stream>,
}

#[derive(DlpackExchange)]
struct Tuple(#[dlpack(data)] Vec<f64>, #[dlpack(shape)] Vec<i64>, #[dlpack(stream)] Stream);

#[derive(DlpackExchange)]
struct Shared {
    #[dlpack(data)]
    data: Arc<[i32]>,
    #[dlpack(shape)]
    shape: Vec<u64>,
}

mod renamed {
    pub use handoff as my_handoff;
}

#[derive(DlpackExchange)]
#[dlpack(crate = "renamed::my_handoff")]
struct Renamed {
    #[dlpack(data)]
    data: Box<[u16]>,
    #[dlpack(shape)]
    shape: Vec<i32>,
}

fn main() {
    let host = Stream::host();
    let g = Generic { data: Elements::from(vec![1.0f32, 2.0]), shape: vec![2], name: "g".into() };
    let g: Generic<f32> = transfer(g, &host).unwrap();
    assert_eq!((g.shape.as_slice(), g.name.as_str()), (&[2][..], ""));

    let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0].iter().flat_map(|f| f.to_ne_bytes()).collect();
    let f = Fixed { bytes: Elements::from(bytes), dims: [2, 2], strides: None, offset: 4 };
    assert_eq!(f.describe().unwrap().dtype, DataType::F32);
    let f: Fixed = transfer(f, &host).unwrap();
    assert_eq!((f.dims, f.strides, f.offset), ([2, 2], None, 0));

    let r = Runtime {
        bytes: Elements::from(vec![0u8; 8]),
        shape: vec![2].into(),
        strides: vec![1],
        dtype: DataType::F32,
        device: Device::Host,
        stream: None,
    };
    let r: Runtime = transfer(r, &host).unwrap();
    assert_eq!((r.dtype, r.device, r.stream), (DataType::F32, Device::Host, None));

    let t = Tuple(vec![1.0; 3], vec![3], Stream::host());
    assert_eq!(t.stream(), Some(Stream::host()));
    let _ = t.export(&host).unwrap();

    let s = Shared { data: Arc::from(vec![1, 2, 3]), shape: vec![3] };
    assert!(s.export(&host).unwrap().is_read_only());

    let n = Renamed { data: vec![1u16, 2].into_boxed_slice(), shape: vec![2] };
    assert_eq!(n.describe().unwrap().dtype, DataType::U16);
}
