//! `demo_scale`: x * factor, rounded.

use super::{maybe_sleep, read_table, table};
use crate::artifact::write_batch;
use crate::engine::{Builtin, Executable, StageContext};

/// Params of `demo_scale`; `threads` is a speed hint that does not change results.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ScaleParams {
    pub(super) factor: f64,
    digits: i32,
    #[allow(dead_code)]
    threads: i64,
    sleep_ms: u64,
}

pub const STAGE: Builtin = Builtin { name: "demo_scale", version: "1", runs_in: Executable::Engine, run };

/// x * factor, rounded to `digits` decimals; `threads` is a speed hint that does not change results.
pub fn run(ctx: &mut StageContext) -> anyhow::Result<()> {
    let ScaleParams { factor, digits, sleep_ms, .. } = ctx.params()?;
    maybe_sleep(ctx, sleep_ms)?;
    let (i, x) = read_table(ctx, "table")?;
    let m = 10f64.powi(digits);
    let y = x.iter().map(|v| (v * factor * m).round() / m).collect();
    write_batch(ctx.output("table")?, &table(i, y))?;
    Ok(())
}
