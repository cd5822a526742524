//! GGUF reader/writer tests: round trips, truncation, hostile headers, accessors, real model.
use std::path::PathBuf;

use kiln_host::gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Helpers

/// A declared tensor plus its bytes.
#[derive(Clone, Debug)]
struct T {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

fn tensor(name: &str, dims: &[u64], ty: GgmlType, seed: u8) -> T {
    let n: u64 = dims.iter().product();
    let size = ty.bytes_for(n).expect("test shape") as usize;
    let data = (0..size)
        .map(|i| seed.wrapping_add((i * 31) as u8))
        .collect();
    T {
        name: name.into(),
        dims: dims.to_vec(),
        ty,
        data,
    }
}

fn write(meta: &[(String, Value)], tensors: &[T]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add_metadata(k.clone(), v.clone()).expect("add_metadata");
    }
    for t in tensors {
        w.add_tensor(t.name.clone(), &t.dims, t.ty)
            .expect("add_tensor");
    }
    let data: Vec<&[u8]> = tensors.iter().map(|t| t.data.as_slice()).collect();
    w.to_vec(&data).expect("to_vec")
}

/// Writes a parsed file back out; must reproduce the original bytes exactly.
fn rewrite(f: &GgufFile) -> Vec<u8> {
    let tensors: Vec<T> = f
        .tensors()
        .iter()
        .map(|t| T {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ggml_type,
            data: f.tensor_data(t).to_vec(),
        })
        .collect();
    write(f.metadata(), &tensors)
}

fn assert_same(f: &GgufFile, meta: &[(String, Value)], tensors: &[T]) {
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata().len(), meta.len());
    for ((k1, v1), (k2, v2)) in f.metadata().iter().zip(meta) {
        assert_eq!(k1, k2);
        assert!(v1.bit_eq(v2), "{k1}: {v1:?} != {v2:?}");
        assert!(f.get(k1).is_some_and(|v| v.bit_eq(v2)));
    }
    assert_eq!(f.tensors().len(), tensors.len());
    for (info, t) in f.tensors().iter().zip(tensors) {
        assert_eq!(info.name, t.name);
        assert_eq!(info.dims, t.dims);
        assert_eq!(info.ggml_type, t.ty);
        assert_eq!(info.size, t.data.len() as u64);
        assert_eq!(info.offset % u64::from(f.alignment()), 0);
        assert_eq!(f.tensor_data(info), t.data.as_slice());
        assert_eq!(f.tensor(&t.name).expect("tensor by name"), info);
    }
}

/// Hand-assembled GGUF bytes, for inputs the writer refuses to produce.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw(b"GGUF".to_vec()).u32(version).u64(n_tensors).u64(n_kv)
    }
    fn u32(mut self, v: u32) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &[u8]) -> Raw {
        self.u64(s.len() as u64).bytes(s)
    }
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    fn data(mut self, align: usize, n: usize) -> Raw {
        let len = self.0.len().next_multiple_of(align) + n;
        self.0.resize(len, 0xAB);
        self
    }
    fn parse(self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0)
    }
}

fn every_value_type() -> Vec<(String, Value)> {
    let s = |x: &str| Value::String(x.into());
    vec![
        ("u8".into(), Value::U8(200)),
        ("i8".into(), Value::I8(-7)),
        ("u16".into(), Value::U16(65000)),
        ("i16".into(), Value::I16(-30000)),
        ("u32".into(), Value::U32(4_000_000_000)),
        ("i32".into(), Value::I32(-2_000_000_000)),
        ("f32".into(), Value::F32(-0.0)),
        ("f32.nan".into(), Value::F32(f32::from_bits(0x7fc0_1234))),
        ("bool.t".into(), Value::Bool(true)),
        ("bool.f".into(), Value::Bool(false)),
        ("string".into(), s("héllo ▁world")),
        ("string.empty".into(), s("")),
        ("u64".into(), Value::U64(u64::MAX)),
        ("i64".into(), Value::I64(i64::MIN)),
        ("f64".into(), Value::F64(std::f64::consts::PI)),
        ("arr.str".into(), Value::Array(vec![s("a"), s(""), s("ü")])),
        (
            "arr.i32".into(),
            Value::Array(vec![Value::I32(-1), Value::I32(2)]),
        ),
        (
            "arr.f32".into(),
            Value::Array(vec![Value::F32(0.5), Value::F32(-1.5)]),
        ),
        (
            "arr.bool".into(),
            Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
        ),
        ("arr.empty".into(), Value::Array(vec![])),
        (
            "arr.nested".into(),
            Value::Array(vec![
                Value::Array(vec![Value::U8(1)]),
                Value::Array(vec![s("x")]),
                Value::Array(vec![]),
            ]),
        ),
        ("general.alignment".into(), Value::U32(64)),
        ("general.architecture".into(), s("llama")),
    ]
}

