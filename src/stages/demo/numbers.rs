//! `demo_numbers`: `n` seeded random numbers, the first table of the demo pipelines.

use super::{maybe_sleep, table};
use crate::artifact::write_batch;
use crate::engine::{Builtin, Executable, StageContext};
use rand::{Rng, SeedableRng};

/// Params of `demo_numbers` (`sleep_ms`: see [`super::maybe_sleep`]).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NumbersParams {
    pub(super) n: usize,
    seed: u64,
    sleep_ms: u64,
}

pub const STAGE: Builtin = Builtin { name: "demo_numbers", version: "1", runs_in: Executable::Engine, run };

/// `n` seeded random numbers.
pub fn run(ctx: &mut StageContext) -> anyhow::Result<()> {
    let NumbersParams { n, seed, sleep_ms } = ctx.params()?;
    maybe_sleep(ctx, sleep_ms)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let x: Vec<f64> = (0..n).map(|_| rng.random_range(0.0..1.0)).collect();
    write_batch(ctx.output("table")?, &table((0..n as i64).collect(), x))?;
    ctx.count("rows", n as i64);
    Ok(())
}
