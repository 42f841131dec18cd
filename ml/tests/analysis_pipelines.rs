//! The analysis pipelines (`pipelines/analysis-fig3.toml`, `analysis-fig4.toml`,
//! `analysis-fig7.toml`; issue 9 point 6) at toy scale through the real worker binary. Each
//! `analysis` table is checked against numbers recomputed here from the scorers' own artifacts
//! (Spearman/Pearson by a separate implementation, lost fractions recounted from the completions,
//! the SD table passed through); a rerun is fully cached and a forced rerun of the analysis
//! reproduces its output hash; `rredcot report --stage analysis` exports it.

use std::path::Path;
use std::process::{Command, Output};

use rredcot::artifact::rows::ScoreRow;
use rredcot::artifact::{read_rows, Schema};
use rredcot_ml::stages::score_mc::CompletionRow;
use serde_json::Value;

mod common;
use common::{output, record, repo, table, TINY_ROLLOUT, TINY_WORLD};

/// One-operation problems and a longer SFT (as in `credit_methods.rs`): the tiny policy solves
/// some, so MC values vary and correlations are defined.
const EASY: &[&str] = &["taskgen.min_steps=1", "taskgen.max_steps=1", "taskgen.max_value=10", "taskgen.max_operand=5", "sft.steps=300", "segment.max_segments=4"];

fn worker(store: &Path, args: &[&str], sets: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store").arg(store).args(args);
    for s in TINY_WORLD.iter().chain(TINY_ROLLOUT).chain(EASY).chain(sets) {
        c.args(["--set", s]);
    }
    c.output().unwrap()
}

