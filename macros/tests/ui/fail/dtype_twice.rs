use handoff::DlpackExchange;
use handoff::dtype::DataType;

#[derive(DlpackExchange)]
#[dlpack(dtype = f32)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<u8>,
    #[dlpack(shape)]
    shape: Vec<i64>,
    #[dlpack(dtype)]
    dtype: DataType,
}

fn main() {}
