//! `credit_benchmark`: every credit method measured against ground truth (issue 19).
//!
//! The default world's task knows every intermediate value, so in an incorrect trace the first
//! wrong step is known exactly ([`crate::analysis::first_wrong`]). For each incorrect rollout whose first
//! wrong step is located, the segment holding that line is the one a credit method should blame.
//! Each method blames the segments in its own way ([`Blame`]); this stage reports, per method, how
//! often the segment it blames most is the first wrong step (`top1`; ties share the hit: k segments
//! tied at the top with the right one among them count 1/k, the expected hit of a random
//! tie-break) and the mean rank of the first wrong step in its blame order (1 = blamed most, ties
//! at their mean rank), against chance (a random segment: top-1 = 1/T, rank (T + 1)/2 per trace).
//!
//! Inputs: `prompts` (reference solutions), `rollouts`, `segments` (best one segment per line:
//! `segment` with `method = "keyword"`, `keywords = ["\n"]`), `tokenizer` (token texts, to map
//! lines to segments); groups `scores.<label>` (any `scores` artifact: σ, MC, LOO, gradient,
//! progress) and `resets.<label>` (a `reset` stage's `resets` table: SRPO's localized step, RRPO's
//! random one). Output `report`: `results.md`, `credit_benchmark` and `first_wrong_steps` tables
//! (CSV + Parquet), the top-1 chart (SVG + PNG). Model cost per trace (token positions run and
//! tokens generated) comes from each input's run record when the store has it.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::analysis::first_wrong::Verdict;
use crate::analysis::locate::{FirstWrong, Locator};
use crate::analysis::stats::ranks;
use crate::artifact::rows::{PromptRow, RolloutRow, ScoreRow, SegmentRow};
use crate::artifact::{read_rows, read_table_columns, Schema};
use crate::engine::{Builtin, Executable, StageContext};
use crate::figures::plots::{self, Bar};
use crate::figures::{figures_section, members, provenance, write_table, Cell};

/// How a method blames the segments of an incorrect trace (param `blame`, per member label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Blame {
    /// The largest drop in the method's value curve: argmin_t (R_t − R_{t−1}) + (v_t − v_{t−1})
    /// over the curves it wrote (σ^unnorm for RREDCoT; the success probability for MC and
    /// progress).
    Drop,
    /// The largest σ_t: the segment that takes the largest share of a negative advantage in the
    /// update (σ with `normalize = "l1"` or `"softmax"`).
    MaxSigma,
    /// The smallest σ_t (σ with `normalize = "signed_l1"`: the same order as `drop`).
    MinSigma,
    /// The smallest R_t: the segment whose presence lowers the target most (LOO's PMI).
    MinValue,
    /// The largest R_t: the segment the target depends on most (gradient attribution's norm).
    MaxValue,
}

