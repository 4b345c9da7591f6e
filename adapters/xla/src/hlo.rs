//! Just enough protobuf to read an `HloModuleProto`'s entry signature
//! (`host_program_shape`: parameter and result shapes), and to encode the
//! `CompileOptionsProto` handoff passes.

use crate::dtype::from_primitive;
use handoff_runtime::dtype::DataType;

/// A dense array's element type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArraySpec {
    /// The element type (`None`: a type DLPack has no code for, or a tuple).
    pub dtype: Option<DataType>,
    /// The extent of each dimension.
    pub shape: Vec<i64>,
}

impl std::fmt::Display for ArraySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.dtype.map(handoff_runtime::dtype::name).unwrap_or_else(|| "?".into());
        write!(f, "{d}{:?}", self.shape)
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.at)?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn next(&mut self) -> Option<Option<(u64, Field<'a>)>> {
        if self.at >= self.buf.len() {
            return Some(None);
        }
        let key = self.varint()?;
        let (num, wire) = (key >> 3, key & 7);
        let field = match wire {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.at = self.at.checked_add(8)?;
                Field::Other
            }
            2 => {
                let len = usize::try_from(self.varint()?).ok()?;
                let end = self.at.checked_add(len)?;
                let bytes = self.buf.get(self.at..end)?;
                self.at = end;
                Field::Bytes(bytes)
            }
            5 => {
                self.at = self.at.checked_add(4)?;
                Field::Other
            }
            _ => return None,
        };
        if self.at > self.buf.len() {
            return None;
        }
        Some(Some((num, field)))
    }
}

fn shape(buf: &[u8]) -> Option<ArraySpec> {
    let mut r = Reader::new(buf);
    let mut spec = ArraySpec { dtype: None, shape: Vec::new() };
    while let Some((num, field)) = r.next()? {
        match (num, field) {
            (2, Field::Varint(t)) => spec.dtype = from_primitive(t as i32),
            (3, Field::Varint(d)) => spec.shape.push(d as i64),
            (3, Field::Bytes(packed)) => {
                let mut p = Reader::new(packed);
                while p.at < packed.len() {
                    spec.shape.push(p.varint()? as i64);
                }
            }
            _ => {}
        }
    }
    Some(spec)
}

/// The entry computation's parameters of a serialized `HloModuleProto`
/// (`host_program_shape = 4`, `ProgramShapeProto.parameters = 1`), or of an
/// `HloModuleProtoWithConfig` (`hlo_module = 1`), which PJRT's
/// `OptimizedProgram` returns.
pub fn parameters(module: &[u8]) -> Option<Vec<ArraySpec>> {
    if let Some(p) = module_parameters(module) {
        return Some(p);
    }
    let mut r = Reader::new(module);
    while let Some((num, field)) = r.next()? {
        if let (1, Field::Bytes(inner)) = (num, field) {
            return module_parameters(inner);
        }
    }
    None
}

fn module_parameters(module: &[u8]) -> Option<Vec<ArraySpec>> {
    let mut r = Reader::new(module);
    while let Some((num, field)) = r.next()? {
        if let (4, Field::Bytes(program_shape)) = (num, field) {
            let mut p = Reader::new(program_shape);
            let mut params = Vec::new();
            while let Some((n, f)) = p.next()? {
                if let (1, Field::Bytes(s)) = (n, f) {
                    params.push(shape(s)?);
                }
            }
            return Some(params);
        }
    }
    None
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// A `CompileOptionsProto`: one replica, one partition (the 6 bytes
/// `1a 04 20 01 28 01`), and for a given device ordinal a portable executable built
/// for it (`compile_portable_executable = 4`, `device_ordinal = 1`).
pub fn compile_options(device_ordinal: Option<i64>) -> Vec<u8> {
    let mut build = Vec::new();
    if let Some(d) = device_ordinal {
        build.push(0x08);
        varint(&mut build, d as u64);
    }
    build.extend_from_slice(&[0x20, 0x01, 0x28, 0x01]);
    let mut out = vec![0x1a];
    varint(&mut out, build.len() as u64);
    out.extend_from_slice(&build);
    if device_ordinal.is_some() {
        out.extend_from_slice(&[0x20, 0x01]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_are_the_six_known_bytes() {
        assert_eq!(compile_options(None), [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]);
        assert_eq!(compile_options(Some(2)), [0x1a, 0x06, 0x08, 0x02, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01]);
    }

    #[test]
    fn reads_a_program_shape() {
        // ShapeProto { element_type: F32 (11), dimensions: [4, 8] (packed) }
        let shape = [0x10, 11, 0x1a, 2, 4, 8];
        let mut ps = vec![0x0a, shape.len() as u8];
        ps.extend_from_slice(&shape);
        let mut module = vec![0x0a, 1, b'm', 0x22, ps.len() as u8];
        module.extend_from_slice(&ps);
        let p = parameters(&module).unwrap();
        assert_eq!(p, vec![ArraySpec { dtype: Some(DataType::F32), shape: vec![4, 8] }]);
        assert!(parameters(&[0x22, 0x05, 0x0a]).is_none());
    }
}
