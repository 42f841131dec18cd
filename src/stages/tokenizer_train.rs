//! `tokenizer_train`: a byte-level BPE tokenizer trained with the `tokenizers` crate on a prompts
//! artifact (problem text and reference solution of every row), saved as `tokenizer.json` (plus a
//! small `tokenizer_config.json` naming the special tokens and a chat template, so the directory
//! drops into a Hugging Face checkpoint).
//!
//! Byte-level means every UTF-8 string round-trips; no prefix space is added (as in Qwen2).
//! Special tokens come first, with fixed ids 0..=4: `<|endoftext|>`, `<|im_start|>`,
//! `<|im_end|>`, `<think>`, `</think>`. The output is a pure function of the corpus and params:
//! the trainer counts words exactly and breaks merge ties by token id, and the saved vocabulary
//! is ordered by id (a test checks the bytes).

use anyhow::{anyhow, bail, Context};
use serde_json::json;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use crate::prompt_text::prompt_text;
use crate::artifact::rows::PromptRow;
use crate::artifact::{read_rows, Schema};
use crate::credit::thinking::{THINK_CLOSE, THINK_OPEN};
use crate::engine::{Builtin, Executable, StageContext};

/// Special tokens in id order.
pub const SPECIAL_TOKENS: [&str; 5] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
];

/// The thinking markers among [`SPECIAL_TOKENS`] (reserved ids, kept in decoded text).
const THINK_TOKENS: [&str; 2] = [THINK_OPEN, THINK_CLOSE];

/// ChatML template (the Qwen2 chat format without a default system prompt).
const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The training texts of a prompts artifact: each row's problem text, then its solution if any.
pub fn corpus(rows: &[PromptRow]) -> Vec<String> {
    let mut out = Vec::with_capacity(rows.len() * 2);
    for r in rows {
        out.push(prompt_text(&r.prompt));
        if let Some(s) = r.solution.as_ref().filter(|s| !s.is_empty()) {
            out.push(s.clone());
        }
    }
    out
}

/// Train a byte-level BPE with at most `vocab_size` tokens (specials and the 256 byte symbols
/// included) on `texts`; pairs seen fewer than `min_frequency` times are not merged.
pub fn train(texts: &[String], vocab_size: usize, min_frequency: u64) -> anyhow::Result<Tokenizer> {
    let floor = 256 + SPECIAL_TOKENS.len();
    if vocab_size < floor {
        bail!("tokenizer_train: vocab_size {vocab_size} is below {floor} (256 byte symbols + {} special tokens)", SPECIAL_TOKENS.len());
    }
    // `<think>`/`</think>` are single tokens that are not "special" when decoding, as in Qwen3: a
    // completion's text keeps its thinking markers (so an answer can be found after them).
    let specials: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(*t, !THINK_TOKENS.contains(t)))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(min_frequency)
        .special_tokens(specials.clone())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let byte_level = ByteLevel::new(false, true, true);
    let mut tok = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default())
    .with_normalizer(None)
    .with_pre_tokenizer(Some(byte_level.into()))
    .with_post_processor(Some(byte_level.into()))
    .with_decoder(Some(byte_level.into()))
    .build()
    .map_err(|e| anyhow!("tokenizer_train: building the tokenizer: {e}"))?;
    // Registered before training so special tokens in the corpus are never split into merges.
    let (think, control): (Vec<AddedToken>, Vec<AddedToken>) = specials.iter().cloned().partition(|t| !t.special);
    tok.add_special_tokens(&control);
    tok.add_tokens(&think);
    tok.train(&mut trainer, texts.iter())
        .map_err(|e| anyhow!("tokenizer_train: training: {e}"))?;
    Ok(Tokenizer::from(tok))
}

fn config_json() -> String {
    let v = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": null,
        "add_prefix_space": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": 32768,
        "chat_template": CHAT_TEMPLATE,
    });
    serde_json::to_string_pretty(&v).expect("json") + "\n"
}

/// The stage's params (stages/tokenizer_train.toml documents them); unknown or mistyped ones are errors naming
/// the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenizerParams {
    vocab_size: usize,
    min_frequency: u64,
}

pub const STAGE: Builtin = Builtin { name: "tokenizer_train", version: "2", runs_in: Executable::Engine, run };

