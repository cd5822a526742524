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
