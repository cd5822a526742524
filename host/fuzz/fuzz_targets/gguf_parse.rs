//! Parses arbitrary bytes as GGUF. Any input may be rejected, none may panic; an accepted file
//! must re-encode through the writer into a file that parses to the same metadata and data.
#![no_main]

use libfuzzer_sys::fuzz_target;

// Compiled in directly rather than through kiln-host, whose CUDA and tokenizer dependencies
// would all be rebuilt with sanitizer instrumentation; the module is self-contained for this.
#[allow(dead_code, unused_imports)]
#[path = "../../src/gguf/mod.rs"]
mod gguf;

use gguf::{GgufFile, GgufWriter};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    // Walk everything the accessors expose.
    let _ = f.architecture();
    for (key, value) in f.metadata() {
        assert!(f.get(key).is_some_and(|v| v.bit_eq(value)));
        let _ = (f.get_u32(key), f.get_u64(key), f.get_f32(key), f.get_bool(key));
        let _ = (f.get_str(key), f.get_str_array(key), f.get_i32_array(key), f.get_f32_array(key));
    }
    let mut w = GgufWriter::new();
    for (key, value) in f.metadata() {
        w.add_metadata(key.clone(), value.clone()).expect("reader accepted it, writer must");
    }
    let mut datas = Vec::new();
    for t in f.tensors() {
        assert_eq!(f.tensor(&t.name).map(|x| x.offset).ok(), Some(t.offset));
        let d = f.tensor_data(t);
        assert_eq!(d.len() as u64, t.size);
        assert_eq!(t.n_elements(), t.row_len() * t.rows());
        w.add_tensor(t.name.clone(), &t.dims, t.ggml_type).expect("writer accepts the shape");
        datas.push(d);
    }
    let bytes = w.to_vec(&datas).expect("write");
    let g = GgufFile::from_bytes(bytes).expect("writer output parses");
    assert_eq!(g.metadata().len(), f.metadata().len());
    for ((k1, v1), (k2, v2)) in f.metadata().iter().zip(g.metadata()) {
        assert!(k1 == k2 && v1.bit_eq(v2));
    }
    for (a, b) in f.tensors().iter().zip(g.tensors()) {
        assert!(a.name == b.name && a.dims == b.dims && a.ggml_type == b.ggml_type);
        assert_eq!(f.tensor_data(a), g.tensor_data(b));
    }
});
