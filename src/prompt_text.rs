//! The text of a prompt as the world stages see it: plain text, or the user turns of a chat
//! (`[{"role", "content"}, …]` JSON, as `import` writes verl prompts), and the normalized form
//! whose hash identifies a problem for deduplication (`taskgen` splits, `filter` duplicates).
//! Knows nothing of models or tokenizers.

use sha2::{Digest, Sha256};

/// The problem text of a `prompts.prompt` value: the concatenated `user` contents of a chat
/// message list, or the value itself when it is not one.
pub fn prompt_text(prompt: &str) -> String {
    let trimmed = prompt.trim_start();
    if trimmed.starts_with('[') {
        if let Ok(serde_json::Value::Array(msgs)) =
            serde_json::from_str::<serde_json::Value>(trimmed)
        {
            let user: Vec<&str> = msgs
                .iter()
                .filter(|m| m.get("role").and_then(|r| r.as_str()) == Some("user"))
                .filter_map(|m| m.get("content").and_then(|c| c.as_str()))
                .collect();
            if !user.is_empty() {
                return user.join("\n");
            }
        }
    }
    prompt.to_string()
}

/// The text of a chat message's `content`: a string, or OpenAI's list of `{type: "text", text}`
/// parts, concatenated as Qwen's and Llama's chat templates write them; `None` for anything else
/// (an image part, a number).
pub fn message_content_text(content: &serde_json::Value) -> Option<String> {
    match content {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(parts) => parts
            .iter()
            .map(|p| match (p.get("type").and_then(|t| t.as_str()), p.get("text").and_then(|t| t.as_str())) {
                (Some("text"), Some(t)) => Some(t),
                _ => None,
            })
            .collect::<Option<Vec<&str>>>()
            .map(|t| t.concat()),
        _ => None,
    }
}

/// Lowercase, whitespace runs collapsed to one space, trimmed.
pub fn normalize(text: &str) -> String {
    text.split_whitespace()
        .map(|w| w.to_lowercase())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Hex sha256 of the normalized problem text of a prompt.
pub fn normalized_hash(prompt: &str) -> String {
    hex::encode(Sha256::digest(normalize(&prompt_text(prompt)).as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompts_reduce_to_their_user_turns() {
        let chat =
            r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"What is 2+2?"}]"#;
        assert_eq!(prompt_text(chat), "What is 2+2?");
        assert_eq!(normalized_hash(chat), normalized_hash("what is  2+2?\n"));
        assert_ne!(normalized_hash(chat), normalized_hash("What is 2+3?"));
    }

    #[test]
    fn non_chat_brackets_stay_text() {
        assert_eq!(prompt_text("[1, 2] has two items"), "[1, 2] has two items");
        assert_eq!(prompt_text("[1, 2]"), "[1, 2]");
    }
}
