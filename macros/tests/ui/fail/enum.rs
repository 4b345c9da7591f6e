use handoff::DlpackExchange;

#[derive(DlpackExchange)]
enum Tensor {
    A(Vec<f32>),
}

fn main() {}
