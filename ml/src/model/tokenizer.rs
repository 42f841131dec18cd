//! Tokenizer wrapper over the `tokenizers` crate, with the chat templates of the supported
//! model families written out in Rust (no Jinja at run time).
//!
//! - Qwen (ChatML): `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
//!   `<|im_start|>assistant\n` as generation prompt. For system/user conversations this is also
//!   Qwen3's template in thinking mode (`enable_thinking` true, its default): the model opens
//!   `<think>` itself.
//! - SmolLM2: ChatML with a default system message when the conversation has none.
//! - DeepSeek-R1-Distill (Qwen and Llama distills): `<｜begin▁of▁sentence｜>`, the system
//!   message, `<｜User｜>{content}` per user turn, and `<｜Assistant｜><think>\n` as generation
//!   prompt (the model starts inside its thinking). Picked by the vocabulary
//!   ([`ChatTemplate::for_vocab`]): R1 distills keep their base model's architecture.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{ModelError, Result};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The chat formats we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChatTemplate {
    /// Qwen2/Qwen3 ChatML (no default system message).
    Qwen,
    /// SmolLM2 ChatML with its default system message.
    SmolLm2,
    /// DeepSeek-R1-Distill: `<｜User｜>`/`<｜Assistant｜>` turns, generation opens `<think>\n`.
    R1Distill,
}

/// What Qwen3's template adds after the generation prompt when `enable_thinking` is false.
const QWEN3_NO_THINKING: &str = "<think>\n\n</think>\n\n";

/// SmolLM2's default system prompt (from its `chat_template`).
pub const SMOLLM2_SYSTEM: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// R1-distill's begin-of-sentence token (its template's `bos_token`).
pub const R1_BOS: &str = "<｜begin▁of▁sentence｜>";
const R1_USER: &str = "<｜User｜>";
const R1_ASSISTANT: &str = "<｜Assistant｜>";
const R1_EOS: &str = "<｜end▁of▁sentence｜>";

impl ChatTemplate {
    /// The template of a vocabulary: R1-distill's when it has `<｜Assistant｜>` (an R1 distill
    /// keeps its base's architecture, so `arch_default` would be ChatML), else `arch_default`.
    pub fn for_vocab(arch_default: ChatTemplate, inner: &tokenizers::Tokenizer) -> ChatTemplate {
        if inner.token_to_id(R1_ASSISTANT).is_some() {
            ChatTemplate::R1Distill
        } else {
            arch_default
        }
    }

    /// Renders `messages`; with `add_generation_prompt` the assistant turn is opened.
    pub fn render(self, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
        if self == ChatTemplate::R1Distill {
            return render_r1(messages, add_generation_prompt);
        }
        let mut s = String::new();
        if self == ChatTemplate::SmolLm2 && messages.first().is_none_or(|m| m.role != "system") {
            s.push_str(&format!("<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"));
        }
        for m in messages {
            s.push_str(&format!(
                "<|im_start|>{}\n{}<|im_end|>\n",
                m.role, m.content
            ));
        }
        if add_generation_prompt {
            s.push_str("<|im_start|>assistant\n");
        }
        s
    }
}

/// DeepSeek-R1-Distill's template (its `tokenizer_config.json`, tools left out): the last system
/// message first, then user turns and assistant answers (an answer's thinking, up to `</think>`,
/// is dropped from the history).
fn render_r1(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let system = messages
        .iter()
        .rev()
        .find(|m| m.role == "system")
        .map_or("", |m| m.content.as_str());
    let mut s = format!("{R1_BOS}{system}");
    for m in messages {
        match m.role.as_str() {
            "user" => s.push_str(&format!("{R1_USER}{}", m.content)),
            "assistant" => {
                let answer = m.content.rsplit("</think>").next().unwrap_or_default();
                s.push_str(&format!("{R1_ASSISTANT}{answer}{R1_EOS}"));
            }
            _ => {}
        }
    }
    if add_generation_prompt {
        s.push_str(&format!("{R1_ASSISTANT}<think>\n"));
    }
    s
}

/// A tokenizer plus the special ids generation needs.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pub inner: tokenizers::Tokenizer,
    pub template: ChatTemplate,
    /// Ids that end generation (`<|im_end|>`, `<|endoftext|>`, …).
    pub eos_ids: Vec<i64>,
    pub pad_id: i64,
    /// The end-of-thinking token `</think>`, when the vocabulary has one (a thinking model).
    pub think_end_id: Option<i64>,
    /// Where it came from, for error messages.
    pub source: PathBuf,
}

