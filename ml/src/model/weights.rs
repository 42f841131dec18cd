//! Hugging Face checkpoint I/O: `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`) into a [`DecoderLm`]'s `VarStore`, and the reverse.
//!
//! Every tensor is checked by name and shape; a missing, unexpected or misshapen tensor is an
//! error naming the file and the tensor. Float16/bfloat16 files are converted to the model dtype.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tch::{Kind, Tensor};

use super::decoder::DecoderLm;
use super::error::{ModelError, Result, TorchCtx};

/// Tensors in checkpoints that carry no weights we need (buffers of old exports).
fn ignorable(name: &str, tied: bool) -> bool {
    name.ends_with("rotary_emb.inv_freq") || (tied && name == "lm_head.weight")
}

/// The safetensors files of a checkpoint directory, in a stable order.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::config(&index, e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::config(&index, "missing object `weight_map`"))?;
    let mut files: Vec<String> = map
        .values()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect();
    files.sort();
    files.dedup();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// Converts a safetensors view to a float32 CPU tensor.
fn to_tensor(path: &Path, name: &str, view: &TensorView<'_>) -> Result<Tensor> {
    Ok(host_tensor(path, name, view)?.to_kind(Kind::Float))
}

/// A safetensors view as a CPU tensor of its own dtype (float32, float16, bfloat16, float64).
pub(crate) fn host_tensor(path: &Path, name: &str, view: &TensorView<'_>) -> Result<Tensor> {
    let kind = match view.dtype() {
        Dtype::F32 => Kind::Float,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F64 => Kind::Double,
        other => {
            return Err(ModelError::Tensor {
                path: path.into(),
                tensor: name.into(),
                msg: format!("unsupported dtype {other:?}"),
            })
        }
    };
    let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
    // host: `assign` copies it into the variable, on the model's device.
    Ok(Tensor::from_data_size(view.data(), &shape, kind))
}

/// Copies `src` into the variable `name` of `model`, checking the shape.
pub(crate) fn assign(
    vars: &HashMap<String, Tensor>,
    path: &Path,
    name: &str,
    src: &Tensor,
) -> Result<()> {
    let Some(dst) = vars.get(name) else {
        return Err(ModelError::UnexpectedTensor {
            path: path.into(),
            tensor: name.into(),
            arch: "this".into(),
        });
    };
    if dst.size() != src.size() {
        return Err(ModelError::Shape {
            path: path.into(),
            tensor: name.into(),
            expected: dst.size(),
            found: src.size(),
        });
    }
    let mut dst = dst.shallow_clone();
    tch::no_grad(|| dst.f_copy_(&src.to_device(dst.device()).to_kind(dst.kind())))
        .ctx(format!("{}: copying {name}", path.display()))
}

/// A safetensors file mapped into memory: its tensors are read from the page cache as they are
/// copied out, one at a time, so host memory never holds the whole file a second time.
pub fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    let f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the map is only read. Checkpoints are not written in place: the store's files never
    // change after their commit, and a `file:` input was hashed just before the stage ran. A file
    // truncated by another process while mapped would fault (SIGBUS) instead of failing the read.
    unsafe { memmap2::Mmap::map(&f) }.map_err(|e| ModelError::io(path, e))
}

/// Loads the weights of a Hugging Face checkpoint directory into `model`.
pub fn load_safetensors_dir(model: &mut DecoderLm, dir: &Path) -> Result<()> {
    let vars = model.vs.variables();
    let tied = model.cfg.tie_word_embeddings;
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for file in safetensors_files(dir)? {
        let bytes = map_file(&file)?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| ModelError::Safetensors {
            path: file.clone(),
            msg: e.to_string(),
        })?;
        for (name, view) in st.tensors() {
            if ignorable(&name, tied) {
                continue;
            }
            if !vars.contains_key(&name) {
                return Err(ModelError::UnexpectedTensor {
                    path: file.clone(),
                    tensor: name,
                    arch: model.cfg.arch.hf_class().into(),
                });
            }
            let t = to_tensor(&file, &name, &view)?;
            assign(&vars, &file, &name, &t)?;
            seen.insert(name, file.clone());
        }
    }
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in names {
        if !seen.contains_key(name) {
            return Err(ModelError::MissingTensor {
                path: dir.into(),
                tensor: name.clone(),
            });
        }
    }
    Ok(())
}

