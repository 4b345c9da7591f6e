//! A kernel called on a value that is not exportable, and asked for an output type
//! that is not importable: each error names the adapter to link.
use handoff_xla::{Client, Kernel};

struct NotATensor;

fn main() {
    let client = Client::from_env().unwrap();
    let kernel = Kernel::load(&client, "k.jaxexport").unwrap();
    let _: handoff_xla::Buffer = kernel.call1(NotATensor).unwrap();
    let _: String = kernel.call1(&kernel).unwrap();
    let [_]: [handoff_xla::Buffer; 1] = kernel.call([NotATensor]).unwrap();
}
