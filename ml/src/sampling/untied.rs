//! An untied view of a tied-embedding checkpoint, for vLLM's in-place reload (`reload = "vllm"`).
//!
//! vLLM 0.32's `reload_weights` loads a checkpoint whose output head is its input embedding
//! (`tie_word_embeddings`) wrong: measured on its CPU build, the tiny policy then sampled 0.54 nats
//! per token (mean) away from the checkpoint it said it had loaded, while untied copies of the
//! same checkpoints reloaded exactly. Read in vLLM's code: the CPU build packs a linear layer's
//! weight for oneDNN after loading it, and the reload (`model_loader/reload/layerwise.py`) packs
//! again only the layers it loaded weights into; a tied head loads none, so it keeps the first
//! checkpoint's packed copy (`bench/vllm_tied_reload.py`: packing it again makes the reloaded
//! engine sample the new checkpoint exactly). On a GPU the head reads the shared tensor and should reload right
//! (not measured); the view is given there too, as the stage cannot tell the engine's device.
//! Qwen2.5-0.5B/1.5B, Qwen3's small models and SmolLM2 all tie their embeddings.
//!
//! So the engine is given a view in which the head is a tensor of its own: a directory of symbolic
//! links to the checkpoint's files, with `config.json` saying `tie_word_embeddings: false` and
//! `lm_head.safetensors` holding a copy of the embedding as `lm_head.weight` (added to the index of
//! a sharded checkpoint). Its logits are the checkpoint's; the engine builds an `lm_head` of its
//! own, which each reload then overwrites. The model core never reads the view.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::SafeTensors;
use serde_json::Value;

use crate::model::weights::{map_file, safetensors_files};

const CONFIG: &str = "config.json";
const INDEX: &str = "model.safetensors.index.json";
const HEAD_FILE: &str = "lm_head.safetensors";
const HEAD: &str = "lm_head.weight";

/// The directory to give the engine for `checkpoint`: the checkpoint itself when its head is
/// untied already, else its untied view written at `dest` (a directory not yet there).
pub fn engine_checkpoint(checkpoint: &Path, dest: &Path) -> Result<PathBuf> {
    let config_path = checkpoint.join(CONFIG);
    let text = std::fs::read_to_string(&config_path).with_context(|| format!("reading {}", config_path.display()))?;
    let mut config: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config_path.display()))?;
    let files = engine_weight_files(checkpoint)?;
    let (mut embedding, mut has_head) = (None, false);
    for file in &files {
        let bytes = map_file(file)?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).with_context(|| format!("{}: not a safetensors file", file.display()))?;
        for name in meta.tensors().keys() {
            has_head |= name == HEAD;
            if name.ends_with("embed_tokens.weight") && embedding.is_none() {
                embedding = Some((file.clone(), name.clone()));
            }
        }
    }
    let tied = config.get("tie_word_embeddings").and_then(Value::as_bool) != Some(false);
    if !tied && has_head {
        return Ok(checkpoint.to_path_buf());
    }
    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    for entry in std::fs::read_dir(checkpoint).with_context(|| format!("listing {}", checkpoint.display()))? {
        let name = entry?.file_name();
        if name != CONFIG && name != INDEX {
            let link = dest.join(&name);
            std::os::unix::fs::symlink(checkpoint.join(&name), &link).with_context(|| format!("linking {}", link.display()))?;
        }
    }
    config["tie_word_embeddings"] = Value::Bool(false);
    write_json(&dest.join(CONFIG), &config)?;
    if !has_head {
        let Some((file, name)) = embedding else {
            bail!("{}: no `embed_tokens.weight` to give the engine as its `{HEAD}`", checkpoint.display());
        };
        let bytes = map_file(&file)?;
        let st = SafeTensors::deserialize(&bytes).with_context(|| format!("{}: not a safetensors file", file.display()))?;
        let view = st.tensor(&name)?;
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let out = dest.join(HEAD_FILE);
        safetensors::serialize_to_file([(HEAD, view)], Some(meta), &out).with_context(|| format!("writing {}", out.display()))?;
    }
    let index_path = checkpoint.join(INDEX);
    if index_path.exists() {
        let text = std::fs::read_to_string(&index_path).with_context(|| format!("reading {}", index_path.display()))?;
        let mut index: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", index_path.display()))?;
        if !has_head {
            index["weight_map"][HEAD] = Value::String(HEAD_FILE.into());
        }
        write_json(&dest.join(INDEX), &index)?;
    }
    Ok(dest.to_path_buf())
}

