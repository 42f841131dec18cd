//! Tokenizer wrapper over the `tokenizers` crate, with the chat templates of the supported
//! model families written out in Rust (no Jinja at run time).
//!
//! - Qwen (ChatML): `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
//!   `<|im_start|>assistant\n` as generation prompt.
//! - SmolLM2: ChatML with a default system message when the conversation has none.

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
}

/// SmolLM2's default system prompt (from its `chat_template`).
pub const SMOLLM2_SYSTEM: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

impl ChatTemplate {
    /// Renders `messages`; with `add_generation_prompt` the assistant turn is opened.
    pub fn render(self, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
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

/// A tokenizer plus the special ids generation needs.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pub inner: tokenizers::Tokenizer,
    pub template: ChatTemplate,
    /// Ids that end generation (`<|im_end|>`, `<|endoftext|>`, …).
    pub eos_ids: Vec<i64>,
    pub pad_id: i64,
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
    /// `<|endoftext|>` when the vocabulary has them.
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
        Tokenizer {
            inner,
            template,
            eos_ids,
            pad_id,
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

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Writes `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.inner.save(path, false).map_err(|e| self.err(e))
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
    }
}
