//! The other credit methods (issue 9: Monte Carlo values, leave-one-out, gradient attribution)
//! through the real worker binary, each as the `score` stage of `pipelines/incremental-rescore.toml`
//! (shrunk as in `credit_stages.rs`) so every run ends in a redistributed GRPO update. Each
//! method's values are recomputed independently: MC from its own completions artifact (and, at
//! temperature 0, from a separate greedy generation), LOO from two plain `logprob` calls per
//! segment, the gradient norms by torch autograd in transformers. A forced rerun reproduces the
//! artifacts' hashes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rredcot::artifact::rows::{PromptRow, RolloutRow, ScoreRow, SegmentRow};
use rredcot::artifact::{read_rows, Schema};
use rredcot_ml::model::{self, generate, LoadedModel, SamplingParams};
use rredcot_ml::stages::score_mc::CompletionRow;
use serde_json::Value;

mod common;
use common::{output, record, repo, y_star_after, table, TINY_ROLLOUT, TINY_WORLD};

/// Fewer segments than the incremental pipeline's 40: MC samples k completions per exit point.
const FEW_SEGMENTS: &str = "segment.max_segments=4";

/// One-operation problems and a longer SFT: the tiny policy then solves some (reward > 0), so MC
/// values are not all 0.
const EASY: &[&str] = &[
    "--set", "taskgen.min_steps=1", "--set", "taskgen.max_steps=1", "--set", "taskgen.max_value=10",
    "--set", "taskgen.max_operand=5", "--set", "sft.steps=300",
];

/// `pipelines/incremental-rescore.toml` with its score stage switched to `kind` (its own params).
fn method_pipeline(dir: &Path, kind: &str, params: &str) -> PathBuf {
    let base = std::fs::read_to_string(repo().join("pipelines/incremental-rescore.toml")).unwrap();
    let body = base
        .replace("uses = \"score_sigma\"", &format!("uses = \"{kind}\""))
        .replace("params = { normalize = \"l1\", terms = \"both\" }", &format!("params = {{ {params} }}"));
    assert!(body.contains(kind) && !body.contains("terms = \"both\""), "the pipeline's score stage changed shape");
    let p = dir.join(format!("{kind}.toml"));
    std::fs::write(&p, format!("stage_dirs = [{:?}]\n{body}", repo().join("stages").display().to_string())).unwrap();
    p
}

