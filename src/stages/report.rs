//! `report`: the last stage of a pipeline. From final evaluations (input group `evals.<row>`),
//! per-step evaluations (`curves.<method>`, usually `chain.eval[*].eval`) and optionally one
//! scored trace per method (`trace_rollouts|trace_segments|trace_scores|trace_tokenizer.<method>`)
//! it writes, into its `report` directory: the results table (`results.md`, `results.csv`,
//! `results.tex`), learning curves, σ heat-maps and value curves (SVG + PNG), and a provenance
//! section naming the instance key and artifact hash behind every row.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::artifact::rows::{EvalRow, RolloutRow, ScoreRow, SegmentRow};
use crate::artifact::{read_rows, Schema};
use crate::engine::{Builtin, Executable, StageContext};
use crate::evaluation::{summarize, BenchmarkSummary, Grader};
use crate::figures::plots::{self, LineChart, Series, PALETTE};
use crate::figures::table::{Cell, ResultsTable, TableRow};
use crate::figures::{figures_section, members, provenance};

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

/// One point of a learning curve: avg@k (verifier) of one benchmark at one step, with what it
/// was measured on (so every point of a curve is checked to be the same metric).
#[derive(Debug, Clone)]
struct CurvePoint {
    method: String,
    benchmark: String,
    step: i64,
    avg_at_k: f64,
    stderr: f64,
    problems: i64,
    k: i64,
}

/// The learning curves of every method, one metric per benchmark: step 0 is `start` (the base
/// policy evaluated the same way), step i + 1 is `curves.<method>[i]`. Every point of a benchmark
/// must be avg@k over the same problems with the same k; otherwise the curve would mix metrics
/// (an average over other benchmarks, another sample), and that is an error naming the input.
/// A `start` that is only a fallback (`required = false`: the table's base row) and measures
/// something else is left out with a note instead.
fn curve_points(curves: &BTreeMap<String, Vec<(usize, PathBuf)>>, start: Option<(&str, &[EvalRow], bool)>) -> Result<Vec<CurvePoint>> {
    // benchmark -> (problem ids, k, the input that set them)
    let mut shape: BTreeMap<String, (Vec<String>, usize, String)> = BTreeMap::new();
    let mut check = |input: &str, rows: &[EvalRow], s: &BenchmarkSummary| -> Result<()> {
        let mut ids: Vec<String> = rows.iter().filter(|r| r.benchmark == s.benchmark).map(|r| r.prompt_id.clone()).collect();
        ids.sort();
        ids.dedup();
        match shape.get(&s.benchmark) {
            None => {
                shape.insert(s.benchmark.clone(), (ids, s.k, input.to_string()));
            }
            Some((want, k, first)) if *want != ids || *k != s.k => bail!(
                "input `{input}`: benchmark `{}` is avg@{} over {} problems, but `{first}` has avg@{k} over {} problems (or other problems): a learning curve must measure the same thing at every step",
                s.benchmark, s.k, ids.len(), want.len()
            ),
            Some(_) => {}
        }
        Ok(())
    };
    let mut points = Vec::new();
    for (label, steps) in curves {
        for (step, path) in steps {
            let rows: Vec<EvalRow> = read_rows(path, Schema::Eval)?;
            let input = format!("curves.{label}[{step}]");
            for b in summarize(&rows, Grader::Verifier) {
                check(&input, &rows, &b)?;
                points.push(CurvePoint { method: label.clone(), benchmark: b.benchmark.clone(), step: *step as i64 + 1, avg_at_k: b.mean, stderr: b.stderr, problems: b.problems as i64, k: b.k as i64 });
            }
        }
    }
    // Step 0 for the benchmarks the curves measure (the base may have been evaluated on more).
    if let Some((input, rows, required)) = start {
        let measured: std::collections::BTreeSet<String> = points.iter().map(|p| p.benchmark.clone()).collect();
        for b in summarize(rows, Grader::Verifier).into_iter().filter(|b| measured.contains(&b.benchmark)) {
            match check(input, rows, &b) {
                Err(e) if !required => {
                    eprintln!("report: no step 0 for `{}`: {e:#} (wire `curve_start.<label>` to the base's per-step evaluation)", b.benchmark);
                    continue;
                }
                r => r?,
            }
            for label in curves.keys() {
                points.push(CurvePoint { method: label.clone(), benchmark: b.benchmark.clone(), step: 0, avg_at_k: b.mean, stderr: b.stderr, problems: b.problems as i64, k: b.k as i64 });
            }
        }
    }
    points.sort_by(|a, b| (&a.method, &a.benchmark, a.step).cmp(&(&b.method, &b.benchmark, b.step)));
    Ok(points)
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

/// The stage's params (stages/report.toml documents them).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportParams {
    title: String,
    /// The row the others are compared with.
    base: String,
    /// Row order (empty: every `evals.<row>` input, base first).
    rows: Vec<String>,
    /// The trace shown with its σ ("" = the first correct scored rollout).
    trace_prompt_id: String,
    trace_sample_idx: i32,
}

