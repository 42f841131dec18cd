//! `locate_errors`: keep the incorrect rollouts whose first wrong step is located (issue 19's
//! credit benchmark on a real model), so the credit methods, Monte Carlo's k continuations per
//! segment above all, score only the traces the benchmark can use.
//!
//! Inputs `prompts`, `rollouts`, `tokenizer` (token texts); params `locator` (`taskgen` or
//! `arithmetic`, see [`crate::analysis::locate::Locator`]) and `limit` (at most this many
//! traces kept, in rollout order; 0 = all). Outputs `rollouts` (the kept rows, unchanged) and
//! `skipped` (every other row with its reason: `correct`, `no_error`, `unchecked`, `unparseable`,
//! `unclosed`, `over_limit`; the located error kind and line in `detail` for `over_limit`).

use anyhow::{bail, Context, Result};

use super::skipped::{self, SkippedRow};
use crate::analysis::locate::{FirstWrong, Locator};
use crate::analysis::first_wrong::Verdict;
use crate::artifact::rows::{PromptRow, RolloutRow};
use crate::artifact::{read_rows, write_rows, Schema};
use crate::engine::{Builtin, Executable, StageContext};

/// The stage's params (stages/locate_errors.toml documents them); unknown or mistyped ones are errors naming
/// the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LocateParams {
    locator: Locator,
    limit: usize,
}

pub const STAGE: Builtin = Builtin { name: "locate_errors", version: "2", runs_in: Executable::Engine, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let LocateParams { locator, limit } = ctx.params()?;
    let prompts_path = ctx.input("prompts")?.to_path_buf();
    let prompts: Vec<PromptRow> = read_rows(&prompts_path, Schema::Prompts)?;
    let rollouts_path = ctx.input("rollouts")?.to_path_buf();
    let rollouts: Vec<RolloutRow> = read_rows(&rollouts_path, Schema::Rollouts)?;
    let tok = crate::tokenizer_file::load(ctx.input("tokenizer")?)?;
    let mut first_wrong = FirstWrong::new(locator, &prompts_path, &prompts);
    let (mut kept, mut skipped_rows) = (Vec::new(), Vec::new());
    let mut progress = ctx.progress(rollouts.len() as u64, "locating first wrong steps");
    for (row, r) in rollouts.iter().enumerate() {
        progress.inc(1);
        let skip = |reason: &str, detail: String| SkippedRow { stage: "locate_errors".into(), row: row as i64, id: Some(format!("{}/{}", r.prompt_id, r.sample_idx)), reason: reason.into(), detail };
        if r.reward > 0.0 {
            skipped_rows.push(skip("correct", String::new()));
            continue;
        }
        let at = || format!("{} row {row} (prompt {}, sample {})", rollouts_path.display(), r.prompt_id, r.sample_idx);
        let texts = super::segment::token_texts(&tok, &r.completion_ids).with_context(at)?;
        match first_wrong.verdict(r, &texts, &at)? {
            Verdict::Wrong { line, kind, .. } if limit > 0 && kept.len() >= limit => skipped_rows.push(skip("over_limit", format!("{} at line {}", kind.as_str(), line + 1))),
            Verdict::Wrong { .. } => kept.push(r.clone()),
            other => skipped_rows.push(skip(other.name(), String::new())),
        }
    }
    progress.finish();
    ctx.count("input_rows", rollouts.len() as i64);
    ctx.count("kept", kept.len() as i64);
    skipped::write(ctx, "locate_errors", &skipped_rows)?;
    if kept.is_empty() {
        bail!("{}: no incorrect rollout has a located first wrong step (locator {locator:?}); nothing to benchmark", rollouts_path.display());
    }
    write_rows(ctx.output("rollouts")?, Schema::Rollouts, &kept)?;
    Ok(())
}
