//! `report`: the last stage of a pipeline. From final evaluations (input group `evals.<row>`),
//! per-step evaluations (`curves.<method>`, usually `chain.eval[*].eval`) and optionally one
//! scored trace per method (`trace_rollouts|trace_segments|trace_scores|trace_tokenizer.<method>`)
//! it writes, into its `report` directory: the results table (`results.md`, `results.csv`,
//! `results.tex`), learning curves, σ heat-maps and value curves (SVG + PNG), and a provenance
//! section naming the instance key and artifact hash behind every row.

pub mod plots;
pub mod table;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::artifact::rows::{EvalRow, RolloutRow, ScoreRow, SegmentRow};
use crate::artifact::{read_rows, Schema};
use crate::engine::spec::{short, InputSource};
use crate::engine::StageContext;
use crate::evaluation::{summarize, BenchmarkSummary, Grader};
use plots::{LineChart, Series, PALETTE};
use table::{Cell, ResultsTable, TableRow};

/// Members of input group `group`: (label, path), in input-name order.
pub(crate) fn members<'a>(ctx: &'a StageContext, group: &str) -> Vec<(&'a str, &'a Path)> {
    let prefix = format!("{group}.");
    ctx.inputs.iter().filter_map(|(n, (_, p))| Some((n.strip_prefix(&prefix)?, p.as_path()))).collect()
}

/// `instance (key…) sha256 …` of an input: what the provenance section prints.
pub(crate) fn provenance(ctx: &StageContext, input: &str) -> String {
    let hash = ctx.input_hashes.get(input).map(|h| short(h).to_string()).unwrap_or_default();
    match ctx.input_sources.get(input) {
        Some(InputSource::Instance { key, stage, output }) => format!("{stage}.{output} (instance {}, artifact {hash})", short(key)),
        Some(InputSource::File { path }) => format!("file {} (artifact {hash})", path.display()),
        None => format!("artifact {hash}"),
    }
}

/// `## Figures` with a Markdown image link to each PNG of `figures` (files beside results.md).
pub(crate) fn figures_section(figures: &[PathBuf]) -> String {
    let mut md = "## Figures\n\n".to_string();
    for f in figures.iter().filter(|f| f.extension().is_some_and(|e| e == "png")) {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        let _ = writeln!(md, "![{name}]({name})");
    }
    md
}

/// The order of the table's rows: `rows` param if given, else the base row first, then the rest.
fn row_order(labels: &[&str], wanted: &[String], base: &str) -> Result<Vec<String>> {
    if !wanted.is_empty() {
        if let Some(missing) = wanted.iter().find(|w| !labels.contains(&w.as_str())) {
            bail!("param rows names `{missing}`, but there is no input `evals.{missing}` (have: {})", labels.join(", "));
        }
        return Ok(wanted.to_vec());
    }
    let mut order: Vec<String> = labels.iter().filter(|l| **l == base).map(|l| l.to_string()).collect();
    order.extend(labels.iter().filter(|l| **l != base).map(|l| l.to_string()));
    Ok(order)
}

fn build_table(title: &str, order: &[String], evals: &BTreeMap<String, (Vec<EvalRow>, String)>, base: &str, grader: Grader) -> ResultsTable {
    let summaries: BTreeMap<&str, Vec<BenchmarkSummary>> = evals.iter().map(|(l, (rows, _))| (l.as_str(), summarize(rows, grader))).collect();
    let mut benchmarks: Vec<String> = summaries.values().flatten().map(|s| s.benchmark.clone()).collect();
    benchmarks.sort();
    benchmarks.dedup();
    let find = |label: &str, b: &str| summaries.get(label).and_then(|v| v.iter().find(|s| s.benchmark == b)).cloned();
    let rows = order
        .iter()
        .map(|label| TableRow {
            label: label.clone(),
            cells: benchmarks
                .iter()
                .map(|b| {
                    find(label, b).map(|summary| Cell {
                        delta: (label != base).then(|| find(base, b).map(|bs| summary.mean - bs.mean)).flatten(),
                        summary,
                    })
                })
                .collect(),
            source: evals[label].1.clone(),
        })
        .collect();
    ResultsTable { title: title.to_string(), benchmarks, rows }
}