impl Tokenizer {
    /// Loads `tokenizer.json`.
    pub fn from_file(path: &Path, template: ChatTemplate, eos_ids: Vec<i64>) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| ModelError::Tokenizer {
            path: path.into(),
            msg: e.to_string(),
        })?;
        Ok(Self::from_inner(inner, template, eos_ids, path))
    }

    /// Wraps an already-built tokenizer; `eos_ids` are completed with `<|im_end|>` and
    /// `<|endoftext|>` when the vocabulary has them; `template` gives way to R1-distill's when the
    /// vocabulary is an R1 distill's ([`ChatTemplate::for_vocab`]).
    pub fn from_inner(
        inner: tokenizers::Tokenizer,
        template: ChatTemplate,
        mut eos_ids: Vec<i64>,
        source: &Path,
    ) -> Self {
        for t in ["<|im_end|>", "<|endoftext|>"] {
            if let Some(id) = inner.token_to_id(t) {
                if !eos_ids.contains(&(id as i64)) {
                    eos_ids.push(id as i64);
                }
            }
        }
        let pad_id = inner
            .token_to_id("<|endoftext|>")
            .map(|i| i as i64)
            .or(eos_ids.first().copied())
            .unwrap_or(0);
        let think_end_id = inner.token_to_id("</think>").map(i64::from);
        let template = ChatTemplate::for_vocab(template, &inner);
        Tokenizer {
            inner,
            template,
            eos_ids,
            pad_id,
            think_end_id,
            source: source.into(),
        }
    }

    fn err(&self, msg: impl ToString) -> ModelError {
        ModelError::Tokenizer {
            path: self.source.clone(),
            msg: msg.to_string(),
        }
    }

    /// Token ids of `text` (special-token strings such as `<|im_start|>` map to their ids; no
    /// BOS/EOS added).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let enc = self.inner.encode(text, false).map_err(|e| self.err(e))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    /// Text of `ids`, optionally without special tokens.
    pub fn decode(&self, ids: &[i64], skip_special: bool) -> Result<String> {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        self.inner
            .decode(&ids, skip_special)
            .map_err(|e| self.err(e))
    }

    /// Renders and encodes a conversation.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<i64>> {
        self.encode(&self.template.render(messages, add_generation_prompt))
    }

    /// [`Self::encode_chat`] with the template's `enable_thinking` (true is what every other
    /// method renders). Only Qwen3's template reads it: with a vocabulary that has `</think>`, the
    /// Qwen template given `enable_thinking = false` opens the answer with an empty thinking block,
    /// as Qwen3's does; the other templates (and Qwen2's) ignore it, as theirs do.
    pub fn encode_chat_thinking(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<Vec<i64>> {
        let mut text = self.template.render(messages, add_generation_prompt);
        if add_generation_prompt && !enable_thinking && self.template == ChatTemplate::Qwen && self.think_end_id.is_some() {
            text.push_str(QWEN3_NO_THINKING);
        }
        self.encode(&text)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Writes `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.inner.save(path, false).map_err(|e| self.err(e))
    }

    /// A small byte-level BPE trained on `texts` (Qwen chat template), for unit tests that need a
    /// real tokenizer without a model.
    #[cfg(test)]
    pub(crate) fn trained_on(texts: &[String]) -> Tokenizer {
        let inner = rredcot::stages::tokenizer_train::train(texts, 300, 2).expect("a test tokenizer trains");
        Tokenizer::from_inner(inner, ChatTemplate::Qwen, vec![], Path::new("test"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_templates_render_chatml() {
        let msgs = [ChatMessage::new("user", "2+2?")];
        assert_eq!(
            ChatTemplate::Qwen.render(&msgs, true),
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
        let s = ChatTemplate::SmolLm2.render(&msgs, false);
        assert!(s.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
        assert!(s.ends_with("<|im_start|>user\n2+2?<|im_end|>\n"));
        let sys = [
            ChatMessage::new("system", "S"),
            ChatMessage::new("user", "U"),
        ];
        assert_eq!(
            ChatTemplate::SmolLm2.render(&sys, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        );
        assert_eq!(
            ChatTemplate::R1Distill.render(&sys, true),
            "<｜begin▁of▁sentence｜>S<｜User｜>U<｜Assistant｜><think>\n"
        );
    }
}
