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
    Ok(Tensor::from_data_size(view.data(), &shape, kind).to_kind(Kind::Float))
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

/// Loads the weights of a Hugging Face checkpoint directory into `model`.
pub fn load_safetensors_dir(model: &mut DecoderLm, dir: &Path) -> Result<()> {
    let vars = model.vs.variables();
    let tied = model.cfg.tie_word_embeddings;
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for file in safetensors_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| ModelError::io(&file, e))?;
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
    let mut owned: Vec<(String, Vec<u8>, Vec<usize>, Dtype)> = Vec::new();
    for name in names {
        let t = vars[name].detach().to_device(tch::Device::Cpu).contiguous();
        let (t, dtype) = match t.kind() {
            Kind::BFloat16 => (t, Dtype::BF16),
            Kind::Half => (t, Dtype::F16),
            _ => (t.to_kind(Kind::Float), Dtype::F32),
        };
        let numel = t.numel();
        let mut data = vec![0u8; numel * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut data, numel)
            .ctx(format!("saving {name}"))?;
        let shape = t.size().iter().map(|&d| d as usize).collect();
        owned.push((name.clone(), data, shape, dtype));
    }
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, dt)| {
            TensorView::new(*dt, s.clone(), d)
                .map(|v| (n.clone(), v))
                .map_err(|e| ModelError::Safetensors {
                    path: dir.join("model.safetensors"),
                    msg: format!("{n}: {e}"),
                })
        })
        .collect::<Result<_>>()?;
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
