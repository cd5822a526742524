//! Control vectors: steering a model by adding a fixed direction to its residual stream after
//! each layer, read from llama.cpp's control-vector GGUF files (`--control-vector`).
//!
//! The file format (what llama.cpp's `control-vector-generator` writes): one f32 tensor
//! `direction.N` of `n_embd` elements per layer `N ≥ 1`, added to the residual stream after
//! block `N` (0-based; block 0 has none). Several files add up, each times its scale, and a
//! layer range keeps only the layers inside it — llama.cpp's `--control-vector-scaled` and
//! `--control-vector-layer-range`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};

use crate::gguf::{GgmlType, GgufFile};

/// One control-vector file and the scale its directions are added with.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlVectorFile {
    pub path: PathBuf,
    pub scale: f32,
}

/// Per-layer directions to add after each block (`None`: nothing for that layer).
pub type LayerDirections = Vec<Option<Vec<f32>>>;

/// Sums the files' scaled directions for a model of `n_layer` blocks of width `n_embd`, keeping
/// layers `range.0 ..= range.1` (default: all). Every mismatch is an error naming the file
/// and tensor.
pub fn load(
    files: &[ControlVectorFile],
    n_layer: usize,
    n_embd: usize,
    range: Option<(usize, usize)>,
) -> Result<LayerDirections> {
    let (first, last) = range.unwrap_or((1, n_layer.saturating_sub(1)));
    ensure!(
        first >= 1 && first <= last,
        "control vector layer range {first}..={last}: expected 1 ≤ start ≤ end"
    );
    let mut layers: LayerDirections = vec![None; n_layer];
    for f in files {
        ensure!(
            f.scale.is_finite(),
            "control vector {}: scale {} is not finite",
            f.path.display(),
            f.scale
        );
        let file = GgufFile::open(&f.path)
            .with_context(|| format!("control vector {}", f.path.display()))?;
        add_file(&file, &f.path, f.scale, n_embd, &mut layers)?;
    }
    for (i, l) in layers.iter_mut().enumerate() {
        if i < first || i > last {
            *l = None;
        }
    }
    Ok(layers)
}