fn run_ok(store: &Path, pipeline: &str, sets: &[&str]) -> Value {
    let p = repo().join(pipeline);
    let out = worker(store, &["pipeline", "run", p.to_str().unwrap(), "--json"], sets);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Ranks with ties averaged, Pearson and Spearman: written again here, not the stage's code.
fn rank(x: &[f64]) -> Vec<f64> {
    x.iter().map(|v| x.iter().filter(|w| *w < v).count() as f64 + (x.iter().filter(|w| *w == v).count() as f64 + 1.0) / 2.0).collect()
}

fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let cov: f64 = a.iter().zip(b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    if a.len() < 2 || va == 0.0 || vb == 0.0 {
        f64::NAN
    } else {
        cov / (va * vb).sqrt()
    }
}

fn spearman(a: &[f64], b: &[f64]) -> f64 {
    pearson(&rank(a), &rank(b))
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || (a - b).abs() < 1e-9
}

#[derive(Debug, serde::Deserialize)]
struct Corr {
    method: String,
    reference: String,
    view: String,
    pos_lo: f64,
    spearman: f64,
    pearson: f64,
    spearman_p: f64,
    n: i64,
}

#[test]
fn fig4_correlations_match_a_recomputation_and_rerun_cached() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let sets = ["mc5.k=2", "mc5.max_new_tokens=24", "mc20.k=4", "mc20.max_new_tokens=24"];
    let s = run_ok(&store, "pipelines/analysis-fig4.toml", &sets);
    let report = output(&store, &s, "analysis", "report");
    for f in ["results.md", "correlations.csv", "correlations.parquet", "fig4_by_position.png", "fig4_by_position.svg", "fig4_from_right.png", "fig4_from_right.svg", "fig4_from_right_log_p.png"] {
        assert!(report.join(f).is_file(), "missing {f}");
    }
    assert!(!report.join("truncation.csv").exists() && !report.join("mc_sd.csv").exists());
    let md = std::fs::read_to_string(report.join("results.md")).unwrap();
    assert!(md.contains("Skipped: no `completions.<label>` inputs") && md.contains("Skipped: no `mc_sd.<label>` inputs"), "{md}");

    let scores = |stage: &str| -> Vec<ScoreRow> { read_rows(&output(&store, &s, stage, "scores"), Schema::Scores).unwrap() };
    let reference = scores("mc20");
    let segments: usize = reference.iter().map(|r| r.sigma.len()).sum();
    let rows: Vec<Corr> = table(&report.join("correlations.parquet"));
    let mut defined = 0;
    for method in ["sigma", "mc5", "loo", "grad", "progress"] {
        let mine = scores(method);
        let of = |view: &str| rows.iter().filter(|r| r.method == method && r.reference == "mc20" && r.view == view).collect::<Vec<_>>();
        let (bins, right, per_trace) = (of("bin"), of("from_right"), of("per_trace"));
        assert_eq!((bins.len(), right.len(), per_trace.len()), (5, 5, 1), "{method}");
        assert_eq!(bins.iter().map(|r| r.n).sum::<i64>(), segments as i64, "{method}: every segment in one bin");
        // The whole trace (from_right, f = 1) pooled over traces, and the per-trace mean.
        let (mut a, mut b, mut rhos) = (Vec::new(), Vec::new(), Vec::new());
        for want in &reference {
            let got = mine.iter().find(|m| m.prompt_id == want.prompt_id && m.sample_idx == want.sample_idx).unwrap();
            a.extend(&got.sigma);
            b.extend(&want.sigma);
            let rho = spearman(&got.sigma, &want.sigma);
            if !rho.is_nan() {
                rhos.push(rho);
            }
        }
        let whole = right.last().unwrap();
        assert_eq!((whole.pos_lo, whole.n), (0.0, segments as i64));
        assert!(same(whole.spearman, spearman(&a, &b)) && same(whole.pearson, pearson(&a, &b)), "{method}: {whole:?}");
        let mean = if rhos.is_empty() { f64::NAN } else { rhos.iter().sum::<f64>() / rhos.len() as f64 };
        assert!(same(per_trace[0].spearman, mean) && per_trace[0].n == rhos.len() as i64, "{method}: {:?} vs {mean}", per_trace[0]);
        for r in bins.iter().chain(&right) {
            assert!(r.spearman.is_nan() || (-1.0..=1.0).contains(&r.spearman), "{r:?}");
            // A p-value wherever ρ is defined on 3 pairs or more (tests/correlation_parity.rs
            // checks its value against scipy).
            assert_eq!(r.spearman_p.is_nan(), r.spearman.is_nan() || r.n < 3, "{r:?}");
            assert!(r.spearman_p.is_nan() || (0.0..=1.0).contains(&r.spearman_p), "{r:?}");
            defined += !r.spearman.is_nan() as usize;
        }
    }
    assert!(defined > 0, "some windows have varying σ on both sides: {rows:?}");
    // pairs = "all": the methods against each other too, each pair once (the paper's gradient
    // attribution against LOO), on the same traces.
    let (grad, loo) = (scores("grad"), scores("loo"));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for want in &reference {
        let find = |rows: &[ScoreRow]| rows.iter().find(|m| m.prompt_id == want.prompt_id && m.sample_idx == want.sample_idx).unwrap().sigma.clone();
        a.extend(find(&grad));
        b.extend(find(&loo));
    }
    let whole = rows.iter().find(|r| (r.method.as_str(), r.reference.as_str(), r.view.as_str(), r.pos_lo) == ("grad", "loo", "from_right", 0.0)).expect("grad against loo");
    assert!(same(whole.spearman, spearman(&a, &b)) && whole.n == segments as i64, "{whole:?}");
    assert!(!rows.iter().any(|r| r.method == "loo" && r.reference == "grad"), "each pair once");
    assert_eq!(rows.len(), (5 + 10) * (5 + 5 + 1), "5 methods against mc20, then their 10 pairs");
    let rec = record(&store, &s, "analysis");
    assert_eq!(rec["counters"]["figures"].as_i64(), Some(10), "3 charts against mc20, 2 of the other pairs");

    // `analysis_by_token`: the same pairs with each segment at its middle token. A whole trace and
    // a trace's own coefficient do not depend on where its segments sit; the windows are
    // recounted here from the segmentation, in integers as the stage decides them.
    let by_token: Vec<Corr> = table(&output(&store, &s, "analysis_by_token", "report").join("correlations.parquet"));
    assert_eq!(by_token.len(), rows.len());
    for (t, r) in by_token.iter().zip(&rows) {
        assert_eq!((&t.method, &t.reference, &t.view, t.pos_lo), (&r.method, &r.reference, &r.view, r.pos_lo));
        if r.view == "per_trace" || (r.view == "from_right" && r.pos_lo == 0.0) {
            assert!(same(t.spearman, r.spearman) && t.n == r.n, "{t:?} vs {r:?}");
        }
    }
    use rredcot::artifact::rows::SegmentRow;
    let segs: Vec<SegmentRow> = read_rows(&output(&store, &s, "segment", "segments"), Schema::Segments).unwrap();
    let sigma = scores("sigma");
    let (mut counts, mut last_fifth) = (vec![0i64; 5], (Vec::new(), Vec::new()));
    for want in &reference {
        let seg = segs.iter().find(|g| g.prompt_id == want.prompt_id && g.sample_idx == want.sample_idx).unwrap();
        let got = sigma.iter().find(|m| m.prompt_id == want.prompt_id && m.sample_idx == want.sample_idx).unwrap();
        let n = *seg.seg_ends.last().unwrap() as i64;
        for (t, (&a, &e)) in seg.seg_starts.iter().zip(&seg.seg_ends).enumerate() {
            let centre2 = (a + e) as i64;
            counts[((centre2 * 5 / (2 * n)) as usize).min(4)] += 1;
            if centre2 * 5 >= 2 * n * 4 {
                last_fifth.0.push(got.sigma[t]);
                last_fifth.1.push(want.sigma[t]);
            }
        }
    }
    let of = |view: &str| by_token.iter().filter(|r| (r.method.as_str(), r.reference.as_str(), r.view.as_str()) == ("sigma", "mc20", view)).collect::<Vec<_>>();
    assert_eq!(of("bin").iter().map(|r| r.n).collect::<Vec<_>>(), counts, "segments per token window");
    let tail = of("from_right")[0];
    assert!(tail.n == last_fifth.0.len() as i64 && same(tail.spearman, spearman(&last_fifth.0, &last_fifth.1)), "{tail:?}");
    assert_ne!(of("bin").iter().map(|r| r.n).collect::<Vec<_>>(), rows.iter().filter(|r| r.method == "sigma" && r.view == "bin").map(|r| r.n).collect::<Vec<_>>(), "segments of unequal lengths move between windows");

    // A rerun is fully cached; a forced rerun of the analysis reproduces its output.
    let again = run_ok(&store, "pipelines/analysis-fig4.toml", &sets);
    assert!(again["ran"].as_array().unwrap().is_empty(), "{again}");
    let p = repo().join("pipelines/analysis-fig4.toml");
    let out = worker(&store, &["pipeline", "run", p.to_str().unwrap(), "--json", "--force", "analysis"], &sets);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let forced: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(forced["ran"].as_array().unwrap().len(), 1, "{forced}");
    assert_eq!(record(&store, &forced, "analysis")["outputs"]["report"]["hash"], rec["outputs"]["report"]["hash"], "the analysis is deterministic");

    // `rredcot report --stage analysis` exports it.
    let export = dir.path().join("fig4");
    let out = worker(&store, &["report", p.to_str().unwrap(), "--stage", "analysis", "--out", export.to_str().unwrap()], &sets);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("## Fig. 4") && export.join("fig4_from_right.png").is_file());

    // A reference that is not an input is an error naming it.
    let out = worker(&store, &["pipeline", "run", p.to_str().unwrap()], &[&sets[..], &["analysis.reference=mc50"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("scores.mc50") && err.contains("analysis"), "{err}");
}

#[derive(Debug, PartialEq, serde::Deserialize)]
struct Trunc {
    label: String,
    max_new_tokens: i32,
    completions: i64,
    truncated_fraction: f64,
    lost_fraction: f64,
}

use rredcot::analysis::mc_sd::SdIn as Sd;

#[test]
fn fig3_truncation_is_recounted_and_fig7_passes_the_sd_table_through() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // The labels say t16..t160, the limits set here are 4..48: the table reads the column.
    let lens = [("t16", 4), ("t32", 8), ("t64", 16), ("t160", 48)];
    let sets: Vec<String> = lens.iter().flat_map(|(l, n)| [format!("mc_{l}.k=2"), format!("mc_{l}.max_new_tokens={n}")]).collect();
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let s = run_ok(&store, "pipelines/analysis-fig3.toml", &sets);
    let report = output(&store, &s, "analysis", "report");
    for f in ["results.md", "truncation.csv", "fig3_truncation.png", "fig3_truncation.svg"] {
        assert!(report.join(f).is_file(), "missing {f}");
    }
    let rows: Vec<Trunc> = table(&report.join("truncation.parquet"));
    assert_eq!(rows.iter().map(|r| (r.label.as_str(), r.max_new_tokens)).collect::<Vec<_>>(), lens.to_vec());
    for (r, (label, _)) in rows.iter().zip(lens) {
        let comps: Vec<CompletionRow> = table(&output(&store, &s, &format!("mc_{label}"), "completions"));
        let n = comps.len() as f64;
        assert_eq!(r.completions, comps.len() as i64);
        assert!(same(r.lost_fraction, comps.iter().filter(|c| c.lost).count() as f64 / n), "{r:?}");
        assert!(same(r.truncated_fraction, comps.iter().filter(|c| c.truncated).count() as f64 / n), "{r:?}");
    }
    // Completion (trace, t, j) has one seed at every length: a longer budget extends it.
    for w in rows.windows(2) {
        assert!(w[1].truncated_fraction <= w[0].truncated_fraction && w[1].lost_fraction <= w[0].lost_fraction, "{rows:?}");
    }
    assert!(rows[0].lost_fraction > 0.0 && rows[0].truncated_fraction > rows[3].truncated_fraction, "{rows:?}");

    // Fig. 7 in the same store (the front is cached).
    let s7 = run_ok(&store, "pipelines/analysis-fig7.toml", &["mc20.k=6", "mc20.max_new_tokens=24"]);
    assert!(!s7["ran"].as_array().unwrap().iter().any(|x| x == "sft"), "the front comes from the cache");
    let report = output(&store, &s7, "analysis", "report");
    assert!(report.join("fig7_mc_sd.png").is_file() && report.join("fig7_mc_sd.svg").is_file());
    let given: Vec<Sd> = table(&output(&store, &s7, "mc20", "mc_sd"));
    let passed: Vec<Sd> = table(&report.join("mc_sd.parquet"));
    assert_eq!(passed, given);
    assert_eq!(given.iter().map(|r| r.k).collect::<Vec<_>>(), (1..=6).collect::<Vec<_>>());
    let md = std::fs::read_to_string(report.join("results.md")).unwrap();
    let metric = &record(&store, &s7, "analysis")["metrics"]["k_sd_below.k20"];
    match given.iter().find(|r| r.sd_bootstrap < 0.1) {
        Some(r) => {
            assert_eq!(metric.as_i64(), Some(r.k as i64));
            assert!(md.contains(&format!("k20: bootstrap SD < 0.1 from k = {}", r.k)), "{md}");
        }
        None => assert!(metric.is_null() && md.contains("k20: bootstrap SD never below 0.1"), "{md}"),
    }
    assert!(md.contains("Skipped: no `scores.<method>` inputs"), "{md}");
}

