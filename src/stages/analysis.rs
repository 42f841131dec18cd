//! `analysis`: the paper's analysis figures from scored traces, as a pipeline stage.
//! - Fig. 4 (`scores.<method>` group, `reference` param): correlation of every method's
//!   per-segment σ with the reference method's (Monte Carlo values) along the trace
//!   ([`correlation`](crate::analysis::correlation));
//! - Fig. 3 (`completions.<label>`, `score_mc` runs at different `max_new_tokens`): fraction of MC
//!   completions lost to truncation against the truncation length ([`truncation`](crate::analysis::truncation));
//! - Fig. 7 (`mc_sd.<label>`): SD of the MC value estimate against the number of completions,
//!   with the threshold line and the first k below it ([`mc_sd`](crate::analysis::mc_sd)).
//!
//! Every group is optional (a missing one is named as skipped in `results.md`), but a stage with
//! none is an error. The output `report` is a flat directory like the `report` stage's
//! (`rredcot report P.toml --stage <name>` exports it): `results.md`, each table as `<name>.csv`
//! and `<name>.parquet`, each figure as SVG + PNG. Correlation statistics live in [`stats`](crate::analysis::stats).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::analysis::correlation::{self, CorrelationRow, TracePositions};
use crate::analysis::mc_sd::{self, SdRow};
use crate::analysis::truncation::{self, TruncationRow};
use crate::artifact::rows::ScoreRow;
use crate::artifact::{read_rows, read_table_columns, Schema};
use crate::engine::{Builtin, Executable, StageContext};
use crate::figures::plots::{self, LineChart, Series, PALETTE};
use crate::figures::{figures_section, members, provenance, write_table, Cell};

