use handoff::DlpackExchange;

#[derive(DlpackExchange)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    shape: Vec<i64>,
}

fn main() {}
