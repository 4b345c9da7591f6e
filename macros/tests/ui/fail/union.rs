use handoff::DlpackExchange;

#[derive(DlpackExchange)]
union Tensor {
    a: u32,
}

fn main() {}
