//! The LLM judge ensemble (paper: 2 prompts × 8 samples): asks a model whether a response's
//! final answer matches the reference, under several prompt templates and several samples each,
//! and takes the majority vote.
//!
//! Owns: the prompt [`templates`], reading a verdict from a reply and the vote ([`vote`]), the
//! plan of votes and their aggregation into `correct_judge` ([`ensemble`]), and the OpenAI-
//! compatible HTTP backend with its response cache ([`http`], [`cache`]). Knows nothing of stages
//! or models (it borrows only the engine's canonical-JSON hash, so cache keys are computed one
//! way): the `judge` stage (HTTP) and the `judge_local` stage (the model core, in the worker) both
//! drive it.

pub mod cache;
pub mod ensemble;
pub mod http;
pub mod templates;
pub mod vote;

use std::path::PathBuf;

use serde_json::Value;

pub use ensemble::{aggregate, plan_votes, Aggregate, JudgmentRow, PlanOptions, Vote};
pub use templates::Template;
pub use vote::{parse_verdict, Tally, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    #[error("{0}")]
    Template(String),
    #[error("{0}")]
    Config(String),
    /// Retries spent on connection errors, timeouts, 429/5xx or garbage bodies.
    #[error("POST {url} ({request}): no usable reply after {attempts} attempts; last: {last}")]
    GaveUp { url: String, request: String, attempts: u32, last: String },
    /// A 4xx other than 429 (or an unusable URL): not retried.
    #[error("POST {url} ({request}): rejected with HTTP {status} (not retried): {body}")]
    Rejected { url: String, request: String, status: u16, body: String },
    #[error("judge cache {}: {message}", path.display())]
    Cache { path: PathBuf, message: String },
}

/// One chat message of a judge request (OpenAI's `{role, content}`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// The reply text of a chat completion response: `choices[0].message.content` (a `null` content
/// is an empty reply). `None` when the body is not a chat completion.
pub fn reply_content(response: &Value) -> Option<String> {
    let message = response.get("choices")?.get(0)?.get("message")?;
    match message.get("content") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Null) | None => Some(String::new()),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reply_content_reads_chat_completions_only() {
        let ok = json!({"choices": [{"message": {"role": "assistant", "content": "Verdict: YES"}}]});
        assert_eq!(reply_content(&ok).as_deref(), Some("Verdict: YES"));
        assert_eq!(reply_content(&json!({"choices": [{"message": {"content": null}}]})).as_deref(), Some(""));
        assert_eq!(reply_content(&json!({"error": {"message": "x"}})), None);
        assert_eq!(reply_content(&json!({"choices": []})), None);
        assert_eq!(reply_content(&json!({"choices": [{"message": {"content": 3}}]})), None);
    }
}