impl Blame {
    /// The default for a `scores` row's `method` column.
    fn for_method(method: &str) -> Option<Blame> {
        Some(match method {
            "rredcot" | "mc" | "progress" => Blame::Drop,
            "loo" => Blame::MinValue,
            "grad" => Blame::MaxValue,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Blame::Drop => "drop",
            Blame::MaxSigma => "max_sigma",
            Blame::MinSigma => "min_sigma",
            Blame::MinValue => "min_value",
            Blame::MaxValue => "max_value",
        }
    }

    /// Blame per segment (higher = blamed more) from a scores row of T segments.
    fn scores(self, row: &ScoreRow, t: usize) -> Result<Vec<f64>> {
        let diffs = |x: &[f64]| -> Result<Vec<f64>> {
            match x.len() {
                0 => Ok(vec![0.0; t]),
                n if n == t + 1 => Ok(x.windows(2).map(|w| w[1] - w[0]).collect()),
                n => bail!("a value curve of {n} points for {t} segments (want {})", t + 1),
            }
        };
        let values = |x: &[f64]| -> Result<Vec<f64>> {
            if x.len() != t {
                bail!("{} values R for {t} segments", x.len());
            }
            Ok(x.to_vec())
        };
        let b: Vec<f64> = match self {
            Blame::Drop => {
                if row.r.is_empty() && row.v.is_empty() {
                    bail!("no value curves R, v to take drops of (method `{}`)", row.method);
                }
                diffs(&row.r)?.iter().zip(diffs(&row.v)?).map(|(a, b)| -(a + b)).collect()
            }
            Blame::MaxSigma => row.sigma.clone(),
            Blame::MinSigma => row.sigma.iter().map(|s| -s).collect(),
            Blame::MinValue => values(&row.r)?.iter().map(|r| -r).collect(),
            Blame::MaxValue => values(&row.r)?,
        };
        if let Some(i) = b.iter().position(|x| x.is_nan()) {
            bail!("blame of segment {} is NaN", i + 1);
        }
        Ok(b)
    }
}

/// One incorrect trace whose first wrong step is located.
#[derive(Debug, Clone)]
struct Located {
    prompt_id: String,
    sample_idx: i32,
    segments: usize,
    /// 0-based segment of the first wrong line.
    wrong: usize,
    kind: &'static str,
}

/// (top-1 hit, rank) of segment `wrong` under `blame` (higher = blamed more; ties shared).
pub fn hit_and_rank(blame: &[f64], wrong: usize) -> (f64, f64) {
    let top = blame.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let tied = blame.iter().filter(|&&b| b == top).count();
    let hit = if blame[wrong] == top { 1.0 / tied as f64 } else { 0.0 };
    let neg: Vec<f64> = blame.iter().map(|b| -b).collect();
    (hit, ranks(&neg)[wrong])
}

/// The segment holding most of the bytes `span` of the completion text, given each token's text.
fn segment_of(span: &std::ops::Range<usize>, token_texts: &[String], seg: &SegmentRow) -> Option<usize> {
    let mut offsets = Vec::with_capacity(token_texts.len() + 1);
    let mut at = 0;
    offsets.push(0);
    for t in token_texts {
        at += t.len();
        offsets.push(at);
    }
    let overlap = |s: usize, e: usize| span.end.min(offsets[e]).saturating_sub(span.start.max(offsets[s]));
    let best = seg
        .seg_starts
        .iter()
        .zip(&seg.seg_ends)
        .map(|(&s, &e)| overlap(s as usize, e as usize))
        .enumerate()
        .max_by_key(|&(i, o)| (o, std::cmp::Reverse(i)))?;
    (best.1 > 0).then_some(best.0)
}

/// Per-method summary row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MethodRow {
    pub method: String,
    pub blame: String,
    pub traces: i64,
    pub top1_first_wrong_step: f64,
    pub top1_stderr: f64,
    pub mean_rank: f64,
    pub mean_rank_stderr: f64,
    pub chance_top1: f64,
    pub chance_mean_rank: f64,
    pub forward_tokens_per_trace: f64,
    pub tokens_generated_per_trace: f64,
}

/// Per-trace row: where the first wrong step is, and each method's rank of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceRow {
    pub prompt_id: String,
    pub sample_idx: i32,
    pub segments: i32,
    /// 1-based.
    pub first_wrong_segment: i32,
    pub error: String,
    pub method: String,
    pub hit: f64,
    pub rank: f64,
}

fn mean_stderr(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    if x.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = x.iter().sum::<f64>() / n;
    if x.len() < 2 {
        return (m, f64::NAN);
    }
    let var = x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1.0);
    (m, (var / n).sqrt())
}

/// A `reset` stage's choice for one trace.
#[derive(Debug, Clone, Deserialize)]
struct ResetPick {
    prompt_id: String,
    sample_idx: i32,
    reset_step: i32,
    steps: i32,
}

/// (model token positions, tokens generated) per trace from the run record of `input`'s producer.
fn cost_per_trace(ctx: &StageContext, input: &str) -> (f64, f64) {
    let Some(rec) = ctx.upstream_record(input) else { return (f64::NAN, f64::NAN) };
    let traces = ["traces_scored", "traces"].iter().find_map(|k| rec.counters.get(*k)).copied().unwrap_or(0);
    if traces <= 0 {
        return (f64::NAN, f64::NAN);
    }
    let per = |k: &str| rec.counters.get(k).map_or(f64::NAN, |&c| c as f64 / traces as f64);
    (per("forward_tokens"), per("tokens_generated"))
}

