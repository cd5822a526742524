//! GGUF v3 writer. Two phases so multi-GB files never need all tensor bytes in memory:
//! declare metadata and tensor shapes on a [`GgufWriter`], then [`GgufWriter::begin`] writes the
//! header and returns a [`GgufStream`] that takes each tensor's bytes in declaration order
//! (whole, or in chunks) and inserts the alignment padding.
//!
//! ```ignore
//! let mut w = GgufWriter::new();
//! w.add_metadata("general.architecture", Value::String("llama".into()))?;
//! w.add_tensor("token_embd.weight", &[576, 49152], GgmlType::Q8_0)?;
//! let mut s = w.begin(BufWriter::new(File::create(path)?))?;
//! for chunk in chunks { s.write_tensor_chunk("token_embd.weight", chunk)?; }
//! s.finish()?;
//! ```
use std::collections::HashSet;
use std::io::Write;

use super::types::type_id as t;
use super::{
    DEFAULT_ALIGNMENT, GgmlType, GgufError, MAX_ARRAY_DEPTH, Result, Value, align_up, shape_size,
};

const WRITER: &str = "<writer>";

fn invalid(msg: String) -> GgufError {
    GgufError::InvalidWrite(msg)
}

fn io(source: std::io::Error) -> GgufError {
    GgufError::Io {
        file: WRITER.to_string(),
        source,
    }
}

struct Decl {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    size: u64,
}

/// Phase one: collects metadata and tensor declarations, validating each as it is added so
/// that everything the writer emits is accepted by the reader.
#[derive(Default)]
pub struct GgufWriter {
    alignment: Option<u32>,
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<Decl>,
    names: HashSet<String>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata pair (written in insertion order). `general.alignment` also sets the
    /// alignment used for the data section. Arrays must be homogeneous (nested arrays may differ
    /// in their own element types); an empty array is written with element type string.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<()> {
        let key = key.into();
        if self.keys.contains(&key) {
            return Err(invalid(format!("duplicate metadata key {key:?}")));
        }
        check_value(&key, &value, 0)?;
        if key == "general.alignment" {
            let a = value
                .as_integer()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|a| a.is_power_of_two())
                .ok_or_else(|| {
                    invalid(format!(
                        "general.alignment = {value:?} is not a power of two"
                    ))
                })?;
            self.alignment = Some(a);
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(())
    }

    /// Declares a tensor; its bytes are written later, in declaration order, through the
    /// [`GgufStream`]. `dims` are in ggml order (`dims[0]` = row length).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
    ) -> Result<()> {
        let name = name.into();
        if self.names.contains(&name) {
            return Err(invalid(format!("duplicate tensor name {name:?}")));
        }
        let (_, size) =
            shape_size(dims, ty).map_err(|r| invalid(format!("tensor {name:?}: {r}")))?;
        self.names.insert(name.clone());
        self.tensors.push(Decl {
            name,
            dims: dims.to_vec(),
            ty,
            size,
        });
        Ok(())
    }

    pub fn alignment(&self) -> u32 {
        self.alignment.unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Byte size of tensor `name` as declared.
    pub fn tensor_size(&self, name: &str) -> Option<u64> {
        self.tensors.iter().find(|d| d.name == name).map(|d| d.size)
    }

    /// Phase two: writes the header (metadata, tensor infos, padding) to `w` and returns the
    /// stream that takes the tensor bytes. Wrap files in a `BufWriter`.
    pub fn begin<W: Write>(self, mut w: W) -> Result<GgufStream<W>> {
        let alignment = self.alignment();
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut h, key);
            h.extend_from_slice(&value.type_id().to_le_bytes());
            put_value(&mut h, value);
        }
        let mut rel: u64 = 0;
        for d in &self.tensors {
            put_str(&mut h, &d.name);
            h.extend_from_slice(&(d.dims.len() as u32).to_le_bytes());
            for &dim in &d.dims {
                h.extend_from_slice(&dim.to_le_bytes());
            }
            h.extend_from_slice(&(d.ty as u32).to_le_bytes());
            h.extend_from_slice(&rel.to_le_bytes());
            rel = rel
                .checked_add(d.size)
                .and_then(|end| align_up(end, alignment))
                .ok_or_else(|| {
                    invalid(format!("tensor {:?}: data section overflows u64", d.name))
                })?;
        }
        let data_offset = align_up(h.len() as u64, alignment)
            .ok_or_else(|| invalid("header size overflows u64".into()))?;
        h.resize(data_offset as usize, 0);
        w.write_all(&h).map_err(io)?;
        Ok(GgufStream {
            w,
            alignment,
            data_offset,
            pos: data_offset,
            tensors: self.tensors,
            current: 0,
            written: 0,
        })
    }

    /// Convenience for small files: writes everything to a `Vec`, `data[i]` being the bytes of
    /// the i-th declared tensor.
    pub fn to_vec(self, data: &[&[u8]]) -> Result<Vec<u8>> {
        let names: Vec<String> = self.tensors.iter().map(|d| d.name.clone()).collect();
        if names.len() != data.len() {
            return Err(invalid(format!(
                "{} tensors declared but {} given",
                names.len(),
                data.len()
            )));
        }
        let mut s = self.begin(Vec::new())?;
        for (name, bytes) in names.iter().zip(data) {
            s.write_tensor(name, bytes)?;
        }
        s.finish()
    }
}

