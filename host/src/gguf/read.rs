//! GGUF parsing. The whole file is validated up front (metadata, tensor shapes, tensor byte
//! ranges) so that later accessors can slice tensor data without further checks.
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::types::type_id as t;
use super::{
    DEFAULT_ALIGNMENT, GgmlType, GgufError, MAX_ARRAY_DEPTH, MAX_DIMS, Result, Value, align_up,
    shape_size,
};

/// One tensor's header entry, resolved to an absolute byte range of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (fastest-varying).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        // Validated at parse time not to overflow; saturate for hand-built infos.
        self.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }

    /// Number of rows: product of `dims[1..]`.
    pub fn rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |n, &d| n.saturating_mul(d))
    }

    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
}

/// The bytes a file was parsed from: a read-only map of the file, or an owned buffer.
enum Backing {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed, validated GGUF file. Metadata is copied out; tensor data stays in the map.
pub struct GgufFile {
    backing: Backing,
    path: Option<PathBuf>,
    version: u32,
    alignment: u32,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    // Not derived: metadata can hold 150k vocab strings.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("file", &self.file_name())
            .field("version", &self.version)
            .field("len", &self.backing.bytes().len())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

const MEMORY: &str = "<memory>";

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            file: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. If another process truncates
        // or rewrites the file while it is mapped, reads may fault or see new bytes; that is the
        // accepted contract for mmap-loaded model weights (llama.cpp makes the same one).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(Backing::Mmap(map), Some(path.to_path_buf()))
    }

    /// Parses an in-memory file (tests, fuzzing, downloaded buffers).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(Backing::Owned(bytes), None)
    }

    fn parse(backing: Backing, path: Option<PathBuf>) -> Result<GgufFile> {
        let file_name = path
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| MEMORY.to_string());
        let parsed = Parser::new(backing.bytes(), &file_name).parse()?;
        Ok(GgufFile {
            backing,
            path,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            key_index: parsed.key_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
        })
    }

    fn file_name(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => MEMORY.to_string(),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and tensor offsets (`general.alignment`, default 32).
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Absolute offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            file: self.file_name(),
            key: key.to_string(),
        })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: String) -> GgufError {
        GgufError::WrongType {
            file: self.file_name(),
            key: key.to_string(),
            expected,
            found,
        }
    }

    fn integer<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T> {
        let v = self.require(key)?;
        let n = v
            .as_integer()
            .ok_or_else(|| self.wrong_type(key, expected, v.type_name().to_string()))?;
        T::try_from(n).map_err(|_| self.wrong_type(key, expected, format!("{} {n}", v.type_name())))
    }

    /// Any integer type whose value fits u32.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.integer(key, "an integer that fits u32")
    }

    /// Any non-negative integer type.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.integer(key, "an integer that fits u64")
    }

    /// f32, or f64 rounded to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_float()
            .map(|f| f as f32)
            .ok_or_else(|| self.wrong_type(key, "f32 or f64", v.type_name().to_string()))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, "bool", v.type_name().to_string())),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str()
            .ok_or_else(|| self.wrong_type(key, "string", v.type_name().to_string()))
    }

    fn array(&self, key: &str, expected: &'static str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| self.wrong_type(key, expected, v.type_name().to_string()))
    }

    fn element_error(&self, key: &str, expected: &'static str, i: usize, e: &Value) -> GgufError {
        self.wrong_type(
            key,
            expected,
            format!("an array whose element {i} is {e:?}"),
        )
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        const EXPECTED: &str = "array of strings";
        let a = self.array(key, EXPECTED)?;
        a.iter()
            .enumerate()
            .map(|(i, e)| {
                e.as_str()
                    .ok_or_else(|| self.element_error(key, EXPECTED, i, e))
            })
            .collect()
    }

    /// Array of any integer type whose elements all fit i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        const EXPECTED: &str = "array of integers that fit i32";
        let a = self.array(key, EXPECTED)?;
        a.iter()
            .enumerate()
            .map(|(i, e)| {
                e.as_integer()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| self.element_error(key, EXPECTED, i, e))
            })
            .collect()
    }

    /// Array of f32 or f64 (rounded to f32).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        const EXPECTED: &str = "array of f32/f64";
        let a = self.array(key, EXPECTED)?;
        a.iter()
            .enumerate()
            .map(|(i, e)| {
                e.as_float()
                    .map(|f| f as f32)
                    .ok_or_else(|| self.element_error(key, EXPECTED, i, e))
            })
            .collect()
    }

    /// `general.architecture`, e.g. `llama`.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::MissingTensor {
                file: self.file_name(),
                tensor: name.to_string(),
            })
    }

    /// The tensor's bytes, borrowed from the map.
    ///
    /// # Panics
    /// If `t` did not come from this file and its range lies outside it (a caller bug; infos
    /// from [`GgufFile::tensors`] are validated to be in bounds).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.backing.bytes();
        let range = usize::try_from(t.offset).ok().and_then(|start| {
            let end = start.checked_add(usize::try_from(t.size).ok()?)?;
            bytes.get(start..end)
        });
        match range {
            Some(r) => r,
            None => panic!(
                "tensor_data: {:?} [{}, +{}) is outside {} ({} bytes); TensorInfo from another file?",
                t.name,
                t.offset,
                t.size,
                self.file_name(),
                bytes.len()
            ),
        }
    }
}

