//! Small numeric stages for exercising the engine (tests, benchmarks, the engine demo pipeline).
//! They read and write generic `table` artifacts: `i` (int64) and `x` (float64) columns.

use std::sync::Arc;

use anyhow::{bail, Context};
use arrow::array::{Array, Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use rand::{Rng, SeedableRng};

use crate::artifact::{read_batches, write_batch};
use crate::engine::StageContext;

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

/// Optional delay so tests can kill a run while a stage is busy.
fn maybe_sleep(ctx: &StageContext) -> anyhow::Result<()> {
    let ms: u64 = ctx.param("sleep_ms")?;
    if ms > 0 {
        let mut p = ctx.progress(10, "sleeping");
        for _ in 0..10 {
            std::thread::sleep(std::time::Duration::from_millis(ms / 10));
            p.inc(1);
        }
    }
    Ok(())
}

/// `n` seeded random numbers.
pub fn numbers(ctx: &mut StageContext) -> anyhow::Result<()> {
    let n: usize = ctx.param("n")?;
    let seed: u64 = ctx.param("seed")?;
    maybe_sleep(ctx)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let x: Vec<f64> = (0..n).map(|_| rng.random_range(0.0..1.0)).collect();
    write_batch(ctx.output("table")?, &table((0..n as i64).collect(), x))?;
    ctx.count("rows", n as i64);
    Ok(())
}

/// x * factor, rounded to `digits` decimals; `threads` is a speed hint that does not change results.
pub fn scale(ctx: &mut StageContext) -> anyhow::Result<()> {
    let factor: f64 = ctx.param("factor")?;
    let digits: i32 = ctx.param("digits")?;
    let _threads: i64 = ctx.param("threads")?;
    maybe_sleep(ctx)?;
    let (i, x) = read_table(ctx, "table")?;
    let m = 10f64.powi(digits);
    let y = x.iter().map(|v| (v * factor * m).round() / m).collect();
    write_batch(ctx.output("table")?, &table(i, y))?;
    Ok(())
}

/// One row: the sum of x.
pub fn sum(ctx: &mut StageContext) -> anyhow::Result<()> {
    maybe_sleep(ctx)?;
    let (_, x) = read_table(ctx, "table")?;
    write_batch(ctx.output("table")?, &table(vec![0], vec![x.iter().sum()]))?;
    Ok(())
}

/// One step of an iterated computation: x <- x * decay + 1 (a stand-in for a training step).
pub fn step(ctx: &mut StageContext) -> anyhow::Result<()> {
    let decay: f64 = ctx.param("decay")?;
    maybe_sleep(ctx)?;
    let (i, x) = read_table(ctx, "state")?;
    let y = x.iter().map(|v| v * decay + 1.0).collect();
    write_batch(ctx.output("state")?, &table(i, y))?;
    ctx.count("steps", 1);
    Ok(())
}
