use handoff::DlpackExchange;

#[derive(DlpackExchange)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<i64>,
    #[dlpack(shape)]
    dims: Vec<i64>,
    #[dlpack(stream, device)]
    both: handoff::Stream,
}

fn main() {}