/// Result of a successful parse, moved into [`GgufFile`].
struct Parsed {
    version: u32,
    alignment: u32,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// Smallest encoding of one metadata pair: empty key (8) + type (4) + 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: empty name (8) + n_dims (4) + 1 dim (8) + type (4) +
/// offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;
/// Cap on speculative preallocation, so a count that merely passes the size check cannot make
/// us reserve far more memory than the elements will actually use.
const MAX_PREALLOC: usize = 1 << 16;

/// Encoded size of one element of type `id`, or its minimum size for variable-size types;
/// `None` for unknown ids.
fn min_value_size(id: u32) -> Option<u64> {
    Some(match id {
        t::U8 | t::I8 | t::BOOL => 1,
        t::U16 | t::I16 => 2,
        t::U32 | t::I32 | t::F32 => 4,
        t::U64 | t::I64 | t::F64 => 8,
        t::STRING => 8,
        t::ARRAY => 12,
        _ => return None,
    })
}

struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl<'a> Parser<'a> {
    fn new(buf: &'a [u8], file: &'a str) -> Self {
        Parser { buf, pos: 0, file }
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Takes `n` bytes; `what` builds the error context only on failure.
    fn take(&mut self, n: usize, what: impl FnOnce() -> String) -> Result<&'a [u8]> {
        match self.buf.get(self.pos..).and_then(|rest| rest.get(..n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                file: self.file.to_string(),
                what: what(),
                offset: self.pos as u64,
                need: n as u64,
                len: self.buf.len() as u64,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a count and checks that `count` items of at least `min_size` bytes fit in what is
    /// left, before anyone allocates for them.
    fn count(&mut self, min_size: u64, what: &dyn Fn() -> String) -> Result<u64> {
        let offset = self.pos as u64;
        let count = self.u64(what)?;
        let remaining = self.remaining();
        if count > remaining / min_size {
            return Err(GgufError::CountTooLarge {
                file: self.file.to_string(),
                what: what(),
                offset,
                count,
                remaining,
            });
        }
        Ok(count)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.count(1, &|| format!("length of {}", what()))?;
        let offset = self.pos as u64;
        // `count` checked len <= remaining, so it fits usize.
        let bytes = self.take(len as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                file: self.file.to_string(),
                what: what(),
                offset,
            }),
        }
    }

    fn parse(mut self) -> Result<Parsed> {
        let magic = self.take(4, || "magic".into())?;
        if magic != b"GGUF" {
            return Err(GgufError::BadMagic {
                file: self.file.to_string(),
                found: magic.to_vec(),
            });
        }
        let version = self.u32(|| "version".into())?;
        if version != 2 && version != 3 {
            let hint = if version == 1 {
                ": v1 used 32-bit counts and is obsolete; re-convert the model"
            } else if matches!(version.swap_bytes(), 2 | 3) {
                ": this looks like a big-endian GGUF file"
            } else {
                ""
            };
            return Err(GgufError::UnsupportedVersion {
                file: self.file.to_string(),
                version,
                hint,
            });
        }
        let tensor_count = self.count(MIN_TENSOR_INFO_BYTES, &|| "tensor count".into())?;
        let kv_count = self.count(MIN_KV_BYTES, &|| "metadata count".into())?;

        let (metadata, key_index) = self.metadata(kv_count)?;
        let alignment = self.alignment(&metadata, &key_index)?;
        let (mut tensors, tensor_index) = self.tensor_infos(tensor_count)?;
        let data_offset =
            align_up(self.pos as u64, alignment).ok_or_else(|| GgufError::BadAlignment {
                file: self.file.to_string(),
                value: format!("{alignment} (data section offset overflows)"),
            })?;
        self.place_tensors(&mut tensors, data_offset, alignment)?;
        Ok(Parsed {
            version,
            alignment,
            data_offset,
            metadata,
            key_index,
            tensors,
            tensor_index,
        })
    }

    #[allow(clippy::type_complexity)]
    fn metadata(&mut self, count: u64) -> Result<(Vec<(String, Value)>, HashMap<String, usize>)> {
        let cap = (count as usize).min(MAX_PREALLOC);
        let mut metadata = Vec::with_capacity(cap);
        let mut index = HashMap::with_capacity(cap);
        for i in 0..count {
            let key_offset = self.pos as u64;
            let key = self.string(&|| format!("key of metadata pair {i}"))?;
            if index.contains_key(&key) {
                return Err(GgufError::DuplicateKey {
                    file: self.file.to_string(),
                    key,
                    offset: key_offset,
                });
            }
            let type_offset = self.pos as u64;
            let ty = self.u32(|| format!("value type of {key:?}"))?;
            let value = self.value(ty, type_offset, &key, 0)?;
            index.insert(key.clone(), metadata.len());
            metadata.push((key, value));
        }
        Ok((metadata, index))
    }

    /// Reads one value of type `ty` (whose id was read at `ty_offset`) for metadata key `key`.
    fn value(&mut self, ty: u32, ty_offset: u64, key: &str, depth: usize) -> Result<Value> {
        let what = || format!("value of {key:?}");
        Ok(match ty {
            t::U8 => Value::U8(self.array::<1>(what)?[0]),
            t::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            t::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            t::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            t::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            t::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            t::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            t::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            t::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            t::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            t::BOOL => {
                let offset = self.pos as u64;
                let byte = self.array::<1>(what)?[0];
                self.bool(byte, key, offset)?
            }
            t::STRING => Value::String(self.string(&what)?),
            t::ARRAY => self.array_value(key, depth)?,
            id => {
                return Err(GgufError::UnknownValueType {
                    file: self.file.to_string(),
                    key: key.to_string(),
                    offset: ty_offset,
                    id,
                });
            }
        })
    }

    fn bool(&self, byte: u8, key: &str, offset: u64) -> Result<Value> {
        // Strict so that reading then writing reproduces the file byte for byte.
        match byte {
            0 => Ok(Value::Bool(false)),
            1 => Ok(Value::Bool(true)),
            byte => Err(GgufError::InvalidBool {
                file: self.file.to_string(),
                key: key.to_string(),
                offset,
                byte,
            }),
        }
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Value> {
        let start = self.pos as u64;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                file: self.file.to_string(),
                key: key.to_string(),
                offset: start,
                max: MAX_ARRAY_DEPTH,
            });
        }
        let elem_ty = self.u32(|| format!("array element type of {key:?}"))?;
        let min = min_value_size(elem_ty).ok_or_else(|| GgufError::UnknownValueType {
            file: self.file.to_string(),
            key: key.to_string(),
            offset: start,
            id: elem_ty,
        })?;
        let len = self.count(min, &|| format!("array length of {key:?}"))?;
        // Passed the size check, so len * min <= remaining and len fits usize.
        let len = len as usize;
        let what = || format!("array elements of {key:?}");
        macro_rules! fixed {
            ($variant:ident, $ty:ty) => {{
                const N: usize = std::mem::size_of::<$ty>();
                let bytes = self.take(len * N, what)?;
                bytes
                    .chunks_exact(N)
                    .map(|c| {
                        let mut a = [0u8; N];
                        a.copy_from_slice(c);
                        Value::$variant(<$ty>::from_le_bytes(a))
                    })
                    .collect()
            }};
        }
        let items: Vec<Value> = match elem_ty {
            t::U8 => fixed!(U8, u8),
            t::I8 => fixed!(I8, i8),
            t::U16 => fixed!(U16, u16),
            t::I16 => fixed!(I16, i16),
            t::U32 => fixed!(U32, u32),
            t::I32 => fixed!(I32, i32),
            t::F32 => fixed!(F32, f32),
            t::U64 => fixed!(U64, u64),
            t::I64 => fixed!(I64, i64),
            t::F64 => fixed!(F64, f64),
            t::BOOL => {
                let offset = self.pos as u64;
                let bytes = self.take(len, what)?;
                let mut items = Vec::with_capacity(len);
                for (i, &b) in bytes.iter().enumerate() {
                    items.push(self.bool(b, key, offset + i as u64)?);
                }
                items
            }
            t::STRING => {
                let mut items = Vec::with_capacity(len.min(MAX_PREALLOC));
                for i in 0..len {
                    items.push(Value::String(
                        self.string(&|| format!("string {i} of array {key:?}"))?,
                    ));
                }
                items
            }
            // t::ARRAY: each inner array carries its own element type.
            _ => {
                let mut items = Vec::with_capacity(len.min(MAX_PREALLOC));
                for _ in 0..len {
                    items.push(self.array_value(key, depth + 1)?);
                }
                items
            }
        };
        Ok(Value::Array(items))
    }