/// Incorrect rollouts, checked: the located ones and a count per verdict.
fn locate(ctx: &mut StageContext, locator: Locator) -> Result<(Vec<Located>, BTreeMap<String, i64>)> {
    let prompts_path = ctx.input("prompts")?.to_path_buf();
    let prompts: Vec<PromptRow> = read_rows(&prompts_path, Schema::Prompts)?;
    let rollouts_path = ctx.input("rollouts")?.to_path_buf();
    let rollouts: Vec<RolloutRow> = read_rows(&rollouts_path, Schema::Rollouts)?;
    let segments: Vec<SegmentRow> = read_rows(ctx.input("segments")?, Schema::Segments)?;
    let seg_by: HashMap<(&str, i32), &SegmentRow> = segments.iter().map(|s| ((s.prompt_id.as_str(), s.sample_idx), s)).collect();
    let tok = crate::tokenizer_file::load(ctx.input("tokenizer")?)?;
    let mut first_wrong = FirstWrong::new(locator, &prompts_path, &prompts);
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    let mut located = Vec::new();
    let mut progress = ctx.progress(rollouts.len() as u64, "locating first wrong steps");
    for (row, r) in rollouts.iter().enumerate() {
        progress.inc(1);
        if r.reward > 0.0 {
            *counts.entry("correct".into()).or_default() += 1;
            continue;
        }
        let at = || format!("{} row {row} (prompt {}, sample {})", rollouts_path.display(), r.prompt_id, r.sample_idx);
        let texts = crate::stages::segment::token_texts(&tok, &r.completion_ids).with_context(at)?;
        let verdict = first_wrong.verdict(r, &texts, &at)?;
        let Verdict::Wrong { span, kind, .. } = &verdict else {
            *counts.entry(verdict.name().to_string()).or_default() += 1;
            continue;
        };
        let Some(seg) = seg_by.get(&(r.prompt_id.as_str(), r.sample_idx)) else {
            *counts.entry("no_segments".into()).or_default() += 1;
            continue;
        };
        let Some(wrong) = segment_of(span, &texts, seg) else {
            *counts.entry("outside_segments".into()).or_default() += 1;
            continue;
        };
        *counts.entry("located".into()).or_default() += 1;
        located.push(Located { prompt_id: r.prompt_id.clone(), sample_idx: r.sample_idx, segments: seg.seg_starts.len(), wrong, kind: kind.as_str() });
    }
    progress.finish();
    Ok((located, counts))
}

/// The stage's params (stages/credit_benchmark.toml documents them).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BenchmarkParams {
    title: String,
    /// Per scored method, which segment it blames (default per method kind).
    pub(super) blame: BTreeMap<String, Blame>,
    /// Where the first wrong step comes from.
    locator: Locator,
}