/// Mean avg@k over benchmarks (verifier) of one eval artifact: a point of a learning curve.
fn curve_point(rows: &[EvalRow]) -> f64 {
    let s = summarize(rows, Grader::Verifier);
    s.iter().map(|b| b.mean).sum::<f64>() / s.len().max(1) as f64
}

/// `curves.<label>[i]` members grouped by label, ordered by step i.
fn curves(ctx: &StageContext) -> Result<BTreeMap<String, Vec<(usize, PathBuf)>>> {
    let mut out: BTreeMap<String, Vec<(usize, PathBuf)>> = BTreeMap::new();
    for (name, path) in members(ctx, "curves") {
        let (label, step) = match name.strip_suffix(']').and_then(|n| n.rsplit_once('[')) {
            Some((l, i)) => (l, i.parse::<usize>().with_context(|| format!("input `curves.{name}`: step `{i}` is not a number"))?),
            None => (name, 0),
        };
        out.entry(label.to_string()).or_default().push((step, path.to_path_buf()));
    }
    for v in out.values_mut() {
        v.sort();
    }
    Ok(out)
}

struct Trace {
    label: String,
    prompt_id: String,
    sample_idx: i32,
    reward: f64,
    /// (segment text, σ_t)
    segments: Vec<(String, f64)>,
    r: Vec<f64>,
    v: Vec<f64>,
}

