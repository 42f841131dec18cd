//! GGUF (llama.cpp) model files: header and metadata parsing, dequantization of
//! F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K tensors to float32 on load, mapping of llama.cpp tensor
//! names to Hugging Face names, and a byte-level BPE tokenizer built from the metadata.
//!
//! Block layouts follow ggml (`ggml-common.h`, `ggml-quants.c`) and PyPI `gguf`'s
//! `quants.py`, which the tests use as the reference. llama-architecture files store the rows of
//! `attn_q`/`attn_k` permuted for llama.cpp's RoPE; they are un-permuted with
//! [`super::llama::unpermute_qk`] so the weights equal the Hugging Face ones.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::{Device, Tensor};

use super::config::{Arch, ModelConfig};
use super::decoder::DecoderLm;
use super::error::{ModelError, Result};
use super::tokenizer::Tokenizer;
use super::weights::assign;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the fastest-varying (columns).
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub offset: u64,
}

/// A parsed GGUF file (the bytes are kept; tensors are dequantized on demand).
#[derive(Debug)]
pub struct GgufFile {
    pub path: PathBuf,
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    data_start: usize,
    bytes: Vec<u8>,
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.pos + n > self.b.len() {
            return Err(ModelError::gguf(
                self.path,
                format!("truncated at byte {}", self.pos),
            ));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u64()? as usize;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| ModelError::gguf(self.path, "non-UTF-8 string"))
    }
    fn value(&mut self, ty: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::Int(self.take(1)?[0] as i64),
            1 => Value::Int(self.take(1)?[0] as i8 as i64),
            2 => Value::Int(u16::from_le_bytes(self.take(2)?.try_into().expect("2")) as i64),
            3 => Value::Int(i16::from_le_bytes(self.take(2)?.try_into().expect("2")) as i64),
            4 => Value::Int(self.u32()? as i64),
            5 => Value::Int(self.u32()? as i32 as i64),
            6 => Value::Float(f32::from_le_bytes(self.take(4)?.try_into().expect("4")) as f64),
            7 => Value::Bool(self.take(1)?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => {
                let inner = self.u32()?;
                let n = self.u64()? as usize;
                let mut v = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    v.push(self.value(inner)?);
                }
                Value::Array(v)
            }
            10 => Value::Int(self.u64()? as i64),
            11 => Value::Int(self.u64()? as i64),
            12 => Value::Float(f64::from_le_bytes(self.take(8)?.try_into().expect("8"))),
            t => {
                return Err(ModelError::gguf(
                    self.path,
                    format!("unknown metadata value type {t}"),
                ))
            }
        })
    }
}

/// (name, block size in elements, block size in bytes) of the ggml types we read.
fn ggml_type(t: u32) -> Option<(&'static str, usize, usize)> {
    Some(match t {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        30 => ("BF16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        8 => ("Q8_0", 32, 34),
        12 => ("Q4_K", 256, 144),
        14 => ("Q6_K", 256, 210),
        _ => return None,
    })
}

fn ggml_type_name(t: u32) -> &'static str {
    const NAMES: [&str; 31] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    NAMES.get(t as usize).copied().unwrap_or("unknown")
}

/// IEEE half to f32.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // subnormal: normalise
            let mut e = 127 - 15 + 1;
            let mut f = f;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((f & 0x3ff) << 13)
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 127 - 15) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

fn h(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Dequantizes `n` elements of ggml type `t` from `data` (exactly `n / block * bytes` bytes).
pub fn dequantize(t: u32, data: &[u8], n: usize) -> Option<Vec<f32>> {
    let (_, bs, bb) = ggml_type(t)?;
    let mut out = Vec::with_capacity(n);
    match t {
        0 => out.extend(
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4"))),
        ),
        1 => out.extend(
            data.chunks_exact(2)
                .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))),
        ),
        30 => out.extend(
            data.chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)),
        ),
        _ => {
            for blk in data.chunks_exact(bb).take(n / bs) {
                dequant_block(t, blk, &mut out);
            }
        }
    }
    (out.len() == n).then_some(out)
}