/// Stage `tokenizer_train`: input `corpus` (prompts), output `tokenizer` (dir).
pub fn run(ctx: &mut StageContext) -> anyhow::Result<()> {
    let TokenizerParams { vocab_size, min_frequency } = ctx.params()?;
    let input = ctx.input("corpus")?.to_path_buf();
    let rows: Vec<PromptRow> = read_rows(&input, Schema::Prompts)?;
    let texts = corpus(&rows);
    if texts.is_empty() {
        bail!("{}: no rows to train a tokenizer on", input.display());
    }
    let tok = train(&texts, vocab_size, min_frequency)?;
    let out = ctx.output("tokenizer")?.to_path_buf();
    let json = tok
        .to_string(false)
        .map_err(|e| anyhow!("tokenizer_train: serializing: {e}"))?;
    std::fs::write(out.join("tokenizer.json"), json)
        .with_context(|| format!("{}: writing tokenizer.json", out.display()))?;
    std::fs::write(out.join("tokenizer_config.json"), config_json())
        .with_context(|| format!("{}: writing tokenizer_config.json", out.display()))?;

    let mut n_tokens = 0usize;
    let mut n_bytes = 0usize;
    for t in &texts {
        n_tokens += tok
            .encode(t.as_str(), false)
            .map_err(|e| anyhow!("tokenizer_train: encoding: {e}"))?
            .len();
        n_bytes += t.len();
    }
    ctx.count("corpus_texts", texts.len() as i64);
    ctx.metric("vocab_size", tok.get_vocab_size(true));
    ctx.metric("corpus_bytes", n_bytes);
    ctx.metric("corpus_tokens", n_tokens);
    ctx.metric(
        "bytes_per_token",
        (n_bytes as f64 / n_tokens.max(1) as f64 * 1000.0).round() / 1000.0,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stages::taskgen::{splits, Knobs};

    fn texts() -> Vec<String> {
        let k = Knobs {
            min_steps: 2,
            max_steps: 4,
            max_operand: 20,
            max_value: 200,
            distractors: 1,
            word_fraction: 0.5,
        };
        let (train, _) = splits(0, &k, 400, 10).unwrap();
        train
            .iter()
            .flat_map(|p| [p.text.clone(), p.solution.clone()])
            .collect()
    }

    #[test]
    fn training_is_deterministic_and_respects_vocab_size() {
        let t = texts();
        let a = train(&t, 400, 2).unwrap().to_string(false).unwrap();
        let b = train(&t, 400, 2).unwrap().to_string(false).unwrap();
        assert_eq!(a, b);
        let tok = train(&t, 400, 2).unwrap();
        assert_eq!(tok.get_vocab_size(true), 400);
        for (i, s) in SPECIAL_TOKENS.iter().enumerate() {
            assert_eq!(tok.token_to_id(s), Some(i as u32), "{s}");
        }
        assert!(train(&t, 100, 2).is_err());
    }

    #[test]
    fn round_trip_is_lossless_and_specials_are_single_tokens() {
        let tok = train(&texts(), 400, 2).unwrap();
        let samples = [
            "Mia has 12 apples. Mia buys 5 more apples. How many apples does Mia have now?",
            "Add 5: 12 + 5 = 17\nThe answer is 17.",
            "Unseen text: Ünïcødé ✓ 漢字 tabs\tand  double  spaces\n\n",
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n2+2=4\n</think>\n4<|im_end|>",
        ];
        for s in samples {
            let enc = tok.encode(s, false).unwrap();
            assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), s);
        }
        let enc = tok
            .encode("<|im_start|>user<think>x</think><|im_end|>", false)
            .unwrap();
        assert_eq!(enc.get_ids()[0], 1);
        assert!(enc.get_ids().contains(&3) && enc.get_ids().contains(&4));
        assert_eq!(*enc.get_ids().last().unwrap(), 2);
        // Decoded text drops the chat markers but keeps the thinking ones (as Qwen3's does).
        assert_eq!(tok.decode(enc.get_ids(), true).unwrap(), "user<think>x</think>");
        // The learned merges compress the training language.
        let n = tok.encode(samples[1], false).unwrap().len();
        assert!(
            n < samples[1].len() / 2,
            "{n} tokens for {} bytes",
            samples[1].len()
        );
    }

    #[test]
    fn saved_file_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let tok = train(&texts(), 300, 2).unwrap();
        std::fs::write(
            dir.path().join("tokenizer.json"),
            tok.to_string(false).unwrap(),
        )
        .unwrap();
        let back = crate::tokenizer_file::load(dir.path()).unwrap();
        let s = "Divide by 3: 18 / 3 = 6";
        assert_eq!(
            back.encode(s, false).unwrap().get_ids(),
            tok.encode(s, false).unwrap().get_ids()
        );
        let err = crate::tokenizer_file::load(&dir.path().join("nope.json")).unwrap_err().to_string();
        assert!(err.contains("nope.json"), "{err}");
        let gguf = dir.path().join("model.Q4_1.gguf");
        std::fs::write(&gguf, b"GGUF\x03\x00\x00\x00").unwrap();
        let err = crate::tokenizer_file::load(&gguf).unwrap_err().to_string();
        assert!(
            err.contains("model.Q4_1.gguf") && err.contains("tokenizer.json"),
            "{err}"
        );
    }
}