/// The trace shown for `label`: `trace_prompt_id`/`trace_sample_idx` if set, else the first
/// correct rollout that was scored (else the first scored one).
fn load_trace(ctx: &StageContext, p: &ReportParams, label: &str) -> Result<Trace> {
    let input = |what: &str| ctx.input(&format!("trace_{what}.{label}")).map(Path::to_path_buf);
    let scores: Vec<ScoreRow> = read_rows(&input("scores")?, Schema::Scores)?;
    let rollouts: Vec<RolloutRow> = read_rows(&input("rollouts")?, Schema::Rollouts)?;
    let segments: Vec<SegmentRow> = read_rows(&input("segments")?, Schema::Segments)?;
    let tok = crate::tokenizer_file::load(&input("tokenizer")?)?;
    let (want_id, want_sample) = (&p.trace_prompt_id, p.trace_sample_idx);
    let rollout_of = |s: &ScoreRow| rollouts.iter().find(|r| r.prompt_id == s.prompt_id && r.sample_idx == s.sample_idx);
    let score = if !want_id.is_empty() {
        scores.iter().find(|s| &s.prompt_id == want_id && s.sample_idx == want_sample)
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

pub const STAGE: Builtin = Builtin { name: "report", version: "2", runs_in: Executable::Engine, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: ReportParams = ctx.params()?;
    let (title, base, wanted_rows) = (p.title.clone(), p.base.clone(), p.rows.clone());
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
        // Step 0: `curve_start` (the base evaluated like every step), else the base row's evals.
        let start_rows: Option<(String, Vec<EvalRow>, bool)> = match members(ctx, "curve_start").as_slice() {
            [] => evals.get(&base).map(|(rows, _)| (format!("evals.{base}"), rows.clone(), false)),
            [(label, p)] => Some((format!("curve_start.{label}"), read_rows(p, Schema::Eval)?, true)),
            many => bail!("{} `curve_start.*` inputs; wire one (the base policy's per-step evaluation)", many.len()),
        };
        let points = curve_points(&curves, start_rows.as_ref().map(|(n, r, req)| (n.as_str(), r.as_slice(), *req)))?;
        // The plotted numbers, one row per (method, benchmark, step).
        let mut curve_csv = "method,benchmark,step,avg_at_k,stderr,problems,k\n".to_string();
        for p in &points {
            let _ = writeln!(curve_csv, "{},{},{},{},{},{},{}", p.method, p.benchmark, p.step, p.avg_at_k, p.stderr, p.problems, p.k);
        }
        std::fs::write(out.join("learning_curves.csv"), curve_csv)?;
        let benchmarks: std::collections::BTreeSet<&str> = points.iter().map(|p| p.benchmark.as_str()).collect();
        for bench in benchmarks {
            let mut series = Vec::new();
            for (i, label) in curves.keys().enumerate() {
                let mine: Vec<&CurvePoint> = points.iter().filter(|p| p.benchmark == bench && &p.method == label).collect();
                if let Some(last) = mine.last() {
                    ctx.metric(&format!("curve_final.{label}.{bench}"), last.avg_at_k);
                }
                series.push(Series {
                    label: label.clone(),
                    points: mine.iter().map(|p| (p.step as f64, p.avg_at_k)).collect(),
                    errors: mine.iter().map(|p| p.stderr).collect(),
                    color: PALETTE[i % PALETTE.len()],
                });
            }
            let k = points.iter().find(|p| p.benchmark == bench).map(|p| (p.k, p.problems)).unwrap_or_default();
            let chart = LineChart {
                title: format!("Learning curves, {bench}: avg@{} over {} problems (± stderr)", k.0, k.1),
                x_desc: "training step (0 = base)".into(),
                y_desc: format!("avg@{} (verifier)", k.0),
                series,
            };
            figures.extend(plots::line_chart(&out.join(format!("learning_curves_{bench}")), &chart)?);
        }
    }
    let trace_labels: Vec<String> = members(ctx, "trace_scores").iter().map(|(l, _)| l.to_string()).collect();
    for label in &trace_labels {
        let t = load_trace(ctx, &p, label)?;
        let what = format!("{} trace: prompt {} sample {} (reward {})", t.label, t.prompt_id, t.sample_idx, t.reward);
        figures.extend(plots::sigma_heatmap(&out.join(format!("sigma_heatmap_{label}")), &format!("σ per segment, {what}"), &t.segments)?);
        let xs = |v: &[f64]| v.iter().enumerate().map(|(i, y)| (i as f64, *y)).collect::<Vec<_>>();
        let chart = LineChart {
            title: format!("Value curves, {what}"),
            x_desc: "segments t".into(),
            y_desc: "log-probability".into(),
            series: vec![
                Series { label: "R_t = log p(y* | x, u_1..u_t)".into(), points: xs(&t.r), errors: Vec::new(), color: PALETTE[0] },
                Series { label: "v_t = log p(u* | x, u_1..u_t)".into(), points: xs(&t.v), errors: Vec::new(), color: PALETTE[1] },
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_params_struct_reads_the_shipped_stage_file() {
        let p: super::ReportParams = crate::engine::context::parse_params("report", &crate::stages::shipped_defaults("report")).unwrap();
        assert_eq!((p.base.as_str(), p.trace_sample_idx), ("base", 0));
    }
}