fn dequant_block(t: u32, b: &[u8], out: &mut Vec<f32>) {
    match t {
        // Q4_0: d:f16, qs[16]; x = (nibble - 8) * d; low nibbles first, then high.
        2 => {
            let d = h(b, 0);
            let qs = &b[2..18];
            out.extend(qs.iter().map(|q| ((q & 0xf) as i32 - 8) as f32 * d));
            out.extend(qs.iter().map(|q| ((q >> 4) as i32 - 8) as f32 * d));
        }
        // Q4_1: d:f16, m:f16, qs[16]; x = nibble * d + m.
        3 => {
            let (d, m) = (h(b, 0), h(b, 2));
            let qs = &b[4..20];
            out.extend(qs.iter().map(|q| (q & 0xf) as f32 * d + m));
            out.extend(qs.iter().map(|q| (q >> 4) as f32 * d + m));
        }
        // Q8_0: d:f16, qs[32] i8; x = q * d.
        8 => {
            let d = h(b, 0);
            out.extend(b[2..34].iter().map(|&q| (q as i8) as f32 * d));
        }
        // Q4_K: d:f16, dmin:f16, scales[12] (6-bit scale/min pairs), qs[128].
        12 => {
            let (d, dmin) = (h(b, 0), h(b, 2));
            let sc = &b[4..16];
            let qs = &b[16..144];
            let scale_min = |j: usize| -> (f32, f32) {
                if j < 4 {
                    ((sc[j] & 63) as f32, (sc[j + 4] & 63) as f32)
                } else {
                    (
                        ((sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4)) as f32,
                        ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)) as f32,
                    )
                }
            };
            for (k, q) in qs.chunks_exact(32).enumerate() {
                let (s1, m1) = scale_min(2 * k);
                let (s2, m2) = scale_min(2 * k + 1);
                out.extend(q.iter().map(|&x| d * s1 * (x & 0xf) as f32 - dmin * m1));
                out.extend(q.iter().map(|&x| d * s2 * (x >> 4) as f32 - dmin * m2));
            }
        }
        // Q6_K: ql[128], qh[64], scales[16] i8, d:f16.
        14 => {
            let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = h(b, 208);
            for half in 0..2 {
                let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
                let mut y = [0f32; 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
                out.extend_from_slice(&y);
            }
        }
        _ => unreachable!("checked by ggml_type"),
    }
}

impl GgufFile {
    /// Reads and parses a GGUF file (version 2 or 3).
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
        let mut r = Reader {
            b: &bytes,
            pos: 0,
            path,
        };
        if r.take(4)? != b"GGUF" {
            return Err(ModelError::gguf(path, "bad magic (not a GGUF file)"));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(ModelError::gguf(
                path,
                format!("unsupported GGUF version {version}"),
            ));
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let k = r.string()?;
            let ty = r.u32()?;
            let v = r.value(ty)?;
            metadata.insert(k, v);
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string()?;
            let nd = r.u32()?;
            let dims = (0..nd).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
            let ggml_type = r.u32()?;
            let offset = r.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let align = metadata
            .get("general.alignment")
            .and_then(Value::as_i64)
            .unwrap_or(32) as usize;
        let data_start = r.pos.div_ceil(align) * align;
        Ok(GgufFile {
            path: path.into(),
            metadata,
            tensors,
            data_start,
            bytes,
        })
    }

    fn meta(&self, key: &str) -> Result<&Value> {
        self.metadata
            .get(key)
            .ok_or_else(|| ModelError::gguf(&self.path, format!("missing metadata key {key}")))
    }

    fn meta_i64(&self, key: &str) -> Result<i64> {
        self.meta(key)?.as_i64().ok_or_else(|| {
            ModelError::gguf(&self.path, format!("metadata {key} is not an integer"))
        })
    }

    /// A tensor dequantized to float32, shaped in PyTorch order (reversed ggml dims).
    pub fn tensor(&self, info: &TensorInfo) -> Result<Tensor> {
        let Some((_, bs, bb)) = ggml_type(info.ggml_type) else {
            return Err(ModelError::UnsupportedQuant {
                path: self.path.clone(),
                tensor: info.name.clone(),
                ggml_type: info.ggml_type,
                name: ggml_type_name(info.ggml_type),
            });
        };
        let n: u64 = info.dims.iter().product();
        let n = n as usize;
        if !n.is_multiple_of(bs) {
            return Err(ModelError::Tensor {
                path: self.path.clone(),
                tensor: info.name.clone(),
                msg: format!("{n} elements is not a multiple of the block size {bs}"),
            });
        }
        let start = self.data_start + info.offset as usize;
        let len = n / bs * bb;
        let data = self
            .bytes
            .get(start..start + len)
            .ok_or_else(|| ModelError::Tensor {
                path: self.path.clone(),
                tensor: info.name.clone(),
                msg: "data extends past the end of the file".into(),
            })?;
        let v = dequantize(info.ggml_type, data, n).expect("type and length checked");
        let shape: Vec<i64> = info.dims.iter().rev().map(|&d| d as i64).collect();
        // host: `weights::assign` copies it into the variable, on the model's device.
        Ok(Tensor::from_slice(&v).view(shape.as_slice()))
    }

