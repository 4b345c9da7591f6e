// Storage that does not know its element type needs a dtype.
use handoff::DlpackExchange;
use handoff::storage::Storage;

struct Raw(Vec<u8>);

// SAFETY: heap memory of `len` bytes that lives as long as the value.
unsafe impl Storage for Raw {
    fn data_ptr(&self) -> *mut std::ffi::c_void {
        self.0.as_ptr() as *mut _
    }
    fn byte_len(&self) -> usize {
        self.0.len()
    }
}

#[derive(DlpackExchange)]
struct Tensor {
    #[dlpack(data)]
    data: Raw,
    #[dlpack(shape)]
    shape: Vec<i64>,
}

fn main() {}
