//! A user type deriving `DlpackExchange`, handed through the mock device and to
//! ndarray, PyTorch and XLA and back through the registry, with the stats printed.
//!
//! XLA's CPU client views host memory only when it is 64-byte aligned; a `Vec`'s
//! memory usually is not, so there the example shows the refusal and then the
//! explicit, counted copy (`ViewOptions::allow_copy`).
//!
//! ```text
//! eval "$(cargo xtask env)"; cargo run -p handoff-examples --example custom_tensor
//! ```

use handoff::dtype::{DataType, Element};
use handoff::mock::{Kernel, Mock, MockTensor};
use handoff::registry::{self, Adapter, DeviceKind};
use handoff::storage::Elements;
use handoff::{DlpackExchange, Export, Stream, stats, transfer};
use handoff_ndarray as _; // links the ndarray adapter, which registers itself
use handoff_torch as _; // and PyTorch's
use handoff_xla::{Client, ViewOptions};
use std::any::Any;

/// A user's image type: pixels in any storage that can adopt, a shape, and the
/// stream its pending writes are on (`None` = written by the host).
#[derive(DlpackExchange)]
struct Image<T: Element> {
    #[dlpack(data)]
    pixels: Elements<T>,
    #[dlpack(shape)]
    shape: [usize; 2],
    #[dlpack(stream)]
    stream: Option<Stream>,
    /// Not part of the tensor: kept on export, defaulted on import.
    caption: String,
}

// The type registers itself too, so the registry can convert it by name.
registry::submit! {
    Adapter::new("image", "0.1.0")
        .about("the custom_tensor example's Image<f32>")
        .devices(&[DeviceKind::Host, DeviceKind::Mock, DeviceKind::Cuda])
        .dtypes(&[DataType::F32])
        .exports::<Image<f32>>()
        .imports::<Image<f32>>()
}

/// The frameworks to visit, in order; those whose adapter is not linked are skipped.
const TARGETS: &[&str] = &["ndarray", "torch", "xla"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Through the mock device: producer and consumer on two streams.
    let mock = Mock::new();
    let (producer, consumer) = (mock.stream(0, "producer"), mock.stream(0, "consumer"));
    let src = mock.tensor_f32(&producer, "pixels", &[2, 3], &[0.0; 6]);
    let id = src.buffer();
    mock.launch(
        &producer,
        Kernel::new("render").micros(40).writes(id).run(move |k| k.write_f32(id, &[0.5; 6])),
    );
    let (image, d1) = stats::measure(|| transfer::<Image<f32>, _, _>(src, &producer));
    let image = image?;
    let (on_consumer, d2) = stats::measure(|| transfer::<MockTensor, _, _>(image, &consumer));
    let on_consumer = on_consumer?;
    mock.launch(&consumer, Kernel::new("blur").micros(10).reads(on_consumer.buffer()));
    mock.synchronize();
    println!("mock: MockTensor -> Image (same stream) {d1:?}");
    println!("mock: Image -> MockTensor on another stream {d2:?}");
    println!("mock: hazards: {:?}, pixels: {:?}", mock.hazards(), mock.read_f32(&on_consumer));

    // 2. Through every registered adapter that takes host f32 memory. Each imports
    //    into its context: a stream (the host here), or for XLA the client it views
    //    the memory in (`registry::convert_into`).
    let host = Stream::host();
    let client = std::env::var_os(handoff_xla::PLUGIN_ENV).map(|_| Client::from_env()).transpose()?;
    for &target in TARGETS {
        let adapter = match registry::find(target) {
            Ok(a) => a,
            Err(_) => {
                println!("{target}: skipped (adapter not built into this example)");
                continue;
            }
        };
        let ctx: &dyn Any = match (target, &client) {
            ("xla", Some(client)) => client,
            ("xla", None) => {
                println!("xla: skipped ({} is not set: `cargo xtask env`)", handoff_xla::PLUGIN_ENV);
                continue;
            }
            _ => &host,
        };
        let image = || Image {
            pixels: Elements::from(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]),
            shape: [2, 3],
            stream: None,
            caption: "host image".into(),
        };
        let (there, d_there) =
            stats::measure(|| registry::convert_into(Box::new(image()), "image", target, ctx));
        let there = match (there, &client) {
            (Ok(there), _) => there,
            (Err(refused), Some(client)) if target == "xla" => {
                println!("xla: zero-copy view refused: {refused}");
                let h = image().export(&host)?;
                let copied = client.import_with(h, ViewOptions::default().allow_copy())?;
                println!("xla: imported with an explicit copy (is_copied: {})", copied.is_copied());
                Box::new(copied)
            }
            (Err(e), _) => return Err(e.into()),
        };
        let (back, d_back) = stats::measure(|| registry::convert(there, target, "image", &host));
        let back = back?.downcast::<Image<f32>>().map_err(|_| "the image adapter returned another type")?;
        println!(
            "{target} {}: Image -> {target} {d_there:?}; back {d_back:?}; pixels {:?}, shape {:?}, caption {:?}",
            adapter.version,
            back.pixels.as_slice(),
            back.shape,
            back.caption
        );
    }
    println!("total: {:?}", stats());
    Ok(())
}