    /// The model configuration from `{arch}.*` metadata.
    pub fn config(&self) -> Result<ModelConfig> {
        let arch_name = self
            .meta("general.architecture")?
            .as_str()
            .unwrap_or("")
            .to_string();
        let arch =
            Arch::from_model_type(&arch_name).ok_or_else(|| ModelError::UnsupportedArch {
                path: self.path.clone(),
                arch: arch_name.clone(),
            })?;
        let k = |s: &str| format!("{arch_name}.{s}");
        let heads = self.meta_i64(&k("attention.head_count"))?;
        let hidden = self.meta_i64(&k("embedding_length"))?;
        let vocab = match self.metadata.get(&k("vocab_size")).and_then(Value::as_i64) {
            Some(v) => v,
            None => match self.meta("tokenizer.ggml.tokens")? {
                Value::Array(a) => a.len() as i64,
                _ => {
                    return Err(ModelError::gguf(
                        &self.path,
                        "tokenizer.ggml.tokens is not an array",
                    ))
                }
            },
        };
        let head_dim = self
            .metadata
            .get(&k("attention.key_length"))
            .and_then(Value::as_i64)
            .unwrap_or(hidden / heads);
        let tied = !self.tensors.iter().any(|t| t.name == "output.weight");
        let has = |n: &str| self.tensors.iter().any(|t| t.name == n);
        let eos = self
            .metadata
            .get("tokenizer.ggml.eos_token_id")
            .and_then(Value::as_i64);
        let cfg = ModelConfig {
            arch,
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: self.meta_i64(&k("feed_forward_length"))?,
            num_hidden_layers: self.meta_i64(&k("block_count"))?,
            num_attention_heads: heads,
            num_key_value_heads: self
                .metadata
                .get(&k("attention.head_count_kv"))
                .and_then(Value::as_i64)
                .unwrap_or(heads),
            head_dim,
            max_position_embeddings: self.meta_i64(&k("context_length"))?,
            rms_norm_eps: self
                .meta(&k("attention.layer_norm_rms_epsilon"))?
                .as_f64()
                .unwrap_or(1e-6),
            rope_theta: self
                .metadata
                .get(&k("rope.freq_base"))
                .and_then(Value::as_f64)
                .unwrap_or(10000.0),
            tie_word_embeddings: tied,
            qkv_bias: has("blk.0.attn_q.bias"),
            o_bias: has("blk.0.attn_output.bias"),
            mlp_bias: has("blk.0.ffn_up.bias"),
            bos_token_id: self
                .metadata
                .get("tokenizer.ggml.bos_token_id")
                .and_then(Value::as_i64),
            eos_token_ids: eos.into_iter().collect(),
            pad_token_id: self
                .metadata
                .get("tokenizer.ggml.padding_token_id")
                .and_then(Value::as_i64),
        };
        if arch == Arch::Qwen2 && !cfg.qkv_bias {
            return Err(ModelError::gguf(
                &self.path,
                "qwen2 file without attn_q.bias",
            ));
        }
        cfg.validate()
            .map_err(|m| ModelError::gguf(&self.path, m))?;
        Ok(cfg)
    }

    /// A byte-level BPE tokenizer from `tokenizer.ggml.*` (model `gpt2`).
    pub fn tokenizer(&self, eos_ids: Vec<i64>, template: super::ChatTemplate) -> Result<Tokenizer> {
        use tokenizers::models::bpe::BPE;
        use tokenizers::pre_tokenizers::{
            byte_level::ByteLevel,
            digits::Digits,
            sequence::Sequence,
            split::{Split, SplitPattern},
        };
        use tokenizers::SplitDelimiterBehavior;
        use tokenizers::{AddedToken, PreTokenizerWrapper};
        let model = self.meta("tokenizer.ggml.model")?.as_str().unwrap_or("");
        if model != "gpt2" {
            return Err(ModelError::Tokenizer {
                path: self.path.clone(),
                msg: format!("tokenizer.ggml.model {model:?} is not supported (only byte-level BPE \"gpt2\")"),
            });
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            match self.meta(key)? {
                Value::Array(a) => Ok(a
                    .iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()),
                _ => Err(ModelError::gguf(
                    &self.path,
                    format!("{key} is not an array"),
                )),
            }
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges: Vec<(String, String)> = strings("tokenizer.ggml.merges")?
            .into_iter()
            .filter_map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            })
            .collect();
        let types: Vec<i64> = match self.metadata.get("tokenizer.ggml.token_type") {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).collect(),
            _ => vec![],
        };
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::new(vocab, merges);
        let mut tok = tokenizers::Tokenizer::new(bpe);
        let pre = self
            .metadata
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .unwrap_or("default");
        // Pre-tokenizers of llama.cpp's `tokenizer.ggml.pre` values, as in the models' own
        // tokenizer.json files.
        let pre_tok: PreTokenizerWrapper = match pre {
            "default" | "gpt2" => ByteLevel::new(false, true, true).into(),
            // SmolLM2: digits split individually, then the GPT-2 regex.
            "smollm" => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            // Qwen2/Qwen3: their own split regex, then byte-level without the GPT-2 regex.
            "qwen2" => {
                let pat = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
                let split = Split::new(
                    SplitPattern::Regex(pat.to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| ModelError::Tokenizer {
                    path: self.path.clone(),
                    msg: e.to_string(),
                })?;
                Sequence::new(vec![
                    split.into(),
                    ByteLevel::new(false, false, false).into(),
                ])
                .into()
            }
            other => {
                return Err(ModelError::Tokenizer {
                    path: self.path.clone(),
                    msg: format!(
                        "tokenizer.ggml.pre {other:?} is not supported (smollm, qwen2, gpt2)"
                    ),
                })
            }
        };
        tok.with_pre_tokenizer(Some(pre_tok));
        tok.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(types.iter())
            .filter(|(_, &t)| t == 3 || t == 4)
            .map(|(s, _)| AddedToken::from(s.clone(), true))
            .collect();
        tok.add_special_tokens(&special);
        Ok(Tokenizer::from_inner(tok, template, eos_ids, &self.path))
    }
}

