// A Vec cannot adopt foreign memory: the type exports, but does not import.
use handoff::{DlpackExchange, Stream, transfer};

#[derive(DlpackExchange)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<i64>,
}

fn main() {
    let t = Tensor { data: vec![1.0], shape: vec![1] };
    let _back: Tensor = transfer(t, &Stream::host()).unwrap();
}
