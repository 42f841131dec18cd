//! The `skipped` table: every row a data stage (`import`, `filter`) drops, with its reason, so no
//! row is lost silently. Owns the row type and writing it (plus the count on stderr); knows
//! nothing of why a stage drops rows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::artifact::write_table;
use crate::engine::StageContext;

/// One dropped row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedRow {
    /// The stage that dropped it (`import`, `filter`).
    pub stage: String,
    /// Its 0-based row in the stage's input (the source file for `import`).
    pub row: i64,
    /// Its id, when it has one (`import` skips some rows before they get one).
    pub id: Option<String>,
    /// The counter it is counted under (`skipped_no_prompt`, `removed_answer_mismatch`, ...).
    pub reason: String,
    /// What was found (the solution's stated answer, the earlier duplicate, ...).
    pub detail: String,
}

/// Write `rows` as the stage's `skipped` output and report their count per reason on stderr.
pub fn write(ctx: &StageContext, stage: &str, rows: &[SkippedRow]) -> anyhow::Result<()> {
    let mut per_reason: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows {
        *per_reason.entry(r.reason.as_str()).or_default() += 1;
    }
    let path = ctx.output("skipped")?;
    if rows.is_empty() {
        eprintln!("{stage}: no rows skipped");
    } else {
        let counts: Vec<String> = per_reason.iter().map(|(r, n)| format!("{r} {n}")).collect();
        eprintln!(
            "{stage}: skipped {} rows ({}); each is listed with its reason in {}",
            rows.len(),
            counts.join(", "),
            path.display()
        );
    }
    write_table(path, rows)?;
    Ok(())
}