/// Writes `model.safetensors` (float32, or the model's dtype) and `config.json` into `dir`
/// (created if needed). Tied embeddings are written once, as `transformers` does.
pub fn save_hf(model: &DecoderLm, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let vars = model.vs.variables();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    let views: Vec<(String, HostView)> = names.into_iter().map(|n| (n.clone(), HostView::new(&vars[n]))).collect();
    let file = dir.join("model.safetensors");
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::tensor::serialize_to_file(views, Some(meta), &file).map_err(|e| {
        ModelError::Safetensors {
            path: file.clone(),
            msg: e.to_string(),
        }
    })?;
    let cfg_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&model.cfg.to_hf_json()).expect("json value");
    std::fs::write(&cfg_path, text).map_err(|e| ModelError::io(&cfg_path, e))?;
    Ok(())
}

/// A tensor as safetensors writes it: its bytes are copied to the host when the writer asks for
/// them, one tensor at a time, so saving never holds a second copy of the whole model (tch's own
/// view does the same, but is private). bf16/f16 stay as they are, every other kind is float32.
struct HostView {
    tensor: Tensor,
    dtype: Dtype,
    shape: Vec<usize>,
}

impl HostView {
    fn new(t: &Tensor) -> HostView {
        let (kind, dtype) = match t.kind() {
            Kind::BFloat16 => (Kind::BFloat16, Dtype::BF16),
            Kind::Half => (Kind::Half, Dtype::F16),
            _ => (Kind::Float, Dtype::F32),
        };
        let shape = t.size().iter().map(|&d| d as usize).collect();
        HostView { tensor: t.detach().to_kind(kind), dtype, shape }
    }
}

impl safetensors::View for HostView {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        let t = self.tensor.to_device(tch::Device::Cpu).contiguous();
        let numel = t.numel();
        let mut bytes = vec![0u8; self.data_len()];
        t.f_copy_data_u8(&mut bytes, numel).expect("a host tensor of the view's size");
        bytes.into()
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Arch;
    use crate::model::score::tests::tiny_model;

    fn variables(m: &DecoderLm) -> BTreeMap<String, Tensor> {
        m.vs.variables().into_iter().map(|(n, t)| (n, t.detach().to_kind(Kind::Float))).collect()
    }

    /// Saved one tensor at a time and loaded through a memory map, every weight comes back
    /// bit for bit: float32 as it was, bfloat16 kept as bfloat16 in the file.
    #[test]
    fn a_saved_checkpoint_loads_back_bit_for_bit_in_f32_and_bf16() {
        for (arch, kind, dtype) in [(Arch::Qwen2, Kind::Float, Dtype::F32), (Arch::Llama, Kind::BFloat16, Dtype::BF16)] {
            let mut m = tiny_model(arch, 5);
            m.set_kind(kind);
            let dir = tempfile::tempdir().unwrap();
            save_hf(&m, dir.path()).unwrap();
            let bytes = map_file(&dir.path().join("model.safetensors")).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            assert!(st.tensors().iter().all(|(_, v)| v.dtype() == dtype), "{arch:?}: every tensor stored as {dtype:?}");
            let mut back = DecoderLm::new(&m.cfg, tch::Device::Cpu);
            load_safetensors_dir(&mut back, dir.path()).unwrap();
            let (want, got) = (variables(&m), variables(&back));
            assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>());
            for (name, w) in &want {
                assert!(w.equal(&got[name]), "{arch:?} {kind:?}: {name} differs after save and load");
            }
        }
    }
}