pub const STAGE: Builtin = Builtin { name: "credit_benchmark", version: "1", runs_in: Executable::Engine, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let BenchmarkParams { title, blame: blame_params, locator } = ctx.params()?;
    let out = ctx.output("report")?.to_path_buf();
    let scores: Vec<(String, PathBuf)> = members(ctx, "scores").into_iter().map(|(l, p)| (l.to_string(), p.to_path_buf())).collect();
    let resets: Vec<(String, PathBuf)> = members(ctx, "resets").into_iter().map(|(l, p)| (l.to_string(), p.to_path_buf())).collect();
    if let Some(extra) = blame_params.keys().find(|l| !scores.iter().any(|(s, _)| s == *l)) {
        bail!("stage `{}`: param blame names `{extra}`, but there is no input `scores.{extra}`", ctx.instance);
    }
    let (located, counts) = locate(ctx, locator)?;
    for (k, v) in &counts {
        ctx.count(&format!("traces_{k}"), *v);
    }
    let mut rows: Vec<MethodRow> = Vec::new();
    let mut per_trace: Vec<TraceRow> = Vec::new();
    let mut summarize = |method: &str, blame: &str, results: Vec<(f64, f64)>, cost: (f64, f64), per_trace: &mut Vec<TraceRow>| {
        let hits: Vec<f64> = results.iter().map(|r| r.0).collect();
        let ranks: Vec<f64> = results.iter().map(|r| r.1).collect();
        let (top1, top1_se) = mean_stderr(&hits);
        let (rank, rank_se) = mean_stderr(&ranks);
        for (l, (hit, rank)) in located.iter().zip(&results) {
            per_trace.push(TraceRow {
                prompt_id: l.prompt_id.clone(),
                sample_idx: l.sample_idx,
                segments: l.segments as i32,
                first_wrong_segment: l.wrong as i32 + 1,
                error: l.kind.into(),
                method: method.into(),
                hit: *hit,
                rank: *rank,
            });
        }
        rows.push(MethodRow {
            method: method.into(),
            blame: blame.into(),
            traces: results.len() as i64,
            top1_first_wrong_step: top1,
            top1_stderr: top1_se,
            mean_rank: rank,
            mean_rank_stderr: rank_se,
            chance_top1: mean_stderr(&located.iter().map(|l| 1.0 / l.segments as f64).collect::<Vec<_>>()).0,
            chance_mean_rank: mean_stderr(&located.iter().map(|l| (l.segments as f64 + 1.0) / 2.0).collect::<Vec<_>>()).0,
            forward_tokens_per_trace: cost.0,
            tokens_generated_per_trace: cost.1,
        });
    };
    // Chance: every segment tied, so the hit is 1/T and the rank (T + 1)/2 exactly.
    let chance: Vec<(f64, f64)> = located.iter().map(|l| hit_and_rank(&vec![0.0; l.segments], l.wrong)).collect();
    summarize("random", "uniform", chance, (0.0, 0.0), &mut per_trace);
    for (label, path) in &scores {
        let member = format!("scores.{label}");
        let rows_in: Vec<ScoreRow> = read_rows(path, Schema::Scores)?;
        let by: HashMap<(&str, i32), (usize, &ScoreRow)> = rows_in.iter().enumerate().map(|(i, r)| ((r.prompt_id.as_str(), r.sample_idx), (i, r))).collect();
        let mut blame_name = String::new();
        let mut results = Vec::with_capacity(located.len());
        for l in &located {
            let Some(&(i, row)) = by.get(&(l.prompt_id.as_str(), l.sample_idx)) else {
                bail!("input `{member}` ({}): no row for prompt {} sample {} (score the same rollouts and segments)", path.display(), l.prompt_id, l.sample_idx);
            };
            let at = || format!("input `{member}` ({}) row {i} (prompt {}, sample {})", path.display(), l.prompt_id, l.sample_idx);
            if row.sigma.len() != l.segments {
                bail!("{}: {} σ values for {} segments (score the same segments)", at(), row.sigma.len(), l.segments);
            }
            let blame = match blame_params.get(label) {
                Some(b) => *b,
                None => Blame::for_method(&row.method).ok_or_else(|| anyhow!("{}: no default blame for scores of method `{}`; set param blame.{label}", at(), row.method))?,
            };
            blame_name = blame.name().to_string();
            let b = blame.scores(row, l.segments).with_context(at)?;
            results.push(hit_and_rank(&b, l.wrong));
        }
        summarize(label, &blame_name, results, cost_per_trace(ctx, &member), &mut per_trace);
    }
    for (label, path) in &resets {
        let member = format!("resets.{label}");
        let picks: Vec<ResetPick> =
            read_table_columns(path, &["prompt_id", "sample_idx", "reset_step", "steps"]).map_err(|e| anyhow!("input `{member}`: {e} (a `reset` stage's resets table)"))?;
        let by: HashMap<(&str, i32), &ResetPick> = picks.iter().map(|p| ((p.prompt_id.as_str(), p.sample_idx), p)).collect();
        let mut results = Vec::with_capacity(located.len());
        for l in &located {
            let Some(p) = by.get(&(l.prompt_id.as_str(), l.sample_idx)) else {
                bail!("input `{member}` ({}): no reset of prompt {} sample {} (reset every incorrect trace of the same rollouts)", path.display(), l.prompt_id, l.sample_idx);
            };
            if p.steps as usize != l.segments || p.reset_step < 1 || p.reset_step > p.steps {
                bail!("input `{member}` ({}): prompt {} sample {}: reset_step {} of {} steps, but the trace has {} segments", path.display(), l.prompt_id, l.sample_idx, p.reset_step, p.steps, l.segments);
            }
            // One chosen step and no order over the others: a hit or a miss, no rank.
            let hit = if p.reset_step as usize == l.wrong + 1 { 1.0 } else { 0.0 };
            results.push((hit, f64::NAN));
        }
        summarize(label, "reset_step", results, cost_per_trace(ctx, &member), &mut per_trace);
    }
    write_report(ctx, &out, &title, &rows, &per_trace, &counts, located.len())?;
    for r in &rows {
        ctx.metric(&format!("top1_first_wrong_step.{}", r.method), if r.top1_first_wrong_step.is_nan() { serde_json::Value::Null } else { r.top1_first_wrong_step.into() });
    }
    Ok(())
}

