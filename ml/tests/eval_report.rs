//! Evaluation and the report through the real binaries, on `pipelines/quickstart.toml` shrunk with
//! `--set`: the eval artifact (k samples per problem, verifier verdicts, reference answers), the
//! report's table checked against an independent avg@k over the eval artifacts, the figures
//! (sizes, series colours and labels), provenance, determinism and `rredcot report`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rredcot::artifact::rows::{EvalRow, PromptRow};
use rredcot::artifact::{read_rows, Schema};
use serde_json::Value;

// Each test binary uses part of the shared helpers.
mod common;

use common::repo;


/// The quickstart at toy scale (with `common::TINY_WORLD`): 2 training steps per method, 6 eval
/// problems x 2 samples after each step, 3 problems of each benchmark x 2 samples in the final evals.
const TINY_QUICKSTART: &[&str] = &[
    // The default world thinks: a 40-step SFT never closes `</think>` with a right answer, so every
    // group's rewards would be equal and GRPO and RREDCoT could not differ. 300 steps and 64 new
    // tokens give some groups a correct sample.
    "sft.steps=300",
    "grpo.repeat=2",
    "rredcot.repeat=2",
    "rollout.limit=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=64",
    "update.minibatch_size=8",
    "segment.max_segments=8",
    "eval.limit=6",
    "eval.k=2",
    "eval.max_new_tokens=40",
    "eval_base.limit=6",
    "eval_base.k=2",
    "eval_base.max_new_tokens=40",
    "final_base.limit=3",
    "final_grpo.limit=3",
    "final_rredcot.limit=3",
    "final_base.k=2",
    "final_grpo.k=2",
    "final_rredcot.k=2",
    "final_base.max_new_tokens=16",
    "final_grpo.max_new_tokens=16",
    "final_rredcot.max_new_tokens=16",
];

/// Every `--set` of the tiny quickstart.
fn tiny() -> impl Iterator<Item = &'static &'static str> {
    common::TINY_WORLD.iter().chain(TINY_QUICKSTART)
}
fn rredcot(store: &Path, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store").arg(store).args(args).current_dir(repo());
    c.output().unwrap()
}