/// Hugging Face name of a llama.cpp tensor name.
pub fn hf_name(gguf: &str) -> Option<String> {
    if gguf == "token_embd.weight" {
        return Some("model.embed_tokens.weight".into());
    }
    if gguf == "output_norm.weight" {
        return Some("model.norm.weight".into());
    }
    if gguf == "output.weight" {
        return Some("lm_head.weight".into());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let (stem, kind) = part.rsplit_once('.')?;
    let hf = match stem {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// A model and tokenizer loaded from one GGUF file.
#[derive(Debug)]
pub struct GgufModel {
    pub model: DecoderLm,
    pub tokenizer: Tokenizer,
}

impl GgufModel {
    pub fn load(path: &Path, device: Device) -> Result<Self> {
        let f = GgufFile::open(path)?;
        let cfg = f.config()?;
        let model = DecoderLm::new(&cfg, device);
        let vars = model.vs.variables();
        let mut seen = std::collections::HashSet::new();
        for info in &f.tensors {
            let name = hf_name(&info.name).ok_or_else(|| ModelError::UnexpectedTensor {
                path: path.into(),
                tensor: info.name.clone(),
                arch: cfg.arch.hf_class().into(),
            })?;
            let mut t = f.tensor(info)?;
            if cfg.arch == Arch::Llama {
                if name.ends_with("q_proj.weight") {
                    t = super::llama::unpermute_qk(&t, cfg.num_attention_heads);
                } else if name.ends_with("k_proj.weight") {
                    t = super::llama::unpermute_qk(&t, cfg.num_key_value_heads);
                }
            }
            assign(&vars, path, &name, &t).map_err(|e| match e {
                ModelError::UnexpectedTensor { .. } => ModelError::UnexpectedTensor {
                    path: path.into(),
                    tensor: info.name.clone(),
                    arch: cfg.arch.hf_class().into(),
                },
                other => other,
            })?;
            seen.insert(name);
        }
        let mut missing: Vec<&String> = vars.keys().filter(|k| !seen.contains(*k)).collect();
        missing.sort();
        if let Some(m) = missing.first() {
            return Err(ModelError::MissingTensor {
                path: path.into(),
                tensor: (*m).clone(),
            });
        }
        let tokenizer =
            f.tokenizer(cfg.eos_token_ids.clone(), super::default_template(cfg.arch))?;
        Ok(GgufModel { model, tokenizer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    #[test]
    fn q8_0_and_q4_1_blocks() {
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&0x3800u16.to_le_bytes()); // d = 0.5
        for i in 0..32 {
            b[2 + i] = (i as i8 - 16) as u8;
        }
        let v = dequantize(8, &b, 32).unwrap();
        assert_eq!(v[0], -8.0);
        assert_eq!(v[31], 7.5);
        let mut q = vec![0u8; 20];
        q[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
        q[2..4].copy_from_slice(&0x4000u16.to_le_bytes()); // m = 2
        q[4] = 0x21;
        let v = dequantize(3, &q, 32).unwrap();
        assert_eq!((v[0], v[16], v[1]), (3.0, 4.0, 2.0));
        assert!(dequantize(3, &q, 31).is_none());
    }

    #[test]
    fn tensor_names_map_to_hf() {
        assert_eq!(
            hf_name("blk.3.attn_q.weight").unwrap(),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight").unwrap(),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(
            hf_name("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert!(hf_name("blk.0.ssm_conv.weight").is_none());
    }
}