/// `a 3, b 1` from the values of `items`, in key order.
fn tally<K: Ord + std::fmt::Display>(items: impl Iterator<Item = K>) -> String {
    let mut counts: BTreeMap<K, usize> = BTreeMap::new();
    for i in items {
        *counts.entry(i).or_default() += 1;
    }
    counts.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

fn write_report(ctx: &mut StageContext, out: &Path, title: &str, rows: &[MethodRow], per_trace: &[TraceRow], counts: &BTreeMap<String, i64>, located: usize) -> Result<()> {
    let mut md = format!("# {title}\n\n");
    // The chance rows carry one row per located trace.
    let located_rows: Vec<&TraceRow> = per_trace.iter().filter(|t| t.method == "random").collect();
    let incorrect: i64 = counts.iter().filter(|(k, _)| *k != "correct").map(|(_, v)| v).sum();
    let _ = writeln!(
        md,
        "{located} incorrect traces with a located first wrong step, of {incorrect} incorrect ({} correct). Not located: {}.\n",
        counts.get("correct").copied().unwrap_or(0),
        counts.iter().filter(|(k, _)| !["correct", "located"].contains(&k.as_str())).map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(md, "Where the first wrong step is (segment: traces): {}. What went wrong: {}.\n", tally(located_rows.iter().map(|l| l.first_wrong_segment)), tally(located_rows.iter().map(|l| l.error.as_str())));
    md += "`top1`: share of traces where the segment the method blames most is the first wrong step (ties share the hit); `mean_rank`: mean rank of the first wrong step in the method's blame order (1 = blamed most); `chance`: a random segment (1/T and (T + 1)/2 per trace). Blame rules: `drop` the largest drop of the value curve (ΔR + Δv), `max_sigma` the largest σ (the largest share of a negative advantage in the update), `min_sigma` the smallest σ, `min_value` the most negative R (LOO PMI), `max_value` the largest R (gradient norm), `reset_step` the step a reset stage chose (no rank). Cost: token positions run through the model and tokens generated per trace, from the scoring stage's run record.\n\n";
    md += &write_table(
        out,
        "credit_benchmark",
        rows,
        &["method", "blame", "traces", "top1", "top1_stderr", "mean_rank", "mean_rank_stderr", "chance_top1", "chance_mean_rank", "forward_tokens_per_trace", "tokens_generated_per_trace"],
        |r| {
            vec![
                Cell::Text(r.method.clone()),
                Cell::Text(r.blame.clone()),
                Cell::Int(r.traces),
                Cell::Num(r.top1_first_wrong_step),
                Cell::Num(r.top1_stderr),
                Cell::Num(r.mean_rank),
                Cell::Num(r.mean_rank_stderr),
                Cell::Num(r.chance_top1),
                Cell::Num(r.chance_mean_rank),
                Cell::Num(r.forward_tokens_per_trace),
                Cell::Num(r.tokens_generated_per_trace),
            ]
        },
    )?;
    md += "\nPer-trace results: `first_wrong_steps.csv` (one row per trace and method).\n\n";
    write_table(out, "first_wrong_steps", per_trace, &["prompt_id", "sample_idx", "segments", "first_wrong_segment", "error", "method", "hit", "rank"], |r| {
        vec![
            Cell::Text(r.prompt_id.clone()),
            Cell::Int(r.sample_idx as i64),
            Cell::Int(r.segments as i64),
            Cell::Int(r.first_wrong_segment as i64),
            Cell::Text(r.error.clone()),
            Cell::Text(r.method.clone()),
            Cell::Num(r.hit),
            Cell::Num(r.rank),
        ]
    })?;
    let mut figures = Vec::new();
    if located > 0 {
        let bars: Vec<Bar> = rows.iter().map(|r| Bar { label: r.method.clone(), value: r.top1_first_wrong_step, error: r.top1_stderr }).collect();
        let chance = rows.first().map_or(f64::NAN, |r| r.chance_top1);
        figures.extend(plots::bar_chart(&out.join("credit_top1"), "First wrong step blamed most (top-1, ± stderr)", "share of traces whose first wrong step the method blames most", &bars, Some(("chance", chance)))?);
        md += &figures_section(&figures);
    } else {
        md += "No figure: no trace with a located first wrong step.\n";
    }
    md += "\n## Provenance\n\n";
    let inputs: Vec<String> = ctx.inputs.keys().cloned().collect();
    for name in inputs {
        let _ = writeln!(md, "- {name}: {}", provenance(ctx, &name));
    }
    std::fs::write(out.join("results.md"), md)?;
    ctx.count("figures", figures.len() as i64);
    ctx.count("traces_benchmarked", located as i64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_params_struct_reads_the_shipped_stage_file() {
        use crate::engine::context::parse_params;
        let b: BenchmarkParams = parse_params("credit_benchmark", &crate::stages::shipped_defaults("credit_benchmark")).unwrap();
        assert!(b.blame.is_empty());
    }

    #[test]
    fn random_blame_hits_one_in_t_and_ranks_the_middle() {
        for t in 1..12 {
            for w in 0..t {
                assert_eq!(hit_and_rank(&vec![0.0; t], w), (1.0 / t as f64, (t as f64 + 1.0) / 2.0));
            }
        }
        // Ties at the top share the hit; a clear top is a full hit or a miss.
        assert_eq!(hit_and_rank(&[3.0, 1.0, 3.0], 2), (0.5, 1.5));
        assert_eq!(hit_and_rank(&[3.0, 1.0, 2.0], 0), (1.0, 1.0));
        assert_eq!(hit_and_rank(&[3.0, 1.0, 2.0], 1), (0.0, 3.0));
    }

    fn row(r: Vec<f64>, v: Vec<f64>, sigma: Vec<f64>, method: &str) -> ScoreRow {
        ScoreRow { prompt_id: "p".into(), sample_idx: 0, r, v, sigma, method: method.into() }
    }

    #[test]
    fn each_blame_rule_reads_its_columns() {
        // R: -5 -> -4 -> -9 -> -9 (segment 2 drops by 5), v: 0 -> 0 -> -1 -> -3.
        let s = row(vec![-5.0, -4.0, -9.0, -9.0], vec![0.0, 0.0, -1.0, -3.0], vec![0.1, 0.6, 0.3], "rredcot");
        assert_eq!(Blame::Drop.scores(&s, 3).unwrap(), vec![-1.0, 6.0, 2.0]);
        assert_eq!(Blame::MaxSigma.scores(&s, 3).unwrap(), vec![0.1, 0.6, 0.3]);
        assert_eq!(Blame::MinSigma.scores(&s, 3).unwrap(), vec![-0.1, -0.6, -0.3]);
        let loo = row(vec![0.5, -2.0, 1.0], vec![0.0; 3], vec![0.2, 0.6, 0.2], "loo");
        assert_eq!(Blame::for_method("loo"), Some(Blame::MinValue));
        assert_eq!(Blame::MinValue.scores(&loo, 3).unwrap(), vec![-0.5, 2.0, -1.0]);
        assert_eq!(Blame::MaxValue.scores(&loo, 3).unwrap(), vec![0.5, -2.0, 1.0]);
        // Terms = answer writes no v curve: the drop is ΔR alone.
        let answer_only = row(vec![-5.0, -4.0, -9.0, -9.0], vec![], vec![0.1, 0.6, 0.3], "rredcot");
        assert_eq!(Blame::Drop.scores(&answer_only, 3).unwrap(), vec![-1.0, 5.0, 0.0]);
        let e = Blame::Drop.scores(&s, 4).unwrap_err().to_string();
        assert!(e.contains("4 points for 4 segments"), "{e}");
        assert!(Blame::for_method("uniform").is_none());
    }

    #[test]
    fn a_line_maps_to_the_segment_holding_most_of_it() {
        let texts: Vec<String> = ["<think>\n", "Start", " with 9.\n", "Add 5: 9", " + 5 = 15\n", "</think>"].iter().map(|s| s.to_string()).collect();
        let seg = SegmentRow { prompt_id: "p".into(), sample_idx: 0, seg_starts: vec![0, 1, 3, 5], seg_ends: vec![1, 3, 5, 6], method: "keyword".into() };
        let text: String = texts.concat();
        let start = text.find("Add").unwrap();
        assert_eq!(segment_of(&(start..start + "Add 5: 9 + 5 = 15".len()), &texts, &seg), Some(2));
        assert_eq!(segment_of(&(0..3), &texts, &seg), Some(0));
        assert_eq!(segment_of(&(text.len()..text.len() + 4), &texts, &seg), None);
    }
}