fn run_ok(store: &Path, pipeline: &Path, extra: &[&str]) -> Value {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store").arg(store).args(["pipeline", "run"]).arg(pipeline).arg("--json");
    for s in TINY_WORLD.iter().chain(TINY_ROLLOUT).chain([&FEW_SEGMENTS]) {
        c.args(["--set", s]);
    }
    let out: Output = c.args(extra).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What the tests read back from a method's run.
struct Run {
    prompts: Vec<PromptRow>,
    rollouts: Vec<RolloutRow>,
    segments: Vec<SegmentRow>,
    scores: Vec<ScoreRow>,
    model: LoadedModel,
}

/// Runs the method's pipeline, checks what every method must satisfy (one σ per segment,
/// Σσ = 1, the update ran on them, a forced rerun reproduces the scores' hash) and returns the
/// artifacts.
fn run_method(store: &Path, pipeline: &Path, method: &str, extra: &[&str]) -> (Value, Run) {
    let s = run_ok(store, pipeline, extra);
    let rec = record(store, &s, "score");
    assert!(record(store, &s, "update")["outputs"]["policy"]["hash"].is_string(), "the update consumed the scores");
    let again = run_ok(store, pipeline, &[extra, &["--force", "score"][..]].concat());
    assert!(again["ran"].as_array().unwrap().iter().any(|x| x == "score"), "{again}");
    for (name, out) in rec["outputs"].as_object().unwrap() {
        assert_eq!(out["hash"], record(store, &again, "score")["outputs"][name]["hash"], "{method}: output {name} differs on a forced rerun");
    }
    let run = Run {
        prompts: read_rows(&output(store, &s, "taskgen", "eval"), Schema::Prompts).unwrap(),
        rollouts: read_rows(&output(store, &s, "rollout", "rollouts"), Schema::Rollouts).unwrap(),
        segments: read_rows(&output(store, &s, "segment", "segments"), Schema::Segments).unwrap(),
        scores: read_rows(&output(store, &s, "score", "scores"), Schema::Scores).unwrap(),
        model: model::load(&output(store, &s, "sft", "model"), &Default::default()).unwrap(),
    };
    assert_eq!(run.scores.len(), run.segments.len());
    for (row, seg) in run.scores.iter().zip(&run.segments) {
        assert_eq!((row.prompt_id.as_str(), row.sample_idx), (seg.prompt_id.as_str(), seg.sample_idx));
        assert_eq!(row.method, method);
        assert_eq!(row.sigma.len(), seg.seg_ends.len());
        assert!((row.sigma.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{:?}", row.sigma);
    }
    (s, run)
}

impl Run {
    fn gold(&self, i: usize) -> &str {
        let id = &self.segments[i].prompt_id;
        self.prompts.iter().find(|p| &p.id == id).unwrap().answer.as_deref().unwrap()
    }

    fn rollout(&self, i: usize) -> &RolloutRow {
        let s = &self.segments[i];
        self.rollouts.iter().find(|r| r.prompt_id == s.prompt_id && r.sample_idx == s.sample_idx).unwrap()
    }

    /// (prompt ids, chain-of-thought ids (the completion up to `cot_end`) without a trailing stop
    /// token) of trace i, built here.
    fn ids(&self, i: usize) -> (Vec<i64>, Vec<i64>) {
        let tok = self.model.tokenizer.as_ref().unwrap();
        let prompt = self.prompts.iter().find(|p| p.id == self.segments[i].prompt_id).unwrap();
        let r = self.rollout(i);
        let cot = r.cot_end.map_or(r.completion_ids.len(), |c| c as usize);
        let mut comp: Vec<i64> = r.completion_ids[..cot].iter().map(|&t| t as i64).collect();
        if comp.last().is_some_and(|t| tok.eos_ids.contains(t)) {
            comp.pop();
        }
        (rredcot_ml::traces::encode_prompt(tok, prompt).unwrap(), comp)
    }

    /// y* ids of trace i after `prefix` (the stages' default answer_template).
    fn y(&self, i: usize, prefix: &[i64]) -> Vec<i64> {
        y_star_after(self.model.tokenizer.as_ref().unwrap(), "\nThe answer is {answer}.", self.gold(i).trim(), prefix)
    }

    /// Segment bounds of trace i clamped to `n` completion tokens.
    fn bounds(&self, i: usize, n: usize) -> Vec<(usize, usize)> {
        let s = &self.segments[i];
        s.seg_starts.iter().zip(&s.seg_ends).map(|(&a, &b)| ((a as usize).min(n), (b as usize).min(n))).collect()
    }
}

/// The verifier on what follows the first `</think>` of `response` (special tokens kept), as a
/// thinking model's answer is judged; no end of thinking, no answer.
fn thinking_verdict(gold: &str, response: &str) -> bool {
    response.split_once("</think>").is_some_and(|(_, answer)| rredcot::math::verify_response(gold, &answer.replace("<|im_end|>", "")).correct)
}

/// σ as `l1` normalization of `unnorm`, computed here.
fn l1(unnorm: &[f64]) -> Vec<f64> {
    let mass: f64 = unnorm.iter().map(|x| x.abs()).sum();
    if mass > 0.0 {
        unnorm.iter().map(|x| x.abs() / mass).collect()
    } else {
        vec![1.0 / unnorm.len() as f64; unnorm.len()]
    }
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

use rredcot::analysis::mc_sd::SdIn as SdRow;

#[test]
fn mc_values_are_the_fraction_correct_of_their_completions_and_greedy_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let k = 3usize;
    let pipeline = method_pipeline(dir.path(), "score_mc", &format!("k = {k}, max_new_tokens = 24, batch_size = 8"));
    let (s, run) = run_method(&store, &pipeline, "mc", EASY);
    let tok = run.model.tokenizer.as_ref().unwrap();
    let comps = table::<CompletionRow>(&output(&store, &s, "score", "completions"));
    let exits: usize = run.segments.iter().map(|g| g.seg_ends.len()).sum();
    assert_eq!(comps.len(), exits * k, "k completions from each of the T exit points before the end");
    let rec = record(&store, &s, "score");
    let generated: i64 = comps.iter().map(|c| c.tokens as i64).sum();
    assert_eq!(rec["counters"]["tokens_generated"].as_i64(), Some(generated));
    let lost = comps.iter().filter(|c| c.lost).count();
    assert!(comps.iter().all(|c| !c.lost || c.truncated));
    assert_eq!(rec["counters"]["completions_lost"].as_i64(), Some(lost as i64));
    let frac = rec["metrics"]["truncation_loss_fraction"].as_f64().unwrap();
    assert!((frac - lost as f64 / comps.len() as f64).abs() < 1e-12);
    assert!(comps.iter().any(|c| c.truncated), "24 new tokens truncate some completions of this model");
    // Forward cost: an exit point's k continuations share its prefix's prefill, and so do the
    // exit points of other traces with the same prefix (the prompt) while a slot still holds it:
    // the positions run are at most each run of equal prefixes once and at least each distinct
    // prefix once, plus the tokens generated.
    let (mut runs, mut distinct_prefixes): (Vec<Vec<i64>>, Vec<Vec<i64>>) = (Vec::new(), Vec::new());
    for i in 0..run.scores.len() {
        let (prompt, comp) = run.ids(i);
        let bounds = run.bounds(i, comp.len());
        for t in 0..bounds.len() {
            let upto = if t == 0 { 0 } else { bounds[t - 1].1 };
            let ids: Vec<i64> = prompt.iter().chain(&comp[..upto]).copied().collect();
            if runs.last() != Some(&ids) {
                runs.push(ids.clone());
            }
            if !distinct_prefixes.contains(&ids) {
                distinct_prefixes.push(ids);
            }
        }
    }
    let positions = |p: &[Vec<i64>]| p.iter().map(|p| p.len() as i64).sum::<i64>();
    let prefilled = rec["counters"]["prompt_positions_prefilled"].as_i64().unwrap();
    assert!((positions(&distinct_prefixes)..=positions(&runs)).contains(&prefilled), "{prefilled} positions prefilled: {rec}");
    assert!(prefilled < positions(&runs), "the traces of one prompt share its prefill at their first exit point: {rec}");
    assert_eq!(rec["counters"]["forward_tokens"].as_i64(), Some(prefilled + generated), "{rec}");
    let mut distinct = 0;
    for (i, row) in run.scores.iter().enumerate() {
        let (_, comp) = run.ids(i);
        let t_max = run.segments[i].seg_ends.len();
        assert_eq!((row.r.len(), row.v.len()), (t_max + 1, t_max + 1));
        assert!(row.v.iter().all(|&x| x == 0.0));
        assert_eq!(row.r[t_max], run.rollout(i).reward, "the value after the whole trace is its reward");
        let bounds = run.bounds(i, comp.len());
        for t in 0..t_max {
            let mine: Vec<&CompletionRow> =
                comps.iter().filter(|c| c.prompt_id == row.prompt_id && c.sample_idx == row.sample_idx && c.exit == t as i32).collect();
            assert_eq!(mine.iter().map(|c| c.k).collect::<Vec<_>>(), (0..k as i32).collect::<Vec<_>>());
            // The verdicts re-derived from the prefix text and the stored continuation.
            let upto = if t == 0 { 0 } else { bounds[t - 1].1 };
            let prefix = tok.decode(&comp[..upto], false).unwrap();
            for c in &mine {
                assert_eq!(c.correct, thinking_verdict(run.gold(i), &format!("{prefix}{}", c.text)), "{prefix}{}", c.text);
            }
            let value = mine.iter().filter(|c| c.correct).count() as f64 / k as f64;
            assert_eq!(row.r[t], value, "trace {i} exit {t}");
            distinct += mine.iter().map(|c| c.text.as_str()).collect::<std::collections::BTreeSet<_>>().len();
        }
        let unnorm: Vec<f64> = row.r.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(close(&row.sigma, &l1(&unnorm), 1e-12), "{:?} vs {:?}", row.sigma, l1(&unnorm));
    }
    assert!(distinct > exits, "temperature 1 gives different completions from one exit point");
    let sd: Vec<SdRow> = table(&output(&store, &s, "score", "mc_sd"));
    assert_eq!(sd.iter().map(|r| r.k).collect::<Vec<_>>(), (1..=k as i32).collect::<Vec<_>>());
    assert!(sd.iter().all(|r| r.sd_binomial >= 0.0 && r.sd_bootstrap >= 0.0 && r.exit_points == exits as i32));

    // Short completions with lost = drop: a value is the fraction correct among the completions
    // that were not lost (0 when all were), and truncation loses some.
    let dropped = run_ok(&store, &pipeline, &[EASY, &["--set", "score.max_new_tokens=6", "--set", "score.lost=drop"][..]].concat());
    let dcomps = table::<CompletionRow>(&output(&store, &dropped, "score", "completions"));
    assert!(dcomps.iter().any(|c| c.lost) && dcomps.iter().any(|c| !c.lost), "6 new tokens lose some completions, not all");
    let dscores: Vec<ScoreRow> = read_rows(&output(&store, &dropped, "score", "scores"), Schema::Scores).unwrap();
    for row in &dscores {
        for t in 0..row.r.len() - 1 {
            let kept: Vec<&CompletionRow> = dcomps
                .iter()
                .filter(|c| c.prompt_id == row.prompt_id && c.sample_idx == row.sample_idx && c.exit == t as i32 && !c.lost)
                .collect();
            let want = if kept.is_empty() { 0.0 } else { kept.iter().filter(|c| c.correct).count() as f64 / kept.len() as f64 };
            assert_eq!(row.r[t], want, "lost = drop: exit {t}");
        }
    }

    // Temperature → 0: the k completions coincide and the value is greedy correctness, checked
    // against a greedy generation from the prefix done here (one row per batch, as here, so no
    // padding changes the arithmetic).
    let greedy = run_ok(&store, &pipeline, &[EASY, &["--set", "score.temperature=0.0", "--set", "score.batch_size=1"][..]].concat());
    let gcomps = table::<CompletionRow>(&output(&store, &greedy, "score", "completions"));
    for c in &gcomps {
        let first = gcomps.iter().find(|d| (&d.prompt_id, d.sample_idx, d.exit) == (&c.prompt_id, c.sample_idx, c.exit)).unwrap();
        assert_eq!((&c.text, c.correct), (&first.text, first.correct), "greedy completions from one exit point coincide");
    }
    let scores: Vec<ScoreRow> = read_rows(&output(&store, &greedy, "score", "scores"), Schema::Scores).unwrap();
    let p = SamplingParams { temperature: 0.0, max_new_tokens: 24, ..Default::default() };
    let mut seen = [0; 2];
    for (i, row) in scores.iter().enumerate() {
        let (prompt, comp) = run.ids(i);
        let bounds = run.bounds(i, comp.len());
        for t in 0..bounds.len() {
            let upto = if t == 0 { 0 } else { bounds[t - 1].1 };
            let ids: Vec<i64> = prompt.iter().chain(&comp[..upto]).copied().collect();
            let g = generate(&run.model.model, Some(tok), &[ids], &[7], &p).unwrap().remove(0);
            let response = format!("{}{}", tok.decode(&comp[..upto], false).unwrap(), tok.decode(&g.tokens, false).unwrap());
            let want = thinking_verdict(run.gold(i), &response) as u8 as f64;
            assert_eq!(row.r[t], want, "trace {i} exit {t}: greedy value");
            seen[want as usize] += 1;
        }
    }
    assert!(seen[0] > 0 && seen[1] > 0, "greedy values of both kinds were checked: {seen:?}");
    assert!(run.scores.iter().any(|r| r.r.iter().any(|&v| v > 0.0 && v < 1.0)), "some sampled values are fractions");
}

#[test]
fn loo_is_log_p_with_minus_without_each_segment() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let pipeline = method_pipeline(dir.path(), "score_loo", "normalize = \"l1\"");
    let (_, run) = run_method(&store, &pipeline, "loo", &[]);
    let sum = |pairs: &[(Vec<i64>, Vec<i64>)]| -> Vec<f64> {
        model::logprob(&run.model.model, pairs, 1).unwrap().iter().map(|lp| lp.iter().map(|&x| x as f64).sum()).collect()
    };
    let mut informative = 0;
    for (i, row) in run.scores.iter().enumerate() {
        let (prompt, comp) = run.ids(i);
        let full: Vec<i64> = prompt.iter().chain(&comp).copied().collect();
        let with = sum(&[(full.clone(), run.y(i, &full))])[0];
        let want: Vec<f64> = run
            .bounds(i, comp.len())
            .iter()
            .map(|&(s, e)| {
                let without: Vec<i64> = prompt.iter().chain(&comp[..s]).chain(&comp[e..]).copied().collect();
                let y = run.y(i, &without);
                with - sum(&[(without, y)])[0]
            })
            .collect();
        assert!(close(&row.r, &want, 1e-4), "trace {i}: stage {:?} vs two logprob calls {want:?}", row.r);
        assert!(row.v.len() == row.r.len() && row.v.iter().all(|&x| x == 0.0));
        assert!(close(&row.sigma, &l1(&want), 1e-4));
        informative += want.iter().filter(|x| x.abs() > 1e-3).count();
    }
    assert!(informative > 0, "some segments move the answer's likelihood");

    // target = rest: PMI of u_t with the subsequent segments and y*.
    let s = run_ok(&store, &pipeline, &["--set", "score.target=rest", "--set", "score.normalize=none"]);
    let scores: Vec<ScoreRow> = read_rows(&output(&store, &s, "score", "scores"), Schema::Scores).unwrap();
    for (i, row) in scores.iter().enumerate() {
        let (prompt, comp) = run.ids(i);
        let full: Vec<i64> = prompt.iter().chain(&comp).copied().collect();
        let want: Vec<f64> = run
            .bounds(i, comp.len())
            .iter()
            .map(|&(s, e)| {
                // Each sequence asks for y* joined to how it ends: the whole trace, or the trace
                // without u_t.
                let rest = |y: Vec<i64>| -> Vec<i64> { comp[e..].iter().copied().chain(y).collect() };
                let with: Vec<i64> = prompt.iter().chain(&comp[..e]).copied().collect();
                let without: Vec<i64> = prompt.iter().chain(&comp[..s]).copied().collect();
                let without_all: Vec<i64> = without.iter().chain(&comp[e..]).copied().collect();
                let v = sum(&[(with, rest(run.y(i, &full))), (without, rest(run.y(i, &without_all)))]);
                v[0] - v[1]
            })
            .collect();
        assert!(close(&row.r, &want, 1e-4), "trace {i} (rest): {:?} vs {want:?}", row.r);
        assert_eq!(row.sigma, row.r, "normalize = none keeps the PMI");
    }
}

const GRAD_REF: &str = r#"
import json, sys, torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(2)
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()
out = []
for seq, start in json.load(open(sys.argv[2])):
    ids = torch.tensor([seq])
    e = m.get_input_embeddings()(ids).detach().requires_grad_(True)
    lp = m(inputs_embeds=e).logits[0].float().log_softmax(-1)
    total = lp[start - 1:-1].gather(-1, ids[0, start:, None]).sum()
    total.backward()
    out.append(e.grad[0].abs().sum(-1).double().tolist())
json.dump(out, open(sys.argv[3], "w"))
"#;

#[test]
fn grad_attribution_equals_torch_autograd_per_segment() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let pipeline = method_pipeline(dir.path(), "score_grad", "normalize = \"l1\"");
    let (s, run) = run_method(&store, &pipeline, "grad", &[]);
    assert_eq!(record(&store, &s, "score")["counters"]["backward_passes"].as_i64(), Some(run.scores.len() as i64));
    for row in &run.scores {
        assert!(row.r.iter().all(|&x| x.is_finite() && x >= 0.0) && row.r.iter().any(|&x| x > 0.0));
        assert!(close(&row.sigma, &l1(&row.r), 1e-12));
    }
    let venv = std::env::var("RREDCOT_VENV").map(PathBuf::from).unwrap_or_else(|_| repo().join(".venv"));
    let py = venv.join("bin/python");
    if !Command::new(&py).args(["-c", "import torch, transformers"]).output().is_ok_and(|o| o.status.success()) {
        eprintln!("SKIP grad autograd parity: {} lacks torch/transformers", py.display());
        return;
    }
    let seqs: Vec<(Vec<i64>, usize)> = (0..run.scores.len())
        .map(|i| {
            let (prompt, comp) = run.ids(i);
            let start = prompt.len() + comp.len();
            let full: Vec<i64> = prompt.into_iter().chain(comp).collect();
            let y = run.y(i, &full);
            (full.into_iter().chain(y).collect(), start)
        })
        .collect();
    let (inp, outp) = (dir.path().join("seqs.json"), dir.path().join("grads.json"));
    std::fs::write(&inp, serde_json::to_string(&seqs).unwrap()).unwrap();
    let ckpt = output(&store, &s, "sft", "model");
    let out = Command::new(&py).args(["-c", GRAD_REF]).arg(&ckpt).arg(&inp).arg(&outp).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let grads: Vec<Vec<f64>> = serde_json::from_slice(&std::fs::read(&outp).unwrap()).unwrap();
    for (i, row) in run.scores.iter().enumerate() {
        let (prompt, comp) = run.ids(i);
        let p = prompt.len();
        let want: Vec<f64> = run
            .bounds(i, comp.len())
            .iter()
            .map(|&(s, e)| if e > s { grads[i][p + s..p + e].iter().sum::<f64>() / (e - s) as f64 } else { 0.0 })
            .collect();
        assert!(close(&row.r, &want, 1e-3), "trace {i}: stage {:?} vs torch autograd {want:?}", row.r);
    }
}