/// Runs the tiny quickstart with extra command-line arguments.
fn run_ok(store: &Path, extra: &[&str]) -> Value {
    let pipeline = repo().join("pipelines/quickstart.toml");
    let mut args = vec!["pipeline", "run", pipeline.to_str().unwrap(), "--json"];
    for s in tiny() {
        args.extend(["--set", s]);
    }
    args.extend(extra);
    let out = rredcot(store, &args);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn outputs(store: &Path, s: &Value, stage: &str) -> PathBuf {
    store.join("instances").join(s["keys"][stage].as_str().unwrap()).join("outputs")
}

/// avg@k and its standard error computed here from the rows, independently of the crate.
fn avg_at_k(rows: &[EvalRow]) -> (f64, f64) {
    let mut per: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
    for r in rows {
        per.entry(&r.prompt_id).or_default().push(r.correct_verifier);
    }
    let fr: Vec<f64> = per.values().map(|v| v.iter().filter(|&&b| b).count() as f64 / v.len() as f64).collect();
    let n = fr.len() as f64;
    let mean = fr.iter().sum::<f64>() / n;
    let var = fr.iter().map(|f| (f - mean) * (f - mean)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// Fields of one CSV line (quoted fields may hold commas; `""` is a quote).
fn csv_fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut chars) = (Vec::new(), String::new(), false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// (width, height, RGB pixels) of a PNG.
fn png_pixels(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = info.color_type.samples();
    let px = buf[..info.buffer_size()].chunks(step).map(|c| [c[0], c[1], c[2]]).collect();
    (info.width, info.height, px)
}

#[test]
fn quickstart_evaluates_reports_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = run_ok(&store, &[]);

    // The eval artifact: k samples per problem, verdicts recomputable from the text.
    let prompts: Vec<PromptRow> = read_rows(&outputs(&store, &s, "taskgen").join("eval.parquet"), Schema::Prompts).unwrap();
    let base: Vec<EvalRow> = read_rows(&outputs(&store, &s, "eval_base").join("eval.parquet"), Schema::Eval).unwrap();
    assert_eq!(base.len(), 6 * 2);
    for (i, r) in base.iter().enumerate() {
        let p = &prompts[i / 2];
        assert_eq!((r.prompt_id.as_str(), r.sample_idx as usize, r.benchmark.as_str()), (p.id.as_str(), i % 2, "taskgen"));
        assert_eq!(r.reference, p.answer);
        assert!(!r.question.is_empty() && p.prompt.contains(r.question.trim()), "{:?}", r.question);
        // The default world thinks: only the text after `</think>` is the answer.
        let v = match r.text.split_once("</think>") {
            Some((_, answer)) => rredcot::math::verify_response(p.answer.as_deref().unwrap(), answer),
            None => rredcot::math::Verdict { extracted: None, correct: false },
        };
        assert_eq!((r.correct_verifier, &r.answer), (v.correct, &v.extracted));
        assert_eq!(r.correct_judge, None);
    }

    // Training moved both policies (else every eval is the same cached instance).
    let hash = |stage: &str, out: &str| {
        let rec: Value = serde_json::from_slice(&std::fs::read(store.join("instances").join(s["keys"][stage].as_str().unwrap()).join("run.json")).unwrap()).unwrap();
        rec["outputs"][out]["hash"].as_str().unwrap().to_string()
    };
    assert_ne!(hash("grpo.update[1]", "policy"), hash("sft", "model"));
    assert_ne!(hash("rredcot.update[1]", "policy"), hash("grpo.update[1]", "policy"));

    // The table equals avg@k recomputed from each row's eval artifact.
    let report = outputs(&store, &s, "report").join("report");
    let csv = std::fs::read_to_string(report.join("results.csv")).unwrap();
    let md = std::fs::read_to_string(report.join("results.md")).unwrap();
    let mut row_order = Vec::new();
    for (label, stage) in [("base", "final_base"), ("GRPO", "final_grpo"), ("RREDCoT", "final_rredcot")] {
        let all: Vec<EvalRow> = read_rows(&outputs(&store, &s, stage).join("eval.parquet"), Schema::Eval).unwrap();
        let rows: Vec<EvalRow> = all.iter().filter(|r| r.benchmark == "taskgen").cloned().collect();
        let (mean, se) = avg_at_k(&rows);
        let f = csv.lines().map(csv_fields).find(|f| f[1] == label && f[2] == "taskgen").unwrap_or_else(|| panic!("no {label} in {csv}"));
        let line = f.join(" | ");
        assert_eq!((f[2].as_str(), f[3].as_str(), f[4].as_str()), ("taskgen", "2", "3"), "{line}");
        assert!((f[6].parse::<f64>().unwrap() - mean).abs() < 1e-12 && (f[7].parse::<f64>().unwrap() - se).abs() < 1e-12, "{line} vs {mean} ± {se}");
        // Columns are benchmarks by name: gsm8k, then taskgen.
        let line = md.lines().find(|l| l.starts_with(&format!("| {label} |"))).unwrap();
        let cell = format!("{:.1} ± {:.1}", 100.0 * mean, 100.0 * se);
        assert_eq!(line.split('|').nth(3).map(|c| c.trim().starts_with(&cell)), Some(true), "{cell} not the taskgen cell of {line}");
        // The gsm8k column comes from the same final evaluation.
        let gsm: Vec<EvalRow> = all.iter().filter(|r| r.benchmark == "gsm8k").cloned().collect();
        assert!(!gsm.is_empty(), "{stage} evaluated gsm8k");
        let g = csv.lines().map(csv_fields).find(|f| f[1] == label && f[2] == "gsm8k").unwrap_or_else(|| panic!("no {label} gsm8k in {csv}"));
        assert!((g[6].parse::<f64>().unwrap() - avg_at_k(&gsm).0).abs() < 1e-12, "{g:?}");
        // Provenance names the instance each row came from.
        let key = &s["keys"][stage].as_str().unwrap()[..12];
        assert!(md.contains(&format!("- {label}: {stage}.eval (instance {key}")), "{md}");
        row_order.push(md.find(&format!("| {label} |")).unwrap());
    }
    assert!(row_order.windows(2).all(|w| w[0] < w[1]), "rows in the order of the `rows` param");
    let tex = std::fs::read_to_string(report.join("results.tex")).unwrap();
    assert!(tex.contains("\\begin{tabular}") && tex.contains("RREDCoT &"), "{tex}");

    // Learning curves: one metric per benchmark at every step (avg@k over the same problems with
    // the same k), the base at step 0 from its per-step-style evaluation, not the final table's.
    let curve = std::fs::read_to_string(report.join("learning_curves.csv")).unwrap();
    let points: Vec<Vec<String>> = curve.lines().skip(1).map(csv_fields).collect();
    assert_eq!(points.len(), 2 * 3, "2 methods x (base + 2 steps): {curve}");
    assert!(points.iter().all(|p| p[1] == "taskgen" && p[5] == "6" && p[6] == "2"), "same benchmark, problems and k at every step: {curve}");
    let base_curve: Vec<EvalRow> = read_rows(&outputs(&store, &s, "eval_base").join("eval.parquet"), Schema::Eval).unwrap();
    for method in ["GRPO", "RREDCoT"] {
        let mine: Vec<&Vec<String>> = points.iter().filter(|p| p[0] == method).collect();
        assert_eq!(mine.iter().map(|p| p[2].as_str()).collect::<Vec<_>>(), ["0", "1", "2"]);
        assert!((mine[0][3].parse::<f64>().unwrap() - avg_at_k(&base_curve).0).abs() < 1e-12, "step 0 = eval_base: {curve}");
        let step2: Vec<EvalRow> = read_rows(&outputs(&store, &s, &format!("{}.eval[1]", method.to_lowercase())).join("eval.parquet"), Schema::Eval).unwrap();
        let (m2, se2) = avg_at_k(&step2);
        assert!((mine[2][3].parse::<f64>().unwrap() - m2).abs() < 1e-12 && (mine[2][4].parse::<f64>().unwrap() - se2).abs() < 1e-12, "{curve}");
    }

    // Figures: both formats, the right sizes, each method's series drawn in its colour.
    let (w, h, px) = png_pixels(&report.join("learning_curves_taskgen.png"));
    assert_eq!((w, h), (900, 560));
    // (Equal accuracies draw one line over the other, so count at least the legend swatches.)
    for colour in [[31u8, 119, 180], [255, 127, 14]] {
        let n = px.iter().filter(|p| **p == colour).count();
        assert!(n >= 30, "series colour {colour:?}: {n} pixels");
    }
    let svg = std::fs::read_to_string(report.join("learning_curves_taskgen.svg")).unwrap();
    assert!(svg.contains("GRPO") && svg.contains("RREDCoT"));
    for stroke in ["#1F77B4", "#FF7F0E"] {
        // The curve (3 points: base, step 1, step 2) and its legend swatch.
        let lines: Vec<&str> = svg.split("<polyline").skip(1).filter(|l| l.contains(&format!("stroke=\"{stroke}\""))).collect();
        assert!(lines.len() >= 2 && lines.iter().any(|l| l.split("points=\"").nth(1).unwrap_or("").split(' ').filter(|p| p.contains(',')).count() == 3), "{stroke}: {lines:?}");
    }
    let scores: Vec<rredcot::artifact::rows::ScoreRow> =
        read_rows(&outputs(&store, &s, "rredcot.score[1]").join("scores.parquet"), Schema::Scores).unwrap();
    let (_, h, px) = png_pixels(&report.join("sigma_heatmap_RREDCoT.png"));
    let shaded = px.iter().filter(|p| p[0] == 255 && p[1] < 250 && p[1] == p[2]).count();
    assert!(shaded > 1000 && h >= 50 + 20, "σ shading drawn: {shaded} pixels, height {h}");
    let heat = std::fs::read_to_string(report.join("sigma_heatmap_RREDCoT.svg")).unwrap();
    let segs = heat.matches("σ=").count();
    assert!(scores.iter().any(|r| r.sigma.len() == segs), "one heat-map line per segment of a scored trace: {segs}");
    let values = std::fs::read_to_string(report.join("value_curves_RREDCoT.svg")).unwrap();
    assert!(values.contains("R_t") && values.contains("v_t"));

    // Same inputs: the same report, byte for byte (its artifact hash).
    let hash = |s: &Value| {
        let rec: Value = serde_json::from_slice(&std::fs::read(store.join("instances").join(s["keys"]["report"].as_str().unwrap()).join("run.json")).unwrap()).unwrap();
        rec["outputs"]["report"]["hash"].as_str().unwrap().to_string()
    };
    let first = hash(&s);
    let again = run_ok(&store, &["--force", "report"]);
    assert_eq!(hash(&again), first);

    // `rredcot report` copies it out and prints the table; with a changed pipeline it refuses.
    let export = dir.path().join("exported");
    let pipeline = repo().join("pipelines/quickstart.toml");
    let mut args = vec!["report", pipeline.to_str().unwrap(), "--out", export.to_str().unwrap()];
    for t in tiny() {
        args.extend(["--set", t]);
    }
    let out = rredcot(&store, &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("| RREDCoT |"));
    for f in ["results.md", "results.csv", "results.tex", "learning_curves.csv", "learning_curves_taskgen.png", "learning_curves_taskgen.svg", "sigma_heatmap_RREDCoT.png"] {
        assert!(export.join(f).is_file(), "{f} exported");
    }
    args.extend(["--set", "eval.k=3"]);
    let out = rredcot(&store, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is not up to date"), "{err}");
}