/// The trace shown for `label`: `trace_prompt_id`/`trace_sample_idx` if set, else the first
/// correct rollout that was scored (else the first scored one).
fn load_trace(ctx: &StageContext, label: &str) -> Result<Trace> {
    let input = |what: &str| ctx.input(&format!("trace_{what}.{label}")).map(Path::to_path_buf);
    let scores: Vec<ScoreRow> = read_rows(&input("scores")?, Schema::Scores)?;
    let rollouts: Vec<RolloutRow> = read_rows(&input("rollouts")?, Schema::Rollouts)?;
    let segments: Vec<SegmentRow> = read_rows(&input("segments")?, Schema::Segments)?;
    let tok = crate::stages::tokenizer_train::load(&input("tokenizer")?)?;
    let want_id: String = ctx.param("trace_prompt_id")?;
    let want_sample: i32 = ctx.param("trace_sample_idx")?;
    let rollout_of = |s: &ScoreRow| rollouts.iter().find(|r| r.prompt_id == s.prompt_id && r.sample_idx == s.sample_idx);
    let score = if !want_id.is_empty() {
        scores.iter().find(|s| s.prompt_id == want_id && s.sample_idx == want_sample)
    } else {
        scores.iter().find(|s| rollout_of(s).is_some_and(|r| r.reward > 0.0)).or(scores.first())
    };
    let Some(score) = score else {
        bail!("{}: no scored trace{}", input("scores")?.display(), if want_id.is_empty() { String::new() } else { format!(" for prompt {want_id} sample {want_sample}") });
    };
    let at = || format!("trace prompt {} sample {}", score.prompt_id, score.sample_idx);
    let rollout = rollout_of(score).with_context(|| format!("{}: not in {}", at(), input("rollouts").unwrap_or_default().display()))?;
    let seg = segments
        .iter()
        .find(|s| s.prompt_id == score.prompt_id && s.sample_idx == score.sample_idx)
        .with_context(|| format!("{}: not in {}", at(), input("segments").unwrap_or_default().display()))?;
    let ends = crate::credit::segmentation::checked_ends(&seg.seg_starts, &seg.seg_ends, rollout.cot_len())
        .map_err(|m| anyhow::anyhow!("{}: {m}", at()))?;
    if ends.len() != score.sigma.len() {
        bail!("{}: {} segments but {} σ values", at(), ends.len(), score.sigma.len());
    }
    let mut start = 0;
    let mut texts = Vec::with_capacity(ends.len());
    for &end in &ends {
        let ids: Vec<u32> = rollout.completion_ids[start..end].iter().map(|&t| t as u32).collect();
        texts.push(tok.decode(&ids, false).map_err(|e| anyhow::anyhow!("{}: decoding: {e}", at()))?);
        start = end;
    }
    Ok(Trace {
        label: label.to_string(),
        prompt_id: score.prompt_id.clone(),
        sample_idx: score.sample_idx,
        reward: rollout.reward,
        segments: texts.into_iter().zip(score.sigma.iter().copied()).collect(),
        r: score.r.clone(),
        v: score.v.clone(),
    })
}

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let title: String = ctx.param("title")?;
    let base: String = ctx.param("base")?;
    let wanted_rows: Vec<String> = ctx.param("rows")?;
    let out = ctx.output("report")?.to_path_buf();

    // `evals.<row>` or `evals.<row>/<part>`: a row may gather several eval artifacts (e.g. one
    // per benchmark set, evaluated by different stages).
    let mut evals: BTreeMap<String, (Vec<EvalRow>, String)> = BTreeMap::new();
    for (member, path) in members(ctx, "evals") {
        let rows: Vec<EvalRow> = read_rows(path, Schema::Eval)?;
        if rows.is_empty() {
            bail!("input `evals.{member}` ({}): no rows", path.display());
        }
        let label = member.split_once('/').map_or(member, |(row, _)| row);
        let entry = evals.entry(label.to_string()).or_default();
        if let Some(dup) = rows.iter().find(|r| entry.0.iter().any(|e| e.benchmark == r.benchmark)) {
            bail!("input `evals.{member}`: row `{label}` already has benchmark `{}` from another input", dup.benchmark);
        }
        entry.0.extend(rows);
        let source = provenance(ctx, &format!("evals.{member}"));
        entry.1 = if entry.1.is_empty() { source } else { format!("{}; {source}", entry.1) };
    }
    if evals.is_empty() {
        bail!("stage `{}`: nothing to report (wire inputs `evals.<method> = \"stage.eval\"`)", ctx.instance);
    }
    let labels: Vec<&str> = evals.keys().map(String::as_str).collect();
    let order = row_order(&labels, &wanted_rows, &base)?;

    let mut md = format!("# {title}\n\n");
    let mut csv = String::new();
    let mut tex = String::new();
    let mut tables = vec![build_table("avg@k, math verifier (%, ± stderr over problems; Δ vs base)", &order, &evals, &base, Grader::Verifier)];
    let judged = evals.values().any(|(rows, _)| rows.iter().any(|r| r.correct_judge.is_some()));
    if judged {
        tables.push(build_table("avg@k, LLM judge majority vote (%, ± stderr; Δ vs base)", &order, &evals, &base, Grader::Judge));
    }
    for (i, t) in tables.iter().enumerate() {
        md += &t.markdown();
        md += "\n";
        let c = t.csv();
        csv += if i == 0 { &c } else { c.split_once('\n').map(|x| x.1).unwrap_or("") };
        tex += &t.latex();
        tex += "\n";
        for r in &t.rows {
            for c in r.cells.iter().flatten() {
                let grader = if i == 0 { "verifier" } else { "judge" };
                ctx.metric(&format!("{grader}.{}.{}", r.label, c.summary.benchmark), c.summary.mean);
            }
        }
    }
    md += "Unparseable answers (no final answer found; counted wrong):";
    for label in &order {
        for s in summarize(&evals[label].0, Grader::Verifier) {
            let _ = write!(md, " {label}/{}: {}/{};", s.benchmark, s.unparseable, s.samples);
            ctx.count(&format!("unparseable.{label}.{}", s.benchmark), s.unparseable as i64);
        }
    }
    md += "\n";
    if judged {
        md += "\nJudge agreement with the verifier:";
        for label in &order {
            let graded: Vec<&EvalRow> = evals[label].0.iter().filter(|r| r.correct_judge.is_some()).collect();
            let agree = graded.iter().filter(|r| r.correct_judge == Some(r.correct_verifier)).count();
            let _ = write!(md, " {label}: {agree}/{};", graded.len());
        }
        md += "\n";
    }

    // Figures.
    let mut figures: Vec<PathBuf> = Vec::new();
    let curves = curves(ctx)?;
    if !curves.is_empty() {
        let start = evals.get(&base).map(|(rows, _)| curve_point(rows));
        let mut series = Vec::new();
        for (i, (label, steps)) in curves.iter().enumerate() {
            let mut points: Vec<(f64, f64)> = start.map(|y| vec![(0.0, y)]).unwrap_or_default();
            for (step, path) in steps {
                points.push(((step + 1) as f64, curve_point(&read_rows(path, Schema::Eval)?)));
            }
            ctx.metric(&format!("curve_final.{label}"), points.last().map(|p| p.1).unwrap_or(f64::NAN));
            series.push(Series { label: label.clone(), points, color: PALETTE[i % PALETTE.len()] });
        }
        let chart = LineChart {
            title: "Learning curves: avg@k (verifier) after each step".into(),
            x_desc: "training step (0 = base)".into(),
            y_desc: "avg@k".into(),
            series,
        };
        figures.extend(plots::line_chart(&out.join("learning_curves"), &chart)?);
    }
    let trace_labels: Vec<String> = members(ctx, "trace_scores").iter().map(|(l, _)| l.to_string()).collect();
    for label in &trace_labels {
        let t = load_trace(ctx, label)?;
        let what = format!("{} trace: prompt {} sample {} (reward {})", t.label, t.prompt_id, t.sample_idx, t.reward);
        figures.extend(plots::sigma_heatmap(&out.join(format!("sigma_heatmap_{label}")), &format!("σ per segment, {what}"), &t.segments)?);
        let xs = |v: &[f64]| v.iter().enumerate().map(|(i, y)| (i as f64, *y)).collect::<Vec<_>>();
        let chart = LineChart {
            title: format!("Value curves, {what}"),
            x_desc: "segments t".into(),
            y_desc: "log-probability".into(),
            series: vec![
                Series { label: "R_t = log p(y* | x, u_1..u_t)".into(), points: xs(&t.r), color: PALETTE[0] },
                Series { label: "v_t = log p(u* | x, u_1..u_t)".into(), points: xs(&t.v), color: PALETTE[1] },
            ],
        };
        figures.extend(plots::line_chart(&out.join(format!("value_curves_{label}")), &chart)?);
    }
    if !figures.is_empty() {
        md += "\n";
        md += &figures_section(&figures);
    }

    md += "\n## Provenance\n\nEach row's numbers come from these eval artifacts (`rredcot artifact show KEY` prints one and its run record):\n\n";
    for label in &order {
        let _ = writeln!(md, "- {label}: {}", evals[label].1);
    }
    for (label, steps) in &curves {
        let first = steps.first().map(|(i, _)| provenance(ctx, &format!("curves.{label}[{i}]"))).unwrap_or_default();
        let last = steps.last().map(|(i, _)| provenance(ctx, &format!("curves.{label}[{i}]"))).unwrap_or_default();
        let _ = writeln!(md, "- learning curve {label}: {} steps, from {first} to {last}", steps.len());
    }
    for label in &trace_labels {
        let _ = writeln!(md, "- trace {label}: {}", provenance(ctx, &format!("trace_scores.{label}")));
    }
    std::fs::write(out.join("results.md"), md)?;
    std::fs::write(out.join("results.csv"), csv)?;
    std::fs::write(out.join("results.tex"), tex)?;
    ctx.count("figures", figures.len() as i64);
    Ok(())
}
