//! Small numeric stages for exercising the engine (tests, benchmarks, the engine demo pipeline).
//! They read and write generic `table` artifacts: `i` (int64) and `x` (float64) columns.

use std::sync::Arc;

use anyhow::{bail, Context};
use arrow::array::{Array, Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use rand::{Rng, SeedableRng};

use crate::artifact::{read_batches, write_batch};
use crate::engine::{Builtin, Executable, StageContext};

fn table(i: Vec<i64>, x: Vec<f64>) -> RecordBatch {
    let schema = ArrowSchema::new(vec![
        Field::new("i", DataType::Int64, false),
        Field::new("x", DataType::Float64, false),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(Int64Array::from(i)),
            Arc::new(Float64Array::from(x)),
        ],
    )
    .expect("valid table")
}

fn read_table(ctx: &StageContext, input: &str) -> anyhow::Result<(Vec<i64>, Vec<f64>)> {
    let path = ctx.input(input)?;
    let b = read_batches(path)?;
    let col = |n: &str| {
        b.column_by_name(n)
            .with_context(|| format!("{}: missing column `{n}`", path.display()))
    };
    let i = col("i")?
        .as_any()
        .downcast_ref::<Int64Array>()
        .with_context(|| format!("{}: column `i` is not int64", path.display()))?;
    let x = col("x")?
        .as_any()
        .downcast_ref::<Float64Array>()
        .with_context(|| format!("{}: column `x` is not float64", path.display()))?;
    for (row, v) in x.values().iter().enumerate() {
        if !v.is_finite() {
            bail!("{}: row {row}: column `x` is {v}", path.display());
        }
    }
    Ok((i.values().to_vec(), x.values().to_vec()))
}

/// Params of `demo_numbers` (every demo stage has `sleep_ms`: an optional delay so tests can kill
/// a run while a stage is busy).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NumbersParams {
    n: usize,
    seed: u64,
    sleep_ms: u64,
}

/// Params of `demo_scale`; `threads` is a speed hint that does not change results.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ScaleParams {
    factor: f64,
    digits: i32,
    #[allow(dead_code)]
    threads: i64,
    sleep_ms: u64,
}

/// Params of `demo_sum`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SumParams {
    sleep_ms: u64,
}

/// Params of `demo_step`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StepParams {
    decay: f64,
    sleep_ms: u64,
}

/// Sleeps `ms` in ten steps with progress.
fn maybe_sleep(ctx: &StageContext, ms: u64) -> anyhow::Result<()> {
    if ms > 0 {
        let mut p = ctx.progress(10, "sleeping");
        for _ in 0..10 {
            std::thread::sleep(std::time::Duration::from_millis(ms / 10));
            p.inc(1);
        }
    }
    Ok(())
}

pub const NUMBERS: Builtin = Builtin { name: "demo_numbers", version: "1", runs_in: Executable::Engine, run: numbers };

/// `n` seeded random numbers.
pub fn numbers(ctx: &mut StageContext) -> anyhow::Result<()> {
    let NumbersParams { n, seed, sleep_ms } = ctx.params()?;
    maybe_sleep(ctx, sleep_ms)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let x: Vec<f64> = (0..n).map(|_| rng.random_range(0.0..1.0)).collect();
    write_batch(ctx.output("table")?, &table((0..n as i64).collect(), x))?;
    ctx.count("rows", n as i64);
    Ok(())
}

pub const SCALE: Builtin = Builtin { name: "demo_scale", version: "1", runs_in: Executable::Engine, run: scale };

/// x * factor, rounded to `digits` decimals; `threads` is a speed hint that does not change results.
pub fn scale(ctx: &mut StageContext) -> anyhow::Result<()> {
    let ScaleParams { factor, digits, sleep_ms, .. } = ctx.params()?;
    maybe_sleep(ctx, sleep_ms)?;
    let (i, x) = read_table(ctx, "table")?;
    let m = 10f64.powi(digits);
    let y = x.iter().map(|v| (v * factor * m).round() / m).collect();
    write_batch(ctx.output("table")?, &table(i, y))?;
    Ok(())
}

pub const SUM: Builtin = Builtin { name: "demo_sum", version: "1", runs_in: Executable::Engine, run: sum };

/// One row: the sum of x.
pub fn sum(ctx: &mut StageContext) -> anyhow::Result<()> {
    let SumParams { sleep_ms } = ctx.params()?;
    maybe_sleep(ctx, sleep_ms)?;
    let (_, x) = read_table(ctx, "table")?;
    write_batch(ctx.output("table")?, &table(vec![0], vec![x.iter().sum()]))?;
    Ok(())
}

pub const STEP: Builtin = Builtin { name: "demo_step", version: "1", runs_in: Executable::Engine, run: step };

/// One step of an iterated computation: x <- x * decay + 1 (a stand-in for a training step).
pub fn step(ctx: &mut StageContext) -> anyhow::Result<()> {
    let StepParams { decay, sleep_ms } = ctx.params()?;
    maybe_sleep(ctx, sleep_ms)?;
    let (i, x) = read_table(ctx, "state")?;
    let y = x.iter().map(|v| v * decay + 1.0).collect();
    write_batch(ctx.output("state")?, &table(i, y))?;
    ctx.count("steps", 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::engine::context::parse_params;
    use crate::stages::shipped_defaults;

    #[test]
    fn the_params_structs_read_the_shipped_stage_files() {
        let n: super::NumbersParams = parse_params("demo_numbers", &shipped_defaults("demo_numbers")).unwrap();
        let s: super::ScaleParams = parse_params("demo_scale", &shipped_defaults("demo_scale")).unwrap();
        let _: super::SumParams = parse_params("demo_sum", &shipped_defaults("demo_sum")).unwrap();
        let t: super::StepParams = parse_params("demo_step", &shipped_defaults("demo_step")).unwrap();
        assert_eq!((n.n, s.factor, t.decay), (100, 2.0, 0.5));
        let mut typo = shipped_defaults("demo_scale");
        typo.insert("digits".into(), "six".into());
        let e = parse_params::<super::ScaleParams>("s", &typo).unwrap_err().to_string();
        assert!(e.contains("stage `s`: param `digits` = \"six\""), "{e}");
    }
}
