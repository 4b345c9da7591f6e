use handoff::DlpackExchange;

#[derive(DlpackExchange)]
#[dlpack(data)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<u8>,
    #[dlpack(shape)]
    shape: Vec<i64>,
    #[dlpack(dtype = f32)]
    other: u8,
}

fn main() {}
