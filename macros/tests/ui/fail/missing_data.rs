use handoff::DlpackExchange;

#[derive(DlpackExchange)]
struct Tensor {
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<i64>,
}

fn main() {}