/// Phase two: takes tensor bytes in declaration order.
pub struct GgufStream<W: Write> {
    w: W,
    alignment: u32,
    data_offset: u64,
    /// Absolute position in the output.
    pos: u64,
    tensors: Vec<Decl>,
    /// Index of the tensor being written; `tensors.len()` when all are done.
    current: usize,
    /// Bytes of the current tensor written so far.
    written: u64,
}

impl<W: Write> GgufStream<W> {
    /// Absolute offset of the data section in the output.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The tensor whose bytes are expected next, and how many of its bytes are still missing.
    pub fn next_tensor(&self) -> Option<(&str, u64)> {
        self.tensors
            .get(self.current)
            .map(|d| (d.name.as_str(), d.size - self.written))
    }

    /// Writes all bytes of tensor `name`, which must be the next one declared.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let d = self.expect(name)?;
        if self.written != 0 || bytes.len() as u64 != d.size {
            return Err(invalid(format!(
                "tensor {name:?} is {} bytes, got {} (after {} already written)",
                d.size,
                bytes.len(),
                self.written
            )));
        }
        self.write_tensor_chunk(name, bytes)
    }

    /// Appends `chunk` to tensor `name`, which must be the one being written; once its declared
    /// size is reached the padding is written and the next tensor becomes current.
    pub fn write_tensor_chunk(&mut self, name: &str, chunk: &[u8]) -> Result<()> {
        let size = self.expect(name)?.size;
        let left = size - self.written;
        if chunk.len() as u64 > left {
            return Err(invalid(format!(
                "chunk of {} bytes overruns tensor {name:?} ({left} of {size} bytes left)",
                chunk.len()
            )));
        }
        self.w.write_all(chunk).map_err(io)?;
        self.written += chunk.len() as u64;
        self.pos += chunk.len() as u64;
        if self.written == size {
            self.pad()?;
            self.current += 1;
            self.written = 0;
        }
        Ok(())
    }

    fn expect(&self, name: &str) -> Result<&Decl> {
        match self.tensors.get(self.current) {
            Some(d) if d.name == name => Ok(d),
            Some(d) => Err(invalid(format!(
                "tensor {name:?} written out of order: expected {:?}",
                d.name
            ))),
            None => Err(invalid(format!(
                "tensor {name:?} written after all declared tensors"
            ))),
        }
    }

    fn pad(&mut self) -> Result<()> {
        // Pad after every tensor, the last included, as llama.cpp does: some readers load the
        // data section as a sum of padded sizes.
        let end = align_up(self.pos, self.alignment)
            .ok_or_else(|| invalid("output size overflows u64".into()))?;
        const ZEROS: [u8; 256] = [0; 256];
        while self.pos < end {
            let n = ((end - self.pos) as usize).min(ZEROS.len());
            self.w.write_all(&ZEROS[..n]).map_err(io)?;
            self.pos += n as u64;
        }
        Ok(())
    }

    /// Checks that every declared tensor was written, flushes, and returns the writer.
    pub fn finish(mut self) -> Result<W> {
        if let Some((name, left)) = self.next_tensor() {
            return Err(invalid(format!(
                "finish with tensor {name:?} incomplete ({left} bytes missing, {} tensors unwritten)",
                self.tensors.len() - self.current
            )));
        }
        self.w.flush().map_err(io)?;
        Ok(self.w)
    }
}

/// Rejects values the reader would reject: mixed-type arrays, nesting beyond the reader's limit.
fn check_value(key: &str, v: &Value, depth: usize) -> Result<()> {
    let Value::Array(items) = v else {
        return Ok(());
    };
    if depth >= MAX_ARRAY_DEPTH {
        return Err(invalid(format!(
            "metadata {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
        )));
    }
    let Some(first) = items.first() else {
        return Ok(());
    };
    for (i, item) in items.iter().enumerate() {
        if item.type_id() != first.type_id() {
            return Err(invalid(format!(
                "metadata {key:?}: array element {i} is {} but element 0 is {}",
                item.type_name(),
                first.type_name()
            )));
        }
        check_value(key, item, depth + 1)?;
    }
    Ok(())
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(u8::from(*x)),
        Value::String(s) => put_str(h, s),
        Value::Array(items) => {
            let elem = items.first().map_or(t::STRING, Value::type_id);
            h.extend_from_slice(&elem.to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(h, item);
            }
        }
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
    }
}
