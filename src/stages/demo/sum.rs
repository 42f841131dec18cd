//! `demo_sum`: one row, the sum of x.

use super::{maybe_sleep, read_table, table};
use crate::artifact::write_batch;
use crate::engine::{Builtin, Executable, StageContext};

/// Params of `demo_sum`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SumParams {
    sleep_ms: u64,
}

pub const STAGE: Builtin = Builtin { name: "demo_sum", version: "1", runs_in: Executable::Engine, run };

/// One row: the sum of x.
pub fn run(ctx: &mut StageContext) -> anyhow::Result<()> {
    let SumParams { sleep_ms } = ctx.params()?;
    maybe_sleep(ctx, sleep_ms)?;
    let (_, x) = read_table(ctx, "table")?;
    write_batch(ctx.output("table")?, &table(vec![0], vec![x.iter().sum()]))?;
    Ok(())
}