use rredcot::stages::credit_benchmark::{MethodRow, TraceRow};

#[derive(Debug, serde::Deserialize)]
struct Reset {
    prompt_id: String,
    sample_idx: i32,
    reset_step: i32,
}

/// The credit benchmark at toy scale (issue 19 point 2): the located first wrong steps are checked
/// against the reference solution's lines, and the per-trace hits and ranks of σ (value drop and
/// weight), SRPO and chance are recomputed here from the scorers' own artifacts.
#[test]
fn credit_benchmark_locates_real_errors_and_scores_methods_as_recomputed() {
    use rredcot::artifact::rows::{PromptRow, RolloutRow, SegmentRow};
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let sets = ["segment.max_segments=64", "rollout.limit=12", "rollout.group_size=4", "mc5.k=2", "mc5.max_new_tokens=24", "mc20.k=3", "mc20.max_new_tokens=24", "srpo.max_new_tokens=8", "rrpo.max_new_tokens=8"];
    let s = run_ok(&store, "pipelines/credit-benchmark.toml", &sets);
    let report = output(&store, &s, "benchmark", "report");
    for f in ["results.md", "credit_benchmark.csv", "first_wrong_steps.csv", "credit_top1.png", "credit_top1.svg"] {
        assert!(report.join(f).is_file(), "missing {f}");
    }
    let rows: Vec<MethodRow> = table(&report.join("credit_benchmark.parquet"));
    let traces: Vec<TraceRow> = table(&report.join("first_wrong_steps.parquet"));
    let methods: Vec<&str> = rows.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(methods, ["random", "grad", "loo", "mc20", "mc5", "progress", "sigma", "sigma_answer", "sigma_l1", "sigma_signed", "sigma_softmax", "sigma_solution", "rrpo", "srpo"]);
    let located = rows[0].traces as usize;
    assert!(located > 0, "some incorrect traces have a located first wrong step: {rows:?}");
    assert!(rows.iter().all(|r| r.traces as usize == located));

    // Ground truth: every line before the first wrong segment is a line of the reference solution,
    // in order, and the wrong segment holds a line that is not the reference's next one. A start
    // line is compared by its value only ("Leo starts with 4 pencils." for "Eva starts with 4
    // shells." starts right: names and items do not enter the answer).
    let norm = |l: &str| -> String { if l.to_lowercase().contains("start") { l.chars().filter(char::is_ascii_digit).collect() } else { l.to_string() } };
    let prompts: Vec<PromptRow> = read_rows(&output(&store, &s, "taskgen", "eval"), Schema::Prompts).unwrap();
    let rollouts: Vec<RolloutRow> = read_rows(&output(&store, &s, "rollout", "rollouts"), Schema::Rollouts).unwrap();
    let segments: Vec<SegmentRow> = read_rows(&output(&store, &s, "segment", "segments"), Schema::Segments).unwrap();
    let tok = rredcot::tokenizer_file::load(&output(&store, &s, "sft", "model")).unwrap();
    let chance: Vec<&TraceRow> = traces.iter().filter(|t| t.method == "random").collect();
    assert_eq!(chance.len(), located);
    for t in &chance {
        let r = rollouts.iter().find(|r| r.prompt_id == t.prompt_id && r.sample_idx == t.sample_idx).unwrap();
        assert_eq!(r.reward, 0.0);
        let seg = segments.iter().find(|g| g.prompt_id == t.prompt_id && g.sample_idx == t.sample_idx).unwrap();
        assert_eq!(seg.seg_starts.len(), t.segments as usize);
        let solution = prompts.iter().find(|p| p.id == t.prompt_id).unwrap().solution.clone().unwrap();
        let reference: Vec<String> = solution.lines().map(str::trim).filter(|l| !l.is_empty()).map(norm).collect();
        let text = |i: usize| -> String {
            let ids: Vec<u32> = r.completion_ids[seg.seg_starts[i] as usize..seg.seg_ends[i] as usize].iter().map(|&x| x as u32).collect();
            tok.decode(&ids, false).unwrap()
        };
        let before: String = (0..t.first_wrong_segment as usize - 1).map(text).collect();
        let before: Vec<String> = before.lines().map(str::trim).filter(|l| !l.is_empty()).map(norm).collect();
        assert_eq!(before, reference[..before.len()], "{t:?}: the lines before the first wrong step are the reference's");
        let wrong = text(t.first_wrong_segment as usize - 1);
        let next = &reference[before.len()];
        assert!(wrong.lines().map(str::trim).find(|l| !l.is_empty()).map(norm).as_ref() != Some(next), "{t:?}: segment `{wrong}` is the reference's next line `{next}`");
        // Chance: 1/T and (T + 1)/2.
        assert!(same(t.hit, 1.0 / t.segments as f64) && same(t.rank, (t.segments as f64 + 1.0) / 2.0), "{t:?}");
    }
    assert!(same(rows[0].top1_first_wrong_step, chance.iter().map(|t| 1.0 / t.segments as f64).sum::<f64>() / located as f64));
    assert!(rows.iter().all(|r| same(r.chance_top1, rows[0].top1_first_wrong_step)));

    // σ by its value drop and by its weight, recomputed from its scores; SRPO from its resets.
    let sigma: Vec<ScoreRow> = read_rows(&output(&store, &s, "sigma", "scores"), Schema::Scores).unwrap();
    let resets: Vec<Reset> = table(&output(&store, &s, "srpo", "resets"));
    for t in &chance {
        let sc = sigma.iter().find(|x| x.prompt_id == t.prompt_id && x.sample_idx == t.sample_idx).unwrap();
        let w = t.first_wrong_segment as usize - 1;
        let drop: Vec<f64> = (0..t.segments as usize).map(|i| -((sc.r[i + 1] - sc.r[i]) + (sc.v[i + 1] - sc.v[i]))).collect();
        for (method, blame) in [("sigma", drop), ("sigma_l1", sc.sigma.clone())] {
            let got = traces.iter().find(|x| x.method == method && x.prompt_id == t.prompt_id && x.sample_idx == t.sample_idx).unwrap();
            let top = blame.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let tied = blame.iter().filter(|&&b| b == top).count() as f64;
            let hit = if blame[w] == top { 1.0 / tied } else { 0.0 };
            let neg: Vec<f64> = blame.iter().map(|b| -b).collect();
            assert!(same(got.hit, hit) && same(got.rank, rank(&neg)[w]), "{method} {got:?}");
        }
        let pick = resets.iter().find(|x| x.prompt_id == t.prompt_id && x.sample_idx == t.sample_idx).unwrap();
        let got = traces.iter().find(|x| x.method == "srpo" && x.prompt_id == t.prompt_id && x.sample_idx == t.sample_idx).unwrap();
        assert!(same(got.hit, (pick.reset_step == t.first_wrong_segment) as i32 as f64) && got.rank.is_nan(), "{got:?}");
        assert!(!t.error.is_empty());
    }
    let by = |m: &str| rows.iter().find(|r| r.method == m).unwrap();
    assert_eq!((by("sigma").blame.as_str(), by("sigma_l1").blame.as_str(), by("loo").blame.as_str(), by("grad").blame.as_str()), ("drop", "max_sigma", "min_value", "max_value"));
    // signed_l1 σ ordered ascending is the value drop's order: the same hits and ranks.
    assert!(same(by("sigma_signed").top1_first_wrong_step, by("sigma").top1_first_wrong_step) && same(by("sigma_signed").mean_rank, by("sigma").mean_rank));

    // Every incorrect rollout is counted once: located or why not.
    let rec = record(&store, &s, "benchmark");
    let c = rec["counters"].as_object().unwrap();
    let counted: i64 = c.iter().filter(|(k, _)| k.starts_with("traces_") && *k != "traces_correct" && *k != "traces_benchmarked").map(|(_, v)| v.as_i64().unwrap()).sum();
    assert_eq!(counted, rollouts.iter().filter(|r| r.reward == 0.0).count() as i64, "{c:?}");
    assert_eq!(c["traces_located"].as_i64(), Some(located as i64));

    // `locate_errors` keeps exactly the traces the benchmark located, and names every other row
    // with the benchmark's reason.
    let kept: Vec<RolloutRow> = read_rows(&output(&store, &s, "locate", "rollouts"), Schema::Rollouts).unwrap();
    let mut kept_ids: Vec<(String, i32)> = kept.iter().map(|r| (r.prompt_id.clone(), r.sample_idx)).collect();
    let mut located_ids: Vec<(String, i32)> = chance.iter().map(|t| (t.prompt_id.clone(), t.sample_idx)).collect();
    kept_ids.sort();
    located_ids.sort();
    assert_eq!(kept_ids, located_ids);
    #[derive(serde::Deserialize)]
    struct Skipped {
        reason: String,
    }
    let skipped: Vec<Skipped> = table(&output(&store, &s, "locate", "skipped"));
    assert_eq!(skipped.len() + kept.len(), rollouts.len(), "every rollout kept or skipped with a reason");
    for (reason, n) in c.iter().filter(|(k, _)| k.starts_with("traces_") && !["traces_located", "traces_benchmarked"].contains(&k.as_str())) {
        let reason = &reason["traces_".len()..];
        assert_eq!(skipped.iter().filter(|x| x.reason == reason).count() as i64, n.as_i64().unwrap(), "skipped as {reason}");
    }

    // A blame for a method that is not wired is an error naming it.
    let p = repo().join("pipelines/credit-benchmark.toml");
    let out = worker(&store, &["pipeline", "run", p.to_str().unwrap()], &[&sets[..], &["benchmark.blame={\"mc50\" = \"drop\"}"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("scores.mc50") && err.contains("benchmark"), "{err}");
}