fn sample_tensors() -> Vec<T> {
    vec![
        tensor("a", &[64, 3], GgmlType::Q8_0, 1),
        tensor("b", &[5], GgmlType::F32, 2),
        tensor("empty", &[32, 0], GgmlType::Q4_0, 3),
        tensor("c", &[256, 2, 1, 2], GgmlType::Q4_K, 4),
        tensor("d", &[3, 1], GgmlType::F16, 5),
    ]
}

// ---------------------------------------------------------------------------------------------
// Round trips

#[test]
fn round_trip_every_value_type() {
    let meta = every_value_type();
    let tensors = sample_tensors();
    let bytes = write(&meta, &tensors);
    let f = GgufFile::from_bytes(bytes.clone()).expect("parse");
    assert_same(&f, &meta, &tensors);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(rewrite(&f), bytes);
    assert!(f.path().is_none());
}

#[test]
fn chunked_stream_matches_whole_writes() {
    let tensors = sample_tensors();
    let whole = write(&[], &tensors);
    let mut w = GgufWriter::new();
    for t in &tensors {
        w.add_tensor(t.name.clone(), &t.dims, t.ty).expect("add");
    }
    let mut s = w.begin(Vec::new()).expect("begin");
    for t in &tensors {
        if t.data.is_empty() {
            s.write_tensor_chunk(&t.name, &[]).expect("empty");
        }
        for c in t.data.chunks(7) {
            s.write_tensor_chunk(&t.name, c).expect("chunk");
        }
    }
    assert!(s.next_tensor().is_none());
    assert_eq!(s.finish().expect("finish"), whole);
}

#[test]
fn open_via_mmap() {
    let meta = every_value_type();
    let tensors = sample_tensors();
    let path = std::env::temp_dir().join(format!("kiln-gguf-test-{}.gguf", std::process::id()));
    std::fs::write(&path, write(&meta, &tensors)).expect("write temp file");
    let f = GgufFile::open(&path).expect("open");
    assert_same(&f, &meta, &tensors);
    assert_eq!(f.path(), Some(path.as_path()));
    let err = f.tensor("nope").expect_err("missing tensor").to_string();
    assert!(
        err.contains("nope") && err.contains(&path.display().to_string()),
        "{err}"
    );
    drop(f);
    std::fs::remove_file(&path).ok();
    let err = GgufFile::open(&path).expect_err("gone");
    assert!(matches!(err, GgufError::Io { .. }), "{err}");
}

fn leaf(tid: u32) -> BoxedStrategy<Value> {
    match tid {
        0 => any::<u8>().prop_map(Value::U8).boxed(),
        1 => any::<i8>().prop_map(Value::I8).boxed(),
        2 => any::<u16>().prop_map(Value::U16).boxed(),
        3 => any::<i16>().prop_map(Value::I16).boxed(),
        4 => any::<u32>().prop_map(Value::U32).boxed(),
        5 => any::<i32>().prop_map(Value::I32).boxed(),
        6 => any::<u32>()
            .prop_map(|b| Value::F32(f32::from_bits(b)))
            .boxed(),
        7 => any::<bool>().prop_map(Value::Bool).boxed(),
        8 => ".{0,12}".prop_map(Value::String).boxed(),
        10 => any::<u64>().prop_map(Value::U64).boxed(),
        11 => any::<i64>().prop_map(Value::I64).boxed(),
        _ => any::<u64>()
            .prop_map(|b| Value::F64(f64::from_bits(b)))
            .boxed(),
    }
}