/// The weight files an engine reads from `dir`: those of its index, else every `*.safetensors`
/// (as vLLM's loader globs them).
fn engine_weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join(INDEX).exists() {
        return Ok(safetensors_files(dir)?);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)?).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::score::tests::tiny_model;
    use crate::model::{weights, Arch, DecoderLm};

    /// A tiny tied checkpoint as `save_hf` writes it, plus a tokenizer file to be linked.
    fn tied_checkpoint(dir: &Path) -> DecoderLm {
        let model = tiny_model(Arch::Qwen2, 7);
        assert!(model.cfg.tie_word_embeddings);
        weights::save_hf(&model, dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        model
    }

    #[test]
    fn a_tied_checkpoint_gets_a_view_with_a_head_of_its_own_and_the_same_logits() {
        let tmp = tempfile::tempdir().unwrap();
        let ckpt = tmp.path().join("ckpt");
        let model = tied_checkpoint(&ckpt);
        let view = engine_checkpoint(&ckpt, &tmp.path().join("view")).unwrap();
        assert_eq!(view, tmp.path().join("view"));
        let config: Value = serde_json::from_str(&std::fs::read_to_string(view.join(CONFIG)).unwrap()).unwrap();
        assert_eq!(config["tie_word_embeddings"], Value::Bool(false));
        assert!(std::fs::symlink_metadata(view.join("tokenizer.json")).unwrap().file_type().is_symlink());
        assert!(std::fs::symlink_metadata(view.join("model.safetensors")).unwrap().file_type().is_symlink());
        // The view loads as an untied model whose head is the embedding: the same logits.
        let mut untied_cfg = model.cfg.clone();
        untied_cfg.tie_word_embeddings = false;
        let mut untied = DecoderLm::new(&untied_cfg, tch::Device::Cpu);
        let head = view.join(HEAD_FILE);
        let bytes = std::fs::read(&head).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.names(), vec![HEAD]);
        // Our loader reads one model.safetensors; give it the view's two files as shards.
        let shards = tmp.path().join("shards");
        std::fs::create_dir(&shards).unwrap();
        std::fs::copy(view.join("model.safetensors"), shards.join("model-1.safetensors")).unwrap();
        std::fs::copy(&head, shards.join(HEAD_FILE)).unwrap();
        let map = serde_json::json!({"weight_map": {"a": "model-1.safetensors", HEAD: HEAD_FILE}});
        std::fs::write(shards.join(INDEX), map.to_string()).unwrap();
        weights::load_safetensors_dir(&mut untied, &shards).unwrap();
        let ids = tch::Tensor::from_slice(&[1i64, 5, 9, 3]).unsqueeze(0);
        let (a, b) = (model.forward(&ids, None, None).unwrap(), untied.forward(&ids, None, None).unwrap());
        assert_eq!(f64::try_from((a - b).abs().max()).unwrap(), 0.0);
    }

    #[test]
    fn an_untied_checkpoint_is_given_as_it_is_and_a_sharded_one_gets_its_index_extended() {
        let tmp = tempfile::tempdir().unwrap();
        let ckpt = tmp.path().join("ckpt");
        tied_checkpoint(&ckpt);
        // Untied already (the view of a view): the checkpoint itself, nothing written.
        let view = engine_checkpoint(&ckpt, &tmp.path().join("view")).unwrap();
        let again = engine_checkpoint(&view, &tmp.path().join("view2")).unwrap();
        assert_eq!(again, view);
        assert!(!tmp.path().join("view2").exists());
        // Sharded: the index names the head's file.
        let sharded = tmp.path().join("sharded");
        std::fs::create_dir(&sharded).unwrap();
        std::fs::rename(ckpt.join("model.safetensors"), sharded.join("model-00001-of-00001.safetensors")).unwrap();
        std::fs::copy(ckpt.join(CONFIG), sharded.join(CONFIG)).unwrap();
        let bytes = std::fs::read(sharded.join("model-00001-of-00001.safetensors")).unwrap();
        let names: serde_json::Map<String, Value> = SafeTensors::deserialize(&bytes).unwrap().names().into_iter().map(|n| (n.to_string(), Value::from("model-00001-of-00001.safetensors"))).collect();
        std::fs::write(sharded.join(INDEX), serde_json::json!({ "weight_map": names }).to_string()).unwrap();
        let view = engine_checkpoint(&sharded, &tmp.path().join("sview")).unwrap();
        let index: Value = serde_json::from_str(&std::fs::read_to_string(view.join(INDEX)).unwrap()).unwrap();
        assert_eq!(index["weight_map"][HEAD], Value::from(HEAD_FILE));
        assert_eq!(index["weight_map"]["model.embed_tokens.weight"], Value::from("model-00001-of-00001.safetensors"));
        assert!(view.join(HEAD_FILE).exists());
    }
}
