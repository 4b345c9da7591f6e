use handoff::DlpackExchange;

#[derive(DlpackExchange)]
#[dlpack(dtyp = f32)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shap)]
    shape: Vec<i64>,
}

fn main() {}