fn scalar_type() -> impl Strategy<Value = u32> {
    (0u32..12).prop_map(|t| if t >= 9 { t + 1 } else { t })
}

fn array(depth: u32) -> BoxedStrategy<Value> {
    let flat = scalar_type()
        .prop_flat_map(|t| prop::collection::vec(leaf(t), 0..6))
        .prop_map(Value::Array)
        .boxed();
    if depth <= 1 {
        flat
    } else {
        prop_oneof![
            3 => flat,
            1 => prop::collection::vec(array(depth - 1), 0..4).prop_map(Value::Array),
        ]
        .boxed()
    }
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![3 => scalar_type().prop_flat_map(leaf), 1 => array(3)]
}

fn metadata() -> impl Strategy<Value = Vec<(String, Value)>> {
    let pairs = prop::collection::vec(("[a-z._]{0,10}", value()), 0..10);
    let align = prop::option::of(prop::sample::select(vec![1u32, 2, 8, 32, 64, 256]));
    (pairs, align).prop_map(|(pairs, align)| {
        let mut seen = std::collections::HashSet::new();
        let mut meta: Vec<(String, Value)> = pairs
            .into_iter()
            .filter(|(k, _)| seen.insert(k.clone()))
            .collect();
        if let Some(a) = align {
            meta.insert(meta.len() / 2, ("general.alignment".into(), Value::U32(a)));
        }
        meta
    })
}

const TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::BF16,
];

