//! Builtin stages that need the model core. Their names and code versions are in the engine's
//! catalog (`rredcot::stages::CATALOG`, `needs_ml = true`) so the engine binary can key them
//! without linking libtorch.

pub mod bootstrap_sft;
pub mod eval;
pub mod judge_local;
pub mod rollout;
pub mod sampling;
pub mod score_grad;
pub mod score_loo;
pub mod score_mc;
pub mod score_sigma;
pub mod traces;
pub mod update;

use anyhow::{Context, Result};
use rredcot::artifact::rows::PromptRow;
use rredcot::engine::{BuiltinFn, Runtime, StageContext};
use rredcot::stages::{light_builtin, CATALOG};

use crate::model::{self, ChatMessage, DecoderLm, LoadOptions, Tokenizer};

/// Builtins of the ML worker (light ones included).
pub fn full_builtin(name: &str) -> Option<BuiltinFn> {
    Some(match name {
        "bootstrap_sft" => bootstrap_sft::run,
        "rollout" => rollout::run,
        "eval" => eval::run,
        "score_sigma" => score_sigma::run,
        "score_mc" => score_mc::run,
        "score_loo" => score_loo::run,
        "score_grad" => score_grad::run,
        "update" => update::run,
        "judge_local" => judge_local::run,
        _ => return light_builtin(name),
    })
}

pub const FULL_RUNTIME: Runtime = Runtime { builtins: CATALOG, resolve: full_builtin };

/// Applies the stage's `threads` param (0 = libtorch's default).
fn set_threads(ctx: &StageContext) -> Result<()> {
    let threads: i64 = ctx.param("threads")?;
    if threads > 0 {
        tch::set_num_threads(threads as i32);
    }
    Ok(())
}

/// Loads the checkpoint wired to input `name` with the stage's `device`/`dtype` params; it must
/// carry its tokenizer.
fn load_policy(ctx: &StageContext, name: &str) -> Result<(DecoderLm, Tokenizer)> {
    let opts: LoadOptions = serde_json::from_value(serde_json::json!({
        "device": ctx.param::<String>("device")?,
        "dtype": ctx.param::<String>("dtype")?,
    }))
    .with_context(|| format!("stage `{}`: params device/dtype", ctx.instance))?;
    let path = ctx.input(name)?;
    let loaded = model::load(path, &opts).with_context(|| format!("loading input `{name}` ({})", path.display()))?;
    let tok = loaded
        .tokenizer
        .with_context(|| format!("input `{name}` ({}): no tokenizer.json in the checkpoint", path.display()))?;
    Ok((loaded.model, tok))
}

/// The chat of a `prompts.prompt` value: its messages when it is a JSON chat, else one user turn.
fn prompt_messages(prompt: &str) -> Vec<ChatMessage> {
    if let Ok(serde_json::Value::Array(msgs)) = serde_json::from_str::<serde_json::Value>(prompt.trim_start()) {
        let chat: Vec<ChatMessage> = msgs
            .iter()
            .filter_map(|m| Some(ChatMessage::new(m.get("role")?.as_str()?, m.get("content")?.as_str()?)))
            .collect();
        if !chat.is_empty() {
            return chat;
        }
    }
    vec![ChatMessage::new("user", prompt)]
}

/// Prompt token ids as the policy sees them (chat template + assistant header). Rollout and
/// scoring must agree on this, so both call it.
pub fn encode_prompt(tok: &Tokenizer, row: &PromptRow) -> Result<Vec<i64>> {
    Ok(tok.encode_chat(&prompt_messages(&row.prompt), true)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn chat_prompts_keep_their_roles_and_plain_text_is_a_user_turn() {
        let m = super::prompt_messages(r#"[{"role":"system","content":"be brief"},{"role":"user","content":"2+2?"}]"#);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].role.as_str(), m[1].content.as_str()), ("system", "2+2?"));
        let m = super::prompt_messages("What is 2+2?");
        assert_eq!((m.len(), m[0].role.as_str()), (1, "user"));
    }
}