/// The stage's params (stages/analysis.toml documents them).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AnalysisParams {
    title: String,
    /// Fig. 4: the method σ is correlated with, and the position bins along the trace.
    reference: String,
    bins: usize,
    /// Fig. 4: `reference` (every method against the reference) or `all` (and every other pair
    /// of methods too: the paper's gradient attribution against LOO).
    pairs: Pairs,
    /// Fig. 4: where a segment sits along its trace: by its index among the trace's segments, or
    /// by its middle token among the trace's tokens (input `segments.<label>`).
    position: Position,
    /// Fig. 7: the SD line drawn.
    sd_threshold: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum Pairs {
    Reference,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum Position {
    Segments,
    Tokens,
}

/// Fig. 4's segment positions: by index, or (`position = "tokens"`) by token from the one
/// `segments.<label>` input, which is read for nothing else.
fn positions(ctx: &StageContext, p: &AnalysisParams, refs: &[ScoreRow], ref_sigma: &[&[f64]]) -> Result<Vec<TracePositions>> {
    let wired = members(ctx, "segments");
    let reference = format!("scores.{}", p.reference);
    match (p.position, wired.as_slice()) {
        (Position::Segments, []) => Ok(correlation::by_segment(ref_sigma)),
        (Position::Segments, [(label, _), ..]) => bail!("stage `{}`: input `segments.{label}` is read only with position = \"tokens\" (position is \"segments\")", ctx.instance),
        (Position::Tokens, [(label, path)]) => correlation::by_token(&format!("segments.{label}"), &read_rows(path, Schema::Segments)?, &reference, refs),
        (Position::Tokens, _) => bail!("stage `{}`: position = \"tokens\" needs one input `segments.<label>`, the segmentation the methods scored ({} wired)", ctx.instance, wired.len()),
    }
}

/// Fig. 4: `correlations` table and its line charts (three; five with `pairs = "all"`), or the
/// line saying why it was skipped.
fn fig4(ctx: &mut StageContext, p: &AnalysisParams, out: &Path, md: &mut String, figures: &mut Vec<PathBuf>) -> Result<()> {
    let (reference, bins) = (p.reference.as_str(), p.bins);
    let scores: Vec<(String, PathBuf)> = members(ctx, "scores").into_iter().map(|(l, p)| (l.to_string(), p.to_path_buf())).collect();
    *md += &format!("## Fig. 4: correlation of σ with `{reference}` along the trace\n\n");
    if scores.is_empty() {
        *md += "Skipped: no `scores.<method>` inputs.\n\n";
        return Ok(());
    }
    if bins == 0 {
        bail!("stage `{}`: bins must be positive", ctx.instance);
    }
    let Some((_, ref_path)) = scores.iter().find(|(l, _)| *l == reference) else {
        let have: Vec<&str> = scores.iter().map(|(l, _)| l.as_str()).collect();
        bail!("stage `{}`: param reference = `{reference}`, but there is no input `scores.{reference}` (have: {})", ctx.instance, have.join(", "));
    };
    let refs: Vec<ScoreRow> = read_rows(ref_path, Schema::Scores)?;
    if refs.is_empty() {
        bail!("input `scores.{reference}` ({}): no rows", ref_path.display());
    }
    let ref_sigma: Vec<&[f64]> = refs.iter().map(|r| r.sigma.as_slice()).collect();
    let at = positions(ctx, p, &refs, &ref_sigma)?;
    let mut rows: Vec<CorrelationRow> = Vec::new();
    // Every method's σ in the reference's trace order, so that any two can be paired.
    let mut methods: Vec<(&str, Vec<ScoreRow>)> = Vec::new();
    for (label, path) in scores.iter().filter(|(l, _)| *l != reference) {
        methods.push((label.as_str(), read_rows(path, Schema::Scores)?));
    }
    let mut aligned: Vec<(&str, Vec<&[f64]>)> = Vec::new();
    for (label, mine) in &methods {
        let sigma = correlation::align(&format!("scores.{label}"), mine, &format!("scores.{reference}"), &refs)?;
        rows.extend(correlation::correlate(label, reference, &sigma, &ref_sigma, &at, bins));
        aligned.push((label, sigma));
    }
    if p.pairs == Pairs::All {
        for (i, (a, sigma_a)) in aligned.iter().enumerate() {
            for (b, sigma_b) in &aligned[i + 1..] {
                rows.extend(correlation::correlate(a, b, sigma_a, sigma_b, &at, bins));
            }
        }
    }
    if rows.is_empty() {
        *md += &format!("Skipped: `scores.{reference}` is the only scores input (nothing to compare with it).\n\n");
        return Ok(());
    }
    let segments: usize = ref_sigma.iter().map(|s| s.len()).sum();
    let _ = write!(
        md,
        "{} traces, {segments} segments, {bins} position bins. {} `bin`: pairs (σ_method, σ_{reference}) pooled over traces within a position window; `from_right`: the last fraction 1 − pos_lo of every trace (the paper's x-axis); `per_trace`: the coefficient within each trace, averaged over the `n` traces where it is defined. – = undefined (fewer than 2 pairs or a constant side). `spearman_p`, `pearson_p`: two-sided p-values against no correlation, as scipy's `spearmanr`/`pearsonr` give them; they take the pooled segments as independent, which segments of one trace are not, so they overstate the evidence (a mean over traces has none).\n\n",
        refs.len(),
        match p.position {
            Position::Segments => "Segment t of T sits at (t + ½)/T (param `position = \"segments\"`).",
            Position::Tokens => "A segment sits at its middle token as a fraction of its trace's tokens: [s, e) of n at ((s + e)/2)/n (param `position = \"tokens\"`).",
        }
    );
    if p.pairs == Pairs::All {
        *md += "With `pairs = \"all\"`, the rows whose `reference` is another method pair the two methods the same way (each pair once).\n\n";
    }
    let columns = ["method", "reference", "view", "pos_lo", "pos_hi", "spearman", "pearson", "spearman_p", "pearson_p", "n"];
    *md += &write_table(out, "correlations", &rows, &columns, |r| {
        vec![
            Cell::Text(r.method.clone()),
            Cell::Text(r.reference.clone()),
            Cell::Text(r.view.clone()),
            Cell::Num(r.pos_lo),
            Cell::Num(r.pos_hi),
            Cell::Num(r.spearman),
            Cell::Num(r.pearson),
            Cell::Sci(r.spearman_p),
            Cell::Sci(r.pearson_p),
            Cell::Int(r.n),
        ]
    })?;
    *md += "\n";
    let undefined = rows.iter().filter(|r| r.spearman.is_nan()).count();
    ctx.count("correlations", rows.len() as i64);
    ctx.count("correlations_undefined", undefined as i64);
    // The pairs drawn: each method against the reference, then (pairs = "all") the others.
    let mut pairs: Vec<(&str, &str)> = rows.iter().map(|r| (r.method.as_str(), r.reference.as_str())).collect();
    pairs.dedup();
    for (m, rf) in &pairs {
        if let Some(r) = rows.iter().find(|r| (r.method.as_str(), r.reference.as_str()) == (*m, *rf) && r.view == "per_trace") {
            let key = if *rf == reference { format!("spearman_per_trace.{m}") } else { format!("spearman_per_trace.{m}~{rf}") };
            ctx.metric(&key, if r.spearman.is_nan() { serde_json::Value::Null } else { r.spearman.into() });
        }
    }
    // One chart per quantity for the methods against the reference (the paper's panels), and
    // with pairs = "all" the same for the other pairs, so that no chart repeats a colour.
    let chart = |pairs: &[(&str, &str)], view: &str, x: fn(&CorrelationRow) -> f64, y: fn(&CorrelationRow) -> f64, title: String, x_desc: &str, y_desc: &str| LineChart {
        title,
        x_desc: x_desc.into(),
        y_desc: y_desc.into(),
        series: pairs
            .iter()
            .enumerate()
            .map(|(i, (m, rf))| Series {
                label: if *rf == reference { m.to_string() } else { format!("{m} ~ {rf}") },
                points: rows.iter().filter(|r| (r.method.as_str(), r.reference.as_str()) == (*m, *rf) && r.view == view).map(|r| (x(r), y(r))).collect(),
                errors: Vec::new(),
                color: PALETTE[i % PALETTE.len()],
            })
            .collect(),
    };
    let centre = |r: &CorrelationRow| (r.pos_lo + r.pos_hi) / 2.0;
    let from_right = |r: &CorrelationRow| 1.0 - r.pos_lo;
    let rho = |r: &CorrelationRow| r.spearman;
    // The paper's red lines: log p of the same coefficients (a p-value of 0 is drawn at the
    // smallest positive double).
    let log_p = |r: &CorrelationRow| r.spearman_p.max(f64::MIN_POSITIVE).log10();
    let against: Vec<(&str, &str)> = pairs.iter().copied().filter(|(_, rf)| *rf == reference).collect();
    let others: Vec<(&str, &str)> = pairs.iter().copied().filter(|(_, rf)| *rf != reference).collect();
    let right_desc = "fraction of the trace used, from the right";
    let by_pos = chart(&against, "bin", centre, rho, format!("Spearman ρ with {reference} by position in the trace"), "position in the trace (bin centre)", "Spearman ρ");
    figures.extend(plots::line_chart(&out.join("fig4_by_position"), &by_pos)?);
    let right = chart(&against, "from_right", from_right, rho, format!("Spearman ρ with {reference} on the last part of each trace"), right_desc, "Spearman ρ");
    figures.extend(plots::line_chart(&out.join("fig4_from_right"), &right)?);
    let right_p = chart(&against, "from_right", from_right, log_p, format!("log10 p-value of Spearman ρ with {reference}, last part of each trace"), right_desc, "log10 p");
    figures.extend(plots::line_chart(&out.join("fig4_from_right_log_p"), &right_p)?);
    if !others.is_empty() {
        let right = chart(&others, "from_right", from_right, rho, "Spearman ρ of the other pairs of methods on the last part of each trace".into(), right_desc, "Spearman ρ");
        figures.extend(plots::line_chart(&out.join("fig4_pairs_from_right"), &right)?);
        let right_p = chart(&others, "from_right", from_right, log_p, "log10 p-value of Spearman ρ of the other pairs, last part of each trace".into(), right_desc, "log10 p");
        figures.extend(plots::line_chart(&out.join("fig4_pairs_from_right_log_p"), &right_p)?);
    }
    Ok(())
}

/// Fig. 3: `truncation` table and chart.
fn fig3(ctx: &mut StageContext, out: &Path, md: &mut String, figures: &mut Vec<PathBuf>) -> Result<()> {
    *md += "## Fig. 3: MC completions lost to truncation\n\n";
    let mut rows: Vec<TruncationRow> = Vec::new();
    for (label, path) in members(ctx, "completions") {
        let member = format!("completions.{label}");
        let comps: Vec<truncation::Completion> = read_table_columns(path, truncation::COLUMNS).map_err(|e| anyhow::anyhow!("input `{member}`: {e} (written by score_mc version ≥ 2)"))?;
        rows.push(truncation::summarize(&member, label, &comps)?);
    }
    if rows.is_empty() {
        *md += "Skipped: no `completions.<label>` inputs.\n\n";
        return Ok(());
    }
    rows.sort_by(|a, b| (a.max_new_tokens, &a.label).cmp(&(b.max_new_tokens, &b.label)));
    *md += "One row per `score_mc` completions artifact: `truncated` = hit max_new_tokens, `lost` = truncated without an explicit final answer.\n\n";
    *md += &write_table(out, "truncation", &rows, &["label", "max_new_tokens", "completions", "truncated_fraction", "lost_fraction", "correct_fraction", "mean_tokens"], |r| {
        vec![
            Cell::Text(r.label.clone()),
            Cell::Int(r.max_new_tokens as i64),
            Cell::Int(r.completions),
            Cell::Num(r.truncated_fraction),
            Cell::Num(r.lost_fraction),
            Cell::Num(r.correct_fraction),
            Cell::Num(r.mean_tokens),
        ]
    })?;
    *md += "\n";
    for r in &rows {
        ctx.metric(&format!("lost_fraction.{}", r.label), r.lost_fraction);
    }
    let pts = |f: fn(&TruncationRow) -> f64| rows.iter().map(|r| (r.max_new_tokens as f64, f(r))).collect();
    let chart = LineChart {
        title: "MC completions lost to truncation".into(),
        x_desc: "truncation length (max_new_tokens)".into(),
        y_desc: "fraction of completions".into(),
        series: vec![
            Series { label: "lost (no final answer)".into(), points: pts(|r| r.lost_fraction), errors: Vec::new(), color: PALETTE[3] },
            Series { label: "truncated".into(), points: pts(|r| r.truncated_fraction), errors: Vec::new(), color: PALETTE[0] },
        ],
    };
    figures.extend(plots::line_chart(&out.join("fig3_truncation"), &chart)?);
    Ok(())
}

/// Fig. 7: `mc_sd` table and chart with the threshold line.
fn fig7(ctx: &mut StageContext, p: &AnalysisParams, out: &Path, md: &mut String, figures: &mut Vec<PathBuf>) -> Result<()> {
    let threshold = p.sd_threshold;
    *md += "## Fig. 7: SD of the MC value estimate vs completions\n\n";
    let mut groups: Vec<(String, Vec<SdRow>)> = Vec::new();
    for (label, path) in members(ctx, "mc_sd") {
        let member = format!("mc_sd.{label}");
        let input: Vec<mc_sd::SdIn> = read_table_columns(path, mc_sd::COLUMNS).map_err(|e| anyhow::anyhow!("input `{member}`: {e}"))?;
        groups.push((label.to_string(), mc_sd::rows(&member, label, &input)?));
    }
    if groups.is_empty() {
        *md += "Skipped: no `mc_sd.<label>` inputs.\n\n";
        return Ok(());
    }
    for (label, rows) in &groups {
        match mc_sd::first_below(rows, threshold) {
            Some(k) => {
                let _ = writeln!(md, "- {label}: bootstrap SD < {threshold} from k = {k}");
                ctx.metric(&format!("k_sd_below.{label}"), k);
            }
            None => {
                let _ = writeln!(md, "- {label}: bootstrap SD never below {threshold} (k ≤ {})", rows.last().map_or(0, |r| r.k));
            }
        }
    }
    *md += "\nSD of the mean of k completions, averaged over `exit_points`: bootstrapped from the k drawn, and binomial √(p̂(1−p̂)/k).\n\n";
    let all: Vec<SdRow> = groups.iter().flat_map(|(_, r)| r.iter().cloned()).collect();
    *md += &write_table(out, "mc_sd", &all, &["label", "k", "sd_bootstrap", "sd_binomial", "exit_points"], |r| {
        vec![Cell::Text(r.label.clone()), Cell::Int(r.k as i64), Cell::Num(r.sd_bootstrap), Cell::Num(r.sd_binomial), Cell::Int(r.exit_points as i64)]
    })?;
    *md += "\n";
    let mut series = Vec::new();
    for (i, (label, rows)) in groups.iter().enumerate() {
        let color = PALETTE[(2 * i) % PALETTE.len()];
        series.push(Series { label: format!("{label} bootstrap"), points: rows.iter().map(|r| (r.k as f64, r.sd_bootstrap)).collect(), errors: Vec::new(), color });
        series.push(Series {
            label: format!("{label} binomial"),
            points: rows.iter().map(|r| (r.k as f64, r.sd_binomial)).collect(),
            errors: Vec::new(),
            color: PALETTE[(2 * i + 1) % PALETTE.len()],
        });
    }
    let (k0, k1) = all.iter().fold((i32::MAX, i32::MIN), |(a, b), r| (a.min(r.k), b.max(r.k)));
    series.push(Series { label: format!("SD = {threshold}"), points: vec![(k0 as f64, threshold), (k1 as f64, threshold)], errors: Vec::new(), color: PALETTE[5] });
    let chart = LineChart { title: "SD of the MC value estimate".into(), x_desc: "MC samples k".into(), y_desc: "SD".into(), series };
    figures.extend(plots::line_chart(&out.join("fig7_mc_sd"), &chart)?);
    Ok(())
}

pub const STAGE: Builtin = Builtin { name: "analysis", version: "3", runs_in: Executable::Engine, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: AnalysisParams = ctx.params()?;
    let title = p.title.clone();
    let out = ctx.output("report")?.to_path_buf();
    // What is analysed; `segments` only places Fig. 4's segments.
    let analysed = ["scores", "completions", "mc_sd"];
    let groups = [&analysed[..], &["segments"]].concat();
    if analysed.iter().all(|g| members(ctx, g).is_empty()) {
        bail!("stage `{}`: nothing to analyse (wire inputs `scores.<method>`, `completions.<label>` or `mc_sd.<label>`)", ctx.instance);
    }
    let mut md = format!("# {title}\n\n");
    let mut figures: Vec<PathBuf> = Vec::new();
    fig4(ctx, &p, &out, &mut md, &mut figures)?;
    fig3(ctx, &out, &mut md, &mut figures)?;
    fig7(ctx, &p, &out, &mut md, &mut figures)?;
    if !figures.is_empty() {
        md += &figures_section(&figures);
    }
    md += "\n## Provenance\n\n";
    for g in groups {
        for (label, _) in members(ctx, g) {
            let _ = writeln!(md, "- {g}.{label}: {}", provenance(ctx, &format!("{g}.{label}")));
        }
    }
    std::fs::write(out.join("results.md"), md)?;
    ctx.count("figures", figures.len() as i64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{json, Map, Value};

    use super::*;
    use crate::artifact::write_rows;
    use serde::Serialize;

    #[test]
    fn the_params_structs_read_the_shipped_stage_files() {
        use crate::engine::context::parse_params;
        use crate::stages::shipped_defaults;
        let a: AnalysisParams = parse_params("analysis", &shipped_defaults("analysis")).unwrap();
        assert_eq!((a.reference.as_str(), a.bins), ("mc20", 5));
        let mut typo = shipped_defaults("analysis");
        typo.insert("bin".into(), 3.into());
        let e = parse_params::<AnalysisParams>("analysis", &typo).unwrap_err().to_string();
        assert!(e.contains("stage `analysis`") && e.contains("unknown field `bin`"), "{e}");
    }

    /// A context for the `analysis` stage with hand-made inputs `name -> (schema, file)` in `dir`.
    fn ctx(dir: &Path, inputs: &[(&str, Schema)], params: Value) -> StageContext {
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let mut p: Map<String, Value> = json!({ "title": "T", "reference": "mc", "bins": 2, "pairs": "reference", "position": "segments", "sd_threshold": 0.1 }).as_object().unwrap().clone();
        p.extend(params.as_object().unwrap().clone());
        StageContext {
            instance: "analysis".into(),
            key: "k".into(),
            params: p,
            inputs: inputs.iter().map(|(n, s)| (n.to_string(), (s.info(), dir.join(format!("{n}.parquet"))))).collect(),
            input_hashes: BTreeMap::new(),
            input_sources: BTreeMap::new(),
            outputs: [("report".to_string(), (Schema::Dir.info(), out))].into(),
            scratch: dir.join("scratch"),
            cache_dir: dir.join("cache"),
            counters: BTreeMap::new(),
            metrics: Map::new(),
        }
    }

    fn scores(dir: &Path, name: &str, sigmas: &[(&str, &[f64])]) {
        let rows: Vec<ScoreRow> = sigmas
            .iter()
            .map(|(id, s)| ScoreRow { prompt_id: id.to_string(), sample_idx: 0, r: vec![0.0; s.len() + 1], v: vec![0.0; s.len() + 1], sigma: s.to_vec(), method: "m".into() })
            .collect();
        write_rows(&dir.join(format!("{name}.parquet")), Schema::Scores, &rows).unwrap();
    }

    /// `position = "tokens"`: segments sit at their middle token, read from the one
    /// `segments.<label>` input; without it, or with it under `position = "segments"`, an error.
    #[test]
    fn fig4_by_token_position_reads_the_segmentation() {
        use crate::artifact::rows::SegmentRow;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // One trace of segments of 1, 1 and 8 tokens: by index, two are in the last half; by
        // token, only the long one.
        scores(d, "scores.mc", &[("a", &[0.2, 0.3, 0.5])]);
        scores(d, "scores.x", &[("a", &[0.1, 0.2, 0.7])]);
        let seg = SegmentRow { prompt_id: "a".into(), sample_idx: 0, seg_starts: vec![0, 1, 2], seg_ends: vec![1, 2, 10], method: "entropy".into() };
        write_rows(&d.join("segments.seg.parquet"), Schema::Segments, &[seg]).unwrap();
        let scores_in = [("scores.mc", Schema::Scores), ("scores.x", Schema::Scores)];
        let with_segments = [scores_in[0], scores_in[1], ("segments.seg", Schema::Segments)];
        let last_half_n = |md: &str| md.lines().find(|l| l.starts_with("| x | mc | from_right | 0.500 |")).and_then(|l| l.split('|').nth(10)).map(|n| n.trim().to_string());
        let mut c = ctx(d, &with_segments, json!({ "position": "tokens" }));
        run(&mut c).unwrap();
        let md = std::fs::read_to_string(d.join("out/results.md")).unwrap();
        assert!(md.contains("at its middle token") && md.contains("- segments.seg:"), "{md}");
        assert_eq!(last_half_n(&md).as_deref(), Some("1"), "{md}");
        let mut c = ctx(d, &scores_in, json!({}));
        run(&mut c).unwrap();
        let md = std::fs::read_to_string(d.join("out/results.md")).unwrap();
        assert_eq!(last_half_n(&md).as_deref(), Some("2"), "{md}");
        let e = run(&mut ctx(d, &scores_in, json!({ "position": "tokens" }))).unwrap_err().to_string();
        assert!(e.contains("position = \"tokens\" needs one input `segments.<label>`") && e.contains("0 wired"), "{e}");
        let e = run(&mut ctx(d, &with_segments, json!({}))).unwrap_err().to_string();
        assert!(e.contains("input `segments.seg` is read only with position = \"tokens\""), "{e}");
    }

    #[derive(Serialize)]
    struct Comp {
        tokens: i32,
        correct: bool,
        truncated: bool,
        lost: bool,
        max_new_tokens: i32,
    }

    use crate::analysis::mc_sd::SdIn as Sd;

    #[test]
    fn every_group_from_hand_made_artifacts() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        scores(d, "scores.mc", &[("a", &[0.1, 0.2, 0.3, 0.4]), ("b", &[0.4, 0.3, 0.2, 0.1])]);
        scores(d, "scores.same", &[("b", &[0.4, 0.3, 0.2, 0.1]), ("a", &[0.1, 0.2, 0.3, 0.4])]);
        let comps = |n: i32, lost: usize| (0..4).map(|i| Comp { tokens: n, correct: false, truncated: i < 2, lost: i < lost, max_new_tokens: n }).collect::<Vec<_>>();
        write_rows(&d.join("completions.short.parquet"), Schema::Table, &comps(16, 2)).unwrap();
        write_rows(&d.join("completions.long.parquet"), Schema::Table, &comps(8, 1)).unwrap();
        let sd: Vec<Sd> = [0.3, 0.12, 0.08].iter().enumerate().map(|(i, &s)| Sd { k: i as i32 + 1, sd_bootstrap: s, sd_binomial: s, exit_points: 3 }).collect();
        write_rows(&d.join("mc_sd.k3.parquet"), Schema::Table, &sd).unwrap();
        let inputs = [
            ("scores.mc", Schema::Scores),
            ("scores.same", Schema::Scores),
            ("completions.short", Schema::Table),
            ("completions.long", Schema::Table),
            ("mc_sd.k3", Schema::Table),
        ];
        let mut c = ctx(d, &inputs, json!({}));
        run(&mut c).unwrap();
        let out = d.join("out");
        let md = std::fs::read_to_string(out.join("results.md")).unwrap();
        assert!(md.contains("| same | mc | per_trace | 0.000 | 1.000 | 1.000 | 1.000 | – | – | 2 |"), "{md}");
        // The pooled last half: 4 equal pairs, ρ = 1 and p ≈ 0 (round-off leaves ρ a hair below 1).
        let half = md.lines().find(|l| l.starts_with("| same | mc | from_right | 0.500 |")).expect("the last half's row");
        let cols: Vec<&str> = half.split('|').map(str::trim).collect();
        assert!(cols[6] == "1.000" && cols[8..10].iter().all(|p| p.parse::<f64>().is_ok_and(|p| p < 1e-12)), "{half}");
        assert!(md.contains("- k3: bootstrap SD < 0.1 from k = 3"), "{md}");
        // Rows in order of the column max_new_tokens (8 before 16), whatever the labels say.
        let csv = std::fs::read_to_string(out.join("truncation.csv")).unwrap();
        assert_eq!(csv.lines().skip(1).map(|l| l.split(',').take(5).collect::<Vec<_>>().join(",")).collect::<Vec<_>>(), vec!["long,8,4,0.5,0.25", "short,16,4,0.5,0.5"]);
        for f in ["fig4_by_position.png", "fig4_from_right.svg", "fig4_from_right_log_p.png", "fig3_truncation.png", "fig7_mc_sd.png", "correlations.parquet", "mc_sd.csv"] {
            assert!(out.join(f).is_file(), "{f}");
        }
        assert_eq!((c.counters["figures"], c.metrics["k_sd_below.k3"].as_i64()), (10, Some(3)));
        assert!(!md.contains("| same | rev |"), "pairs = reference: against the reference only");

        // pairs = "all": every other pair of methods too, aligned through the reference.
        scores(d, "scores.rev", &[("a", &[0.4, 0.3, 0.2, 0.1]), ("b", &[0.1, 0.2, 0.3, 0.4])]);
        let three = [("scores.mc", Schema::Scores), ("scores.same", Schema::Scores), ("scores.rev", Schema::Scores)];
        let mut c = ctx(d, &three, json!({ "pairs": "all" }));
        run(&mut c).unwrap();
        let md = std::fs::read_to_string(d.join("out/results.md")).unwrap();
        assert!(md.contains("| rev | mc | per_trace | 0.000 | 1.000 | -1.000 | -1.000 | – | – | 2 |"), "{md}");
        assert!(md.contains("| rev | same | per_trace | 0.000 | 1.000 | -1.000 | -1.000 | – | – | 2 |"), "{md}");
        assert_eq!(md.matches("| same | rev |").count(), 0, "each pair once");
        assert!(c.metrics["spearman_per_trace.rev~same"].as_f64().is_some_and(|r| (r + 1.0).abs() < 1e-12), "{:?}", c.metrics);
        assert_eq!(c.counters["correlations"], 3 * (2 + 2 + 1));
        // Its charts: the methods against the reference, then the other pair on its own.
        assert!(d.join("out/fig4_pairs_from_right.png").is_file() && d.join("out/fig4_pairs_from_right_log_p.svg").is_file());
        assert_eq!(c.counters["figures"], 10, "3 charts against the reference and 2 of the other pairs, SVG + PNG");
        let e = run(&mut ctx(d, &three, json!({ "pairs": "some" }))).unwrap_err().to_string();
        assert!(e.contains("unknown variant `some`"), "{e}");

        // A method on other traces, a reference that is not wired, no inputs at all.
        scores(d, "scores.other", &[("a", &[0.5, 0.5]), ("b", &[0.4, 0.3, 0.2, 0.1])]);
        let e = run(&mut ctx(d, &[("scores.mc", Schema::Scores), ("scores.other", Schema::Scores)], json!({}))).unwrap_err().to_string();
        assert!(e.contains("`scores.other` row 0") && e.contains("prompt a"), "{e}");
        let e = run(&mut ctx(d, &[("scores.same", Schema::Scores)], json!({}))).unwrap_err().to_string();
        assert!(e.contains("no input `scores.mc`") && e.contains("have: same"), "{e}");
        let e = run(&mut ctx(d, &[], json!({}))).unwrap_err().to_string();
        assert!(e.contains("stage `analysis`: nothing to analyse"), "{e}");
        // Only the SD table: the other parts say they were skipped.
        let mut c = ctx(d, &[("mc_sd.k3", Schema::Table)], json!({ "sd_threshold": 0.05 }));
        run(&mut c).unwrap();
        let md = std::fs::read_to_string(d.join("out/results.md")).unwrap();
        assert!(md.contains("Skipped: no `scores.<method>` inputs") && md.contains("k3: bootstrap SD never below 0.05 (k ≤ 3)"), "{md}");
    }
}
