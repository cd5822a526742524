//! GGUF error paths: hostile headers (each must give the named error variant, never a panic),
//! accessor type errors, and writer input validation. Round trips live in `gguf.rs`.
use kiln_host::gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

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
