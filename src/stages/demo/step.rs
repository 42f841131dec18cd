//! `demo_step`: one step of an iterated computation (a stand-in for a training step in chains).

use super::{maybe_sleep, read_table, table};
use crate::artifact::write_batch;
use crate::engine::{Builtin, Executable, StageContext};

/// Params of `demo_step`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StepParams {
    pub(super) decay: f64,
    sleep_ms: u64,
}

pub const STAGE: Builtin = Builtin { name: "demo_step", version: "1", runs_in: Executable::Engine, run };

/// One step of an iterated computation: x <- x * decay + 1 (a stand-in for a training step).
pub fn run(ctx: &mut StageContext) -> anyhow::Result<()> {
    let StepParams { decay, sleep_ms } = ctx.params()?;
    maybe_sleep(ctx, sleep_ms)?;
    let (i, x) = read_table(ctx, "state")?;
    let y = x.iter().map(|v| v * decay + 1.0).collect();
    write_batch(ctx.output("state")?, &table(i, y))?;
    ctx.count("steps", 1);
    Ok(())
}
