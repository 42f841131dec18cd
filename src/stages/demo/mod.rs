//! Small numeric stages for exercising the engine (tests, benchmarks, the engine demo pipeline),
//! one module each, and the table helpers they share. They read and write generic `table`
//! artifacts: `i` (int64) and `x` (float64) columns.

pub mod numbers;
pub mod scale;
pub mod step;
pub mod sum;

use std::sync::Arc;

use anyhow::{bail, Context};
use arrow::array::{Array, Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};

use crate::artifact::read_batches;
use crate::engine::StageContext;

pub(super) fn table(i: Vec<i64>, x: Vec<f64>) -> RecordBatch {
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

pub(super) fn read_table(ctx: &StageContext, input: &str) -> anyhow::Result<(Vec<i64>, Vec<f64>)> {
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

/// Sleeps `ms` in ten steps with progress (every demo stage's `sleep_ms`: a delay so tests can
/// kill a run while a stage is busy).
pub(super) fn maybe_sleep(ctx: &StageContext, ms: u64) -> anyhow::Result<()> {
    if ms > 0 {
        let mut p = ctx.progress(10, "sleeping");
        for _ in 0..10 {
            std::thread::sleep(std::time::Duration::from_millis(ms / 10));
            p.inc(1);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::engine::context::parse_params;
    use crate::stages::shipped_defaults;

    #[test]
    fn the_params_structs_read_the_shipped_stage_files() {
        let n: super::numbers::NumbersParams = parse_params("demo_numbers", &shipped_defaults("demo_numbers")).unwrap();
        let s: super::scale::ScaleParams = parse_params("demo_scale", &shipped_defaults("demo_scale")).unwrap();
        let _: super::sum::SumParams = parse_params("demo_sum", &shipped_defaults("demo_sum")).unwrap();
        let t: super::step::StepParams = parse_params("demo_step", &shipped_defaults("demo_step")).unwrap();
        assert_eq!((n.n, s.factor, t.decay), (100, 2.0, 0.5));
        let mut typo = shipped_defaults("demo_scale");
        typo.insert("digits".into(), "six".into());
        let e = parse_params::<super::scale::ScaleParams>("s", &typo).unwrap_err().to_string();
        assert!(e.contains("stage `s`: param `digits` = \"six\""), "{e}");
    }
}