fn add_file(
    file: &GgufFile,
    path: &Path,
    scale: f32,
    n_embd: usize,
    layers: &mut LayerDirections,
) -> Result<()> {
    let at = |name: &str| format!("control vector {}, tensor {name}", path.display());
    if file.tensors().is_empty() {
        bail!("control vector {}: no direction tensors", path.display());
    }
    for t in file.tensors() {
        let layer = t
            .name
            .strip_prefix("direction.")
            .and_then(|n| n.parse::<usize>().ok())
            .with_context(|| format!("{}: expected names direction.N", at(&t.name)))?;
        ensure!(
            (1..layers.len()).contains(&layer),
            "{}: layer {layer} is outside 1..{} for this {}-layer model",
            at(&t.name),
            layers.len() - 1,
            layers.len()
        );
        ensure!(
            t.ggml_type == GgmlType::F32,
            "{}: type {}, expected F32",
            at(&t.name),
            t.ggml_type.name()
        );
        ensure!(
            t.dims.len() == 1 && t.dims[0] as usize == n_embd,
            "{}: shape {:?}, expected [{n_embd}] (the model's embedding width)",
            at(&t.name),
            t.dims
        );
        let bytes = file.tensor_data(t);
        let dir = layers[layer].get_or_insert_with(|| vec![0.0; n_embd]);
        for (d, b) in dir.iter_mut().zip(bytes.chunks_exact(4)) {
            *d += scale * f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufWriter, Value};

    /// Writes a control-vector file of `(tensor name, type, values)` to a fresh temp path.
    fn write(tag: &str, tensors: &[(&str, GgmlType, Vec<f32>)]) -> PathBuf {
        let mut w = GgufWriter::new();
        w.add_metadata(
            "general.architecture",
            Value::String("controlvector".into()),
        )
        .unwrap();
        let mut data = Vec::new();
        for (name, ty, v) in tensors {
            w.add_tensor(*name, &[v.len() as u64], *ty).unwrap();
            data.push(match ty {
                GgmlType::F16 => v
                    .iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                    .collect::<Vec<u8>>(),
                _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            });
        }
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let path =
            std::env::temp_dir().join(format!("kiln-cvec-{}-{tag}.gguf", std::process::id()));
        std::fs::write(&path, w.to_vec(&refs).unwrap()).unwrap();
        path
    }

    fn file(path: &Path, scale: f32) -> ControlVectorFile {
        ControlVectorFile {
            path: path.to_path_buf(),
            scale,
        }
    }

    #[test]
    fn files_add_up_scaled_per_layer_within_the_range() {
        let a = write(
            "a",
            &[
                ("direction.1", GgmlType::F32, vec![1.0, 2.0, 3.0]),
                ("direction.3", GgmlType::F32, vec![-1.0, 0.5, 0.0]),
            ],
        );
        let b = write(
            "b",
            &[("direction.1", GgmlType::F32, vec![10.0, 0.0, -10.0])],
        );
        let got = load(&[file(&a, 2.0), file(&b, -0.5)], 4, 3, None).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], None);
        assert_eq!(got[1], Some(vec![2.0 - 5.0, 4.0, 6.0 + 5.0]));
        assert_eq!(got[2], None);
        assert_eq!(got[3], Some(vec![-2.0, 1.0, 0.0]));
        // Layers outside START..=END are dropped.
        let got = load(&[file(&a, 1.0)], 4, 3, Some((2, 3))).unwrap();
        assert_eq!(got[1], None);
        assert_eq!(got[3], Some(vec![-1.0, 0.5, 0.0]));
    }

    #[test]
    fn bad_files_are_errors_naming_file_tensor_and_problem() {
        type Tensors<'a> = Vec<(&'a str, GgmlType, Vec<f32>)>;
        let cases: [(&str, Tensors, &str); 5] = [
            (
                "name",
                vec![("steer.1", GgmlType::F32, vec![0.0; 3])],
                "steer.1: expected names direction.N",
            ),
            (
                "zero",
                vec![("direction.0", GgmlType::F32, vec![0.0; 3])],
                "layer 0 is outside 1..3",
            ),
            (
                "high",
                vec![("direction.4", GgmlType::F32, vec![0.0; 3])],
                "layer 4 is outside 1..3",
            ),
            (
                "type",
                vec![("direction.1", GgmlType::F16, vec![0.0; 4])],
                "type F16, expected F32",
            ),
            (
                "width",
                vec![("direction.2", GgmlType::F32, vec![0.0; 5])],
                "shape [5], expected [3]",
            ),
        ];
        for (tag, tensors, want) in cases {
            let p = write(tag, &tensors);
            let e = format!("{:#}", load(&[file(&p, 1.0)], 4, 3, None).unwrap_err());
            assert!(
                e.contains(want) && e.contains(&*p.to_string_lossy()),
                "{tag}: {e}"
            );
        }
        let empty = write("empty", &[]);
        let e = format!("{:#}", load(&[file(&empty, 1.0)], 4, 3, None).unwrap_err());
        assert!(e.contains("no direction tensors"), "{e}");
        let missing = Path::new("/nonexistent/cvec.gguf");
        let e = format!("{:#}", load(&[file(missing, 1.0)], 4, 3, None).unwrap_err());
        assert!(e.contains("/nonexistent/cvec.gguf"), "{e}");
        let ok = write("ok", &[("direction.1", GgmlType::F32, vec![0.0; 3])]);
        let e = format!(
            "{:#}",
            load(&[file(&ok, f32::NAN)], 4, 3, None).unwrap_err()
        );
        assert!(e.contains("not finite"), "{e}");
        let e = format!(
            "{:#}",
            load(&[file(&ok, 1.0)], 4, 3, Some((3, 2))).unwrap_err()
        );
        assert!(e.contains("layer range 3..=2"), "{e}");
    }
}