    fn alignment(
        &self,
        metadata: &[(String, Value)],
        index: &HashMap<String, usize>,
    ) -> Result<u32> {
        let Some(&i) = index.get("general.alignment") else {
            return Ok(DEFAULT_ALIGNMENT);
        };
        let v = &metadata[i].1;
        v.as_integer()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| GgufError::BadAlignment {
                file: self.file.to_string(),
                value: format!("{v:?}"),
            })
    }

    /// Reads the tensor infos; `offset` in the result is still relative to the data section.
    fn tensor_infos(&mut self, count: u64) -> Result<(Vec<TensorInfo>, HashMap<String, usize>)> {
        let cap = (count as usize).min(MAX_PREALLOC);
        let mut tensors = Vec::with_capacity(cap);
        let mut index = HashMap::with_capacity(cap);
        for i in 0..count {
            let info_offset = self.pos as u64;
            let name = self.string(&|| format!("name of tensor {i}"))?;
            if index.contains_key(&name) {
                return Err(GgufError::DuplicateTensor {
                    file: self.file.to_string(),
                    tensor: name,
                    offset: info_offset,
                });
            }
            let file = self.file;
            let bad_shape = |offset: u64, reason: String| GgufError::BadShape {
                file: file.to_string(),
                tensor: name.clone(),
                offset,
                reason,
            };
            let dims_offset = self.pos as u64;
            let n_dims = self.u32(|| format!("n_dims of tensor {name:?}"))?;
            if n_dims == 0 || n_dims as usize > MAX_DIMS {
                return Err(bad_shape(
                    dims_offset,
                    format!("{n_dims} dimensions (must be 1..={MAX_DIMS})"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(self.u64(|| format!("dims of tensor {name:?}"))?);
            }
            let type_offset = self.pos as u64;
            let type_id = self.u32(|| format!("type of tensor {name:?}"))?;
            let ggml_type =
                GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
                    file: self.file.to_string(),
                    tensor: name.clone(),
                    offset: type_offset,
                    id: type_id,
                })?;
            let (_, size) = shape_size(&dims, ggml_type).map_err(|r| bad_shape(dims_offset, r))?;
            let offset = self.u64(|| format!("data offset of tensor {name:?}"))?;
            index.insert(name.clone(), tensors.len());
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                size,
            });
        }
        Ok((tensors, index))
    }

    /// Makes offsets absolute and checks alignment, bounds and overlap.
    fn place_tensors(&self, tensors: &mut [TensorInfo], data: u64, alignment: u32) -> Result<()> {
        let len = self.buf.len() as u64;
        for t in tensors.iter_mut() {
            if !t.offset.is_multiple_of(u64::from(alignment)) {
                return Err(GgufError::MisalignedTensor {
                    file: self.file.to_string(),
                    tensor: t.name.clone(),
                    offset: t.offset,
                    alignment,
                });
            }
            let start = data.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.size));
            match (start, end) {
                (Some(start), Some(end)) if end <= len => t.offset = start,
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        file: self.file.to_string(),
                        tensor: t.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        len,
                    });
                }
            }
        }
        // Empty tensors occupy no bytes and cannot overlap anything.
        let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.size > 0).collect();
        order.sort_unstable_by_key(|t| t.offset);
        for w in order.windows(2) {
            if w[1].offset < w[0].offset + w[0].size {
                return Err(GgufError::OverlappingTensors {
                    file: self.file.to_string(),
                    first: w[0].name.clone(),
                    second: w[1].name.clone(),
                    offset: w[1].offset,
                });
            }
        }
        Ok(())
    }
}