fn tensors(min: usize) -> impl Strategy<Value = Vec<T>> {
    let one = (
        0..TYPES.len(),
        1u64..3,
        prop::collection::vec(0u64..4, 0..4),
        any::<u8>(),
    );
    prop::collection::vec(one, min..5).prop_map(|ts| {
        ts.into_iter()
            .enumerate()
            .map(|(i, (ty, blocks, rest, seed))| {
                let ty = TYPES[ty];
                let mut dims = vec![blocks * ty.block().0 as u64];
                dims.extend(rest);
                tensor(&format!("blk.{i}.weight"), &dims, ty, seed)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn prop_round_trip(meta in metadata(), tensors in tensors(0)) {
        let bytes = write(&meta, &tensors);
        let f = GgufFile::from_bytes(bytes.clone()).expect("parse");
        assert_same(&f, &meta, &tensors);
        prop_assert_eq!(rewrite(&f), bytes);
    }

    /// Dropping any of the bytes the tensors need is an error; dropping only trailing padding
    /// is fine. Never a panic.
    #[test]
    fn prop_truncation(meta in metadata(), tensors in tensors(1), cut in any::<prop::sample::Index>()) {
        let bytes = write(&meta, &tensors);
        let f = GgufFile::from_bytes(bytes.clone()).expect("parse");
        let needed = f.tensors().iter().map(|t| t.offset + t.size).max().expect("tensors") as usize;
        let cut = cut.index(bytes.len());
        let r = GgufFile::from_bytes(bytes[..cut].to_vec());
        prop_assert_eq!(r.is_ok(), cut >= needed, "cut {} needed {}: {:?}", cut, needed, r.err());
    }

    /// Random byte corruption: any result, but no panic, and an Ok file is self-consistent.
    #[test]
    fn prop_corruption(meta in metadata(), tensors in tensors(0),
                       edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut bytes = write(&meta, &tensors);
        for (i, b) in edits {
            let i = i.index(bytes.len());
            bytes[i] = b;
        }
        if let Ok(f) = GgufFile::from_bytes(bytes) {
            for t in f.tensors() {
                prop_assert_eq!(f.tensor_data(t).len() as u64, t.size);
            }
            let _ = rewrite(&f);
        }
    }
}

#[test]
fn truncation_at_every_byte() {
    let meta = every_value_type();
    let tensors = sample_tensors();
    let bytes = write(&meta, &tensors);
    let f = GgufFile::from_bytes(bytes.clone()).expect("parse");
    let needed = f
        .tensors()
        .iter()
        .map(|t| t.offset + t.size)
        .max()
        .expect("tensors") as usize;
    for cut in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..cut].to_vec());
        assert_eq!(r.is_ok(), cut >= needed, "cut {cut}: {:?}", r.err());
    }
    // Without tensors only the trailing padding may go.
    let bytes = write(&meta, &[]);
    let first_ok = (0..=bytes.len())
        .find(|&cut| GgufFile::from_bytes(bytes[..cut].to_vec()).is_ok())
        .expect("full file parses");
    assert!(bytes.len() - first_ok < 64, "{first_ok} of {}", bytes.len());
    for cut in first_ok..=bytes.len() {
        assert!(GgufFile::from_bytes(bytes[..cut].to_vec()).is_ok());
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile input: each case must give the named error variant

macro_rules! assert_err {
    ($r:expr, $pat:pat $(if $guard:expr)?, $($needle:expr),*) => {{
        let e = $r.expect_err("expected an error");
        let msg = e.to_string();
        assert!(matches!(e, $pat $(if $guard)?), "wrong variant: {msg}");
        $( assert!(msg.contains($needle), "{msg:?} lacks {:?}", $needle); )*
    }};
}

#[test]
fn bad_headers() {
    assert_err!(
        GgufFile::from_bytes(b"GGU".to_vec()),
        GgufError::Truncated { .. },
        "magic"
    );
    assert_err!(
        GgufFile::from_bytes(b"GGML\x03\0\0\0".to_vec()),
        GgufError::BadMagic { .. },
        "GGUF"
    );
    assert_err!(
        Raw::header(1, 0, 0).parse(),
        GgufError::UnsupportedVersion { version: 1, .. },
        "v1"
    );
    assert_err!(
        Raw::header(4, 0, 0).parse(),
        GgufError::UnsupportedVersion { version: 4, .. },
        "4"
    );
    assert_err!(
        Raw::header(3u32.swap_bytes(), 0, 0).parse(),
        GgufError::UnsupportedVersion { .. },
        "big-endian"
    );
    // v2 shares v3's layout.
    let f = Raw::header(2, 0, 1).kv_u32("x", 5).parse().expect("v2");
    assert_eq!((f.version(), f.get_u32("x").expect("x")), (2, 5));
}

#[test]
fn absurd_counts() {
    assert_err!(
        Raw::header(3, 0, 1 << 60).parse(),
        GgufError::CountTooLarge { count, .. } if count == 1 << 60,
        "metadata count"
    );
    assert_err!(
        Raw::header(3, u64::MAX, 0).parse(),
        GgufError::CountTooLarge { .. },
        "tensor count"
    );
    assert_err!(
        Raw::header(3, 0, 1).u64(1 << 63).bytes(&[b'a'; 32]).parse(),
        GgufError::CountTooLarge { offset: 24, .. },
        "key of metadata pair 0"
    );
    assert_err!(
        Raw::header(3, 0, 1).str(b"k").u32(8).u64(u64::MAX).parse(),
        GgufError::CountTooLarge { .. },
        "\"k\""
    );
    for elem in [0u32, 8, 9, 12] {
        assert_err!(
            Raw::header(3, 0, 1)
                .str(b"arr")
                .u32(9)
                .u32(elem)
                .u64(1 << 62)
                .bytes(&[0; 64])
                .parse(),
            GgufError::CountTooLarge { .. },
            "array length of \"arr\""
        );
    }
    // Array of strings whose 2nd string is absurdly long.
    assert_err!(
        Raw::header(3, 0, 1)
            .str(b"v")
            .u32(9)
            .u32(8)
            .u64(2)
            .str(b"ok")
            .u64(1 << 40)
            .parse(),
        GgufError::CountTooLarge { .. },
        "string 1 of array \"v\""
    );
}

#[test]
fn bad_values() {
    assert_err!(
        Raw::header(3, 0, 1).str(b"key.x").u32(13).u32(0).parse(),
        GgufError::UnknownValueType {
            id: 13,
            offset: 37,
            ..
        },
        "key.x",
        "13"
    );
    assert_err!(
        Raw::header(3, 0, 1)
            .str(b"arr")
            .u32(9)
            .u32(99)
            .u64(0)
            .parse(),
        GgufError::UnknownValueType { id: 99, .. },
        "arr"
    );
    assert_err!(
        Raw::header(3, 0, 1).str(b"b").u32(7).bytes(&[2]).parse(),
        GgufError::InvalidBool { byte: 2, .. },
        "\"b\""
    );
    assert_err!(
        Raw::header(3, 0, 1).str(b"k\xff").u32(4).u32(0).parse(),
        GgufError::InvalidUtf8 { offset: 32, .. },
        "key of metadata pair 0"
    );
    assert_err!(
        Raw::header(3, 0, 1).str(b"k").u32(8).str(b"\xc3(").parse(),
        GgufError::InvalidUtf8 { .. },
        "value of \"k\""
    );
    assert_err!(
        Raw::header(3, 0, 2)
            .kv_u32("dup", 1)
            .kv_u32("dup", 2)
            .parse(),
        GgufError::DuplicateKey { .. },
        "dup"
    );
    // 9 levels of nesting.
    let mut r = Raw::header(3, 0, 1).str(b"deep").u32(9);
    for _ in 0..9 {
        r = r.u32(9).u64(1);
    }
    assert_err!(
        r.u32(0).u64(0).parse(),
        GgufError::NestingTooDeep { .. },
        "deep"
    );
    // A million nested levels must not overflow the stack either.
    let mut r = Raw::header(3, 0, 1).str(b"deep").u32(9);
    for _ in 0..1_000_000 {
        r = r.u32(9).u64(1);
    }
    assert_err!(r.parse(), GgufError::NestingTooDeep { .. }, "deep");
}

#[test]
fn bad_alignment() {
    for a in [0u32, 3, 48] {
        assert_err!(
            Raw::header(3, 0, 1).kv_u32("general.alignment", a).parse(),
            GgufError::BadAlignment { .. },
            "general.alignment"
        );
    }
    assert_err!(
        Raw::header(3, 0, 1)
            .str(b"general.alignment")
            .u32(8)
            .str(b"32")
            .parse(),
        GgufError::BadAlignment { .. },
        "alignment"
    );
    assert_err!(
        Raw::header(3, 0, 1)
            .str(b"general.alignment")
            .u32(10)
            .u64(1 << 40)
            .parse(),
        GgufError::BadAlignment { .. },
        "alignment"
    );
    // Any integer type that fits is accepted.
    let f = Raw::header(3, 0, 1)
        .str(b"general.alignment")
        .u32(0)
        .bytes(&[16])
        .parse()
        .expect("u8");
    assert_eq!(f.alignment(), 16);
}

#[test]
fn bad_tensors() {
    let q8 = GgmlType::Q8_0 as u32;
    assert_err!(
        Raw::header(3, 1, 0)
            .tensor("blk.0.w", &[32], 5, 0)
            .data(32, 64)
            .parse(),
        GgufError::UnknownTensorType { id: 5, .. },
        "blk.0.w",
        "5"
    );
    assert_err!(
        Raw::header(3, 1, 0)
            .tensor("t5", &[32, 1, 1, 1, 1], q8, 0)
            .data(32, 64)
            .parse(),
        GgufError::BadShape { .. },
        "t5",
        "5 dimensions"
    );
    assert_err!(
        Raw::header(3, 1, 0)
            .tensor("t0", &[], q8, 0)
            .data(32, 64)
            .parse(),
        GgufError::BadShape { .. },
        "t0"
    );
    assert_err!(
        Raw::header(3, 1, 0)
            .tensor("big", &[1 << 32, 1 << 32], 0, 0)
            .data(32, 64)
            .parse(),
        GgufError::BadShape { .. },
        "big",
        "overflow"
    );
    assert_err!(
        Raw::header(3, 1, 0)
            .tensor("row", &[33, 2], q8, 0)
            .data(32, 128)
            .parse(),
        GgufError::BadShape { .. },
        "row",
        "block size"
    );
    assert_err!(
        Raw::header(3, 1, 0).tensor("nodata", &[32], q8, 0).parse(),
        GgufError::TensorOutOfBounds { .. },
        "nodata"
    );
    // Past the end: by one byte, and by an offset that overflows u64.
    assert_err!(
        Raw::header(3, 1, 0).tensor("past", &[32], q8, 0).data(32, 33).parse(),
        GgufError::TensorOutOfBounds { len, .. } if len > 0,
        "past"
    );
    assert_err!(
        Raw::header(3, 1, 0)
            .tensor("far", &[32], q8, u64::MAX - 31)
            .data(32, 34)
            .parse(),
        GgufError::TensorOutOfBounds { .. },
        "far"
    );
    assert_err!(
        Raw::header(3, 1, 0)
            .tensor("mis", &[32], q8, 8)
            .data(32, 64)
            .parse(),
        GgufError::MisalignedTensor {
            offset: 8,
            alignment: 32,
            ..
        },
        "mis"
    );
    assert_err!(
        Raw::header(3, 2, 0)
            .tensor("first", &[64], q8, 0)
            .tensor("second", &[32], q8, 32)
            .data(32, 128)
            .parse(),
        GgufError::OverlappingTensors { .. },
        "first",
        "second"
    );
    assert_err!(
        Raw::header(3, 2, 0)
            .tensor("same", &[32], q8, 0)
            .tensor("same", &[32], q8, 64)
            .data(32, 128)
            .parse(),
        GgufError::DuplicateTensor { .. },
        "same"
    );
    assert_err!(
        Raw::header(3, 1, 0)
            .str(b"\xfe")
            .u32(1)
            .u64(32)
            .u32(q8)
            .u64(0)
            .data(32, 64)
            .parse(),
        GgufError::InvalidUtf8 { .. },
        "name of tensor 0"
    );
    // Well-formed counterparts parse, including an empty tensor sharing an offset.
    let f = Raw::header(3, 3, 0)
        .tensor("a", &[32], q8, 0)
        .tensor("e", &[0, 4], q8, 64)
        .tensor("b", &[32], q8, 64)
        .data(32, 98)
        .parse()
        .expect("valid");
    assert_eq!(f.tensor("b").expect("b").size, 34);
    assert_eq!(f.tensor_data(f.tensor("e").expect("e")), &[] as &[u8]);
}

// ---------------------------------------------------------------------------------------------
// Accessors and writer validation

#[test]
fn accessors() {
    let s = |x: &str| Value::String(x.into());
    let meta: Vec<(String, Value)> = vec![
        ("u8".into(), Value::U8(7)),
        ("neg".into(), Value::I32(-1)),
        ("big".into(), Value::U64(1 << 40)),
        ("f64".into(), Value::F64(0.25)),
        ("flag".into(), Value::Bool(true)),
        ("name".into(), s("kiln")),
        ("toks".into(), Value::Array(vec![s("a"), s("b")])),
        ("mixed".into(), Value::Array(vec![Value::I64(1 << 40)])),
        (
            "fs".into(),
            Value::Array(vec![Value::F32(1.5), Value::F32(2.0)]),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &meta {
        w.add_metadata(k.clone(), v.clone()).expect("add");
    }
    let f = GgufFile::from_bytes(w.to_vec(&[]).expect("write")).expect("parse");
    assert_eq!(f.get_u32("u8").expect("u8"), 7);
    assert_eq!(f.get_u64("big").expect("big"), 1 << 40);
    assert_eq!(f.get_f32("f64").expect("f64"), 0.25);
    assert!(f.get_bool("flag").expect("flag"));
    assert_eq!(f.get_str("name").expect("name"), "kiln");
    assert_eq!(f.get_str_array("toks").expect("toks"), ["a", "b"]);
    assert_eq!(f.get_f32_array("fs").expect("fs"), [1.5, 2.0]);
    assert_err!(
        f.get_u32("missing"),
        GgufError::MissingKey { .. },
        "missing",
        "<memory>"
    );
    assert_err!(f.get_u32("neg"), GgufError::WrongType { .. }, "neg", "-1");
    assert_err!(f.get_u32("big"), GgufError::WrongType { .. }, "big");
    assert_err!(
        f.get_u64("name"),
        GgufError::WrongType { .. },
        "name",
        "string"
    );
    assert_err!(f.get_f32("u8"), GgufError::WrongType { .. }, "u8");
    assert_err!(f.get_bool("u8"), GgufError::WrongType { .. }, "u8");
    assert_err!(f.get_str("flag"), GgufError::WrongType { .. }, "flag");
    assert_err!(
        f.get_i32_array("mixed"),
        GgufError::WrongType { .. },
        "mixed",
        "element 0"
    );
    assert_err!(f.get_str_array("fs"), GgufError::WrongType { .. }, "fs");
    assert_err!(
        f.architecture(),
        GgufError::MissingKey { .. },
        "general.architecture"
    );
    assert_err!(f.tensor("x"), GgufError::MissingTensor { .. }, "\"x\"");

    // i32 array, as llama.cpp writes token types.
    let f = Raw::header(3, 0, 1)
        .str(b"ids")
        .u32(9)
        .u32(5)
        .u64(2)
        .u32(1)
        .u32(-3i32 as u32)
        .parse()
        .expect("parse");
    assert_eq!(f.get_i32_array("ids").expect("ids"), [1, -3]);
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::U8(1)).expect("first");
    assert!(matches!(
        w.add_metadata("k", Value::U8(2)),
        Err(GgufError::InvalidWrite(_))
    ));
    let mixed = Value::Array(vec![Value::U8(1), Value::I8(1)]);
    assert!(w.add_metadata("mixed", mixed).is_err());
    let mut deep = Value::Array(vec![]);
    for _ in 0..8 {
        deep = Value::Array(vec![deep]);
    }
    assert!(w.add_metadata("deep", deep).is_err());
    assert!(w.add_metadata("general.alignment", Value::U32(24)).is_err());
    assert!(w.add_tensor("bad", &[33], GgmlType::Q8_0).is_err());
    assert!(
        w.add_tensor("bad", &[32, 1, 1, 1, 1], GgmlType::Q8_0)
            .is_err()
    );
    w.add_tensor("a", &[32], GgmlType::Q8_0).expect("a");
    assert!(w.add_tensor("a", &[32], GgmlType::Q8_0).is_err());
    w.add_tensor("b", &[2], GgmlType::F32).expect("b");
    assert_eq!(w.tensor_size("a"), Some(34));

    let mut s = w.begin(Vec::new()).expect("begin");
    assert!(s.write_tensor("b", &[0; 8]).is_err(), "out of order");
    assert!(s.write_tensor("a", &[0; 33]).is_err(), "wrong size");
    s.write_tensor_chunk("a", &[0; 30]).expect("chunk");
    assert!(s.write_tensor_chunk("a", &[0; 5]).is_err(), "overrun");
    s.write_tensor_chunk("a", &[0; 4]).expect("rest");
    assert_eq!(s.next_tensor(), Some(("b", 8)));
    let s2 = s;
    assert!(s2.finish().is_err(), "b missing");
}

// ---------------------------------------------------------------------------------------------
// The real model

#[test]
fn real_model_smollm2() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("SKIP: {} not present", path.display());
        return;
    }
    let f = GgufFile::open(&path).expect("open");
    assert_eq!(f.architecture().expect("arch"), "llama");
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(f.get_u32("llama.block_count").expect("block_count"), 30);
    let emb = f.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(emb.ggml_type, GgmlType::Q8_0);
    assert_eq!(emb.dims, [576, 49152]);
    assert_eq!(
        (emb.row_len(), emb.rows(), emb.n_elements()),
        (576, 49152, 576 * 49152)
    );
    assert_eq!(f.tensor_data(emb).len() as u64, 576 * 49152 / 32 * 34);
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens")
            .expect("tokens")
            .len(),
        49152
    );
    // Our writer reproduces the file byte for byte (metadata, infos, padding, data).
    assert!(
        rewrite(&f) == f.as_bytes(),
        "rewrite differs from {}",
        path.display()
    );
}
