//! Thinking-aware credit end to end (issue 18, point 1), through the real worker binary.
//!
//! The default world thinks (`<think>…</think>\nThe answer is N.`). Traces written here from the
//! reference solutions (correct thinking traces, and one whose thinking never closes) go through
//! `segment`, `score_sigma`, `score_loo`, `score_mc` and the σ update. Checked independently:
//! segments stop at `cot_end` (the answer after `</think>` gets none), R_T is log p(y*) right
//! after `</think>` (one plain `logprob` call), LOO's "with" term is y* after the chain of thought,
//! MC samples only from exit points inside it, and R_T is not the "answer asked twice" pattern
//! (the value y* gets after the model's own answer); `on_unclosed` truncates, skips or stops.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rredcot::artifact::rows::{PromptRow, RolloutRow, ScoreRow, SegmentRow};
use rredcot::artifact::{read_rows, write_rows, Schema};
use rredcot_ml::model::{self, Tokenizer};
use serde_json::Value;

mod common;
use common::{output, record, repo, y_star_after, TINY_WORLD};

/// A longer SFT than the tiny world's, so the policy has learnt the answer format.
const WORLD: &[&str] = &["sft.steps=300"];
/// How y* follows `</think>` in the default world (as the quickstart scores it).
const TEMPLATE: &str = "\nThe answer is {answer}.";

fn worker(store: &Path, pipeline: &Path, sets: &[&str], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store")
        .arg(store)
        .args(["pipeline", "run"])
        .arg(pipeline)
        .arg("--json")
        .args(args);
    for s in TINY_WORLD.iter().chain(WORLD).chain(sets) {
        c.args(["--set", s]);
    }
    c.output().unwrap()
}

fn run_ok(store: &Path, pipeline: &Path, sets: &[&str], args: &[&str]) -> Value {
    let out = worker(store, pipeline, sets, args);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `incremental-rescore.toml`'s world (taskgen, tokenizer, sft) followed by the credit stages
/// reading the rollouts written at `rollouts`.
fn pipeline(dir: &Path, rollouts: &Path) -> PathBuf {
    let base = std::fs::read_to_string(repo().join("pipelines/incremental-rescore.toml")).unwrap();
    let world = &base[..base
        .find("[[stage]]\nname = \"rollout\"")
        .expect("the world stages come first")];
    let r = format!("file:{}", rollouts.display());
    let body = format!(
        r#"stage_dirs = [{stages:?}]
{world}
[[stage]]
name = "segment"
uses = "segment"
inputs = {{ rollouts = "{r}", tokenizer = "sft.model" }}
params = {{ method = "hybrid", max_segments = 6 }}

[[stage]]
name = "score"
uses = "score_sigma"
inputs = {{ prompts = "taskgen.eval", rollouts = "{r}", segments = "segment.segments", policy = "sft.model" }}
params = {{ normalize = "l1", terms = "both", answer_template = {TEMPLATE:?} }}

[[stage]]
name = "loo"
uses = "score_loo"
inputs = {{ prompts = "taskgen.eval", rollouts = "{r}", segments = "segment.segments", policy = "sft.model" }}
params = {{ target = "answer", normalize = "l1", answer_template = {TEMPLATE:?} }}

[[stage]]
name = "mc"
uses = "score_mc"
inputs = {{ prompts = "taskgen.eval", rollouts = "{r}", segments = "segment.segments", policy = "sft.model" }}
params = {{ k = 2, max_new_tokens = 24, batch_size = 8 }}

[[stage]]
name = "update"
uses = "update_rredcot"
inputs = {{ prompts = "taskgen.eval", rollouts = "{r}", scores = "score.scores", segments = "segment.segments", policy = "sft.model", optimizer = "sft.model", reference = "sft.model" }}
params = {{ lr = 1e-4, loss_type = "dapo" }}
"#,
        stages = repo().join("stages").display().to_string(),
    );
    let p = dir.join("thinking.toml");
    std::fs::write(&p, body).unwrap();
    p
}

/// Rollouts that are the reference solutions themselves (correct thinking traces, closed by
/// `<|im_end|>`), plus, as sample 1 of the first prompt, the first one cut before its `</think>`
/// (thinking never closed, reward 0), and as sample 1 of the second prompt its bare answer line
/// with `cot_end = 0` (as a model without thinking that answers on its first line writes it: an
/// empty chain of thought).
fn reference_rollouts(prompts: &[PromptRow], tok: &Tokenizer, policy: &str) -> Vec<RolloutRow> {
    let te = tok
        .think_end_id
        .expect("the world's tokenizer has </think>");
    let row = |p: &PromptRow, sample_idx: i32, ids: Vec<i64>, reward: f64| {
        let n = ids.len();
        RolloutRow {
            prompt_id: p.id.clone(),
            sample_idx,
            text: tok.decode(&ids, true).unwrap(),
            cot_end: ids.iter().position(|&t| t == te).map(|i| i as i32 + 1),
            completion_ids: ids.iter().map(|&t| t as i32).collect(),
            logprobs: vec![-0.5; n],
            entropies: (0..n).map(|i| 0.1 + (i % 5) as f32 * 0.3).collect(),
            answer_extracted: (reward > 0.0).then(|| p.answer.clone().unwrap()),
            reward,
            finish_reason: if reward > 0.0 { "stop" } else { "length" }.into(),
            policy_ckpt: policy.into(),
        }
    };
    let mut out = Vec::new();
    for p in &prompts[..4] {
        let ids = tok
            .encode(&format!("{}<|im_end|>", p.solution.as_deref().unwrap()))
            .unwrap();
        out.push(row(p, 0, ids, 1.0));
    }
    let open = tok
        .encode(
            &prompts[0].solution.as_deref().unwrap()[..prompts[0]
                .solution
                .as_deref()
                .unwrap()
                .find("</think>")
                .unwrap()],
        )
        .unwrap();
    out.push(row(&prompts[0], 1, open, 0.0));
    let answer_only = tok
        .encode(&format!("The answer is {}.<|im_end|>", prompts[1].answer.as_deref().unwrap()))
        .unwrap();
    out.push(RolloutRow { cot_end: Some(0), ..row(&prompts[1], 1, answer_only, 1.0) });
    out
}

fn logp(m: &model::LoadedModel, ctx: Vec<i64>, target: &[i64]) -> f64 {
    model::logprob(&m.model, &[(ctx, target.to_vec())], 1).unwrap()[0]
        .iter()
        .map(|&x| x as f64)
        .sum()
}

#[test]
fn credit_covers_the_chain_of_thought_and_y_star_is_scored_after_think_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // 1. The world (taskgen, tokenizer, SFT), then rollouts written from its reference solutions.
    let world = run_ok(
        &store,
        &repo().join("pipelines/incremental-rescore.toml"),
        &[],
        &["--until", "sft"],
    );
    let prompts: Vec<PromptRow> =
        read_rows(&output(&store, &world, "taskgen", "eval"), Schema::Prompts).unwrap();
    let sft = output(&store, &world, "sft", "model");
    let m = model::load(&sft, &Default::default()).unwrap();
    let tok = m.tokenizer.as_ref().unwrap();
    let policy = record(&store, &world, "sft")["outputs"]["model"]["hash"]
        .as_str()
        .unwrap()
        .to_string();
    let rollouts = reference_rollouts(&prompts, tok, &policy);
    let path = dir.path().join("rollouts.parquet");
    write_rows(&path, Schema::Rollouts, &rollouts).unwrap();
    let p = pipeline(dir.path(), &path);
    let s = run_ok(&store, &p, &[], &[]);

    // 2. Segments tile 0..cot_end: the answer after `</think>` has no segment. The never-closed
    //    trace is segmented whole (on_unclosed = truncate), counted. The answer-only trace (the
    //    last row) has nothing to segment: no row, counted, and not as never-closed.
    let segs: Vec<SegmentRow> =
        read_rows(&output(&store, &s, "segment", "segments"), Schema::Segments).unwrap();
    assert_eq!(segs.len(), rollouts.len() - 1);
    assert!(!segs
        .iter()
        .any(|s| s.prompt_id == rollouts[5].prompt_id && s.sample_idx == 1));
    let seg_rec = record(&store, &s, "segment");
    assert_eq!(seg_rec["counters"]["thinking_unclosed"].as_i64(), Some(1));
    assert_eq!(seg_rec["counters"]["no_chain_of_thought"].as_i64(), Some(1));
    let after: usize = rollouts
        .iter()
        .map(|r| r.completion_ids.len() - r.cot_len())
        .sum();
    assert!(after > 0);
    assert_eq!(
        seg_rec["counters"]["tokens_after_cot"].as_i64(),
        Some(after as i64)
    );
    for (sg, r) in segs.iter().zip(&rollouts) {
        let end = *sg.seg_ends.last().unwrap() as usize;
        match r.cot_end {
            Some(c) => {
                assert_eq!(end, c as usize, "segments stop right after </think>");
                assert_eq!(r.completion_ids[end - 1] as i64, tok.think_end_id.unwrap());
                assert!(end < r.completion_ids.len(), "the answer follows");
            }
            None => assert_eq!(
                end,
                r.completion_ids.len(),
                "truncate: the whole completion"
            ),
        }
    }

    // 3. σ: R_T is y* right after the chain of thought, one plain logprob call; it is not the
    //    "answer asked twice" value (y* after the model's own answer), and the segment that
    //    closes the thinking raises it.
    let scores: Vec<ScoreRow> =
        read_rows(&output(&store, &s, "score", "scores"), Schema::Scores).unwrap();
    let mut gaps = Vec::new();
    for (row, r) in scores.iter().zip(&rollouts) {
        let prompt = prompts.iter().find(|q| q.id == r.prompt_id).unwrap();
        let pids = rredcot_ml::traces::encode_prompt(tok, prompt).unwrap();
        let gold = prompt.answer.as_deref().unwrap();
        let cot: Vec<i64> = r.completion_ids[..r.cot_len()]
            .iter()
            .map(|&t| t as i64)
            .collect();
        let t_max = row.r.len() - 1;
        let after_cot: Vec<i64> = pids.iter().chain(&cot).copied().collect();
        let y = y_star_after(tok, TEMPLATE, gold, &after_cot);
        let want = logp(&m, after_cot, &y);
        assert!(
            (row.r[t_max] - want).abs() < 1e-4,
            "R_T {} vs y* after the thinking {want}",
            row.r[t_max]
        );
        if r.cot_end.is_some() {
            let mut own: Vec<i64> = r.completion_ids.iter().map(|&t| t as i64).collect();
            own.pop(); // <|im_end|>
            let after_own: Vec<i64> = pids.iter().chain(&own).copied().collect();
            let y = y_star_after(tok, TEMPLATE, gold, &after_own);
            let twice = logp(&m, after_own, &y);
            eprintln!(
                "trace {} R = {:?}; y* after the own answer {twice:.3}",
                r.prompt_id, row.r
            );
            assert!(
                row.r[t_max] > twice,
                "R_T {} must beat the answer asked twice {twice}",
                row.r[t_max]
            );
            assert!(
                row.r[t_max] > row.r[t_max - 1],
                "closing the thinking raises log p(y*): {:?}",
                row.r
            );
            gaps.push(row.r[t_max] - twice);
        }
    }
    let mean_gap = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!(
        mean_gap > 2.0,
        "R_T vs the answer asked twice: mean gap {mean_gap:.3} nats"
    );

    // 4. LOO (target = answer): the "with" term is y* after the whole chain of thought.
    let loo: Vec<ScoreRow> =
        read_rows(&output(&store, &s, "loo", "scores"), Schema::Scores).unwrap();
    for ((row, r), sg) in loo.iter().zip(&rollouts).zip(&segs) {
        let prompt = prompts.iter().find(|q| q.id == r.prompt_id).unwrap();
        let pids = rredcot_ml::traces::encode_prompt(tok, prompt).unwrap();
        let gold = prompt.answer.as_deref().unwrap();
        let mut cot: Vec<i64> = r.completion_ids[..r.cot_len()]
            .iter()
            .map(|&t| t as i64)
            .collect();
        if cot.last().is_some_and(|t| tok.eos_ids.contains(t)) {
            cot.pop();
        }
        let full: Vec<i64> = pids.iter().chain(&cot).copied().collect();
        let with = logp(&m, full.clone(), &y_star_after(tok, TEMPLATE, gold, &full));
        let want: Vec<f64> = sg
            .seg_starts
            .iter()
            .zip(&sg.seg_ends)
            .map(|(&a, &b)| {
                let without: Vec<i64> = pids
                    .iter()
                    .chain(&cot[..a as usize])
                    .chain(&cot[(b as usize).min(cot.len())..])
                    .copied()
                    .collect();
                let y = y_star_after(tok, TEMPLATE, gold, &without);
                with - logp(&m, without, &y)
            })
            .collect();
        assert_eq!(row.r.len(), sg.seg_ends.len());
        for (a, b) in row.r.iter().zip(&want) {
            assert!(
                (a - b).abs() < 1e-3 * (1.0 + b.abs()),
                "LOO {:?} vs {want:?}",
                row.r
            );
        }
    }
    // 5. MC: k completions from each exit point inside the chain of thought; V_T is the reward.
    let mc: Vec<ScoreRow> = read_rows(&output(&store, &s, "mc", "scores"), Schema::Scores).unwrap();
    let mc_rec = record(&store, &s, "mc");
    let exits: usize = segs.iter().map(|g| g.seg_ends.len()).sum();
    assert_eq!(
        mc_rec["counters"]["completions"].as_i64(),
        Some(2 * exits as i64)
    );
    for (row, r) in mc.iter().zip(&rollouts) {
        assert_eq!(*row.r.last().unwrap(), r.reward);
    }
    // σ and the scorers score only segmented traces: none for the answer-only one.
    assert_eq!((scores.len(), loo.len(), mc.len()), (segs.len(), segs.len(), segs.len()));
    // 6. The σ update trained on them (answer tokens at GRPO's weight); the answer-only trace
    //    with GRPO's uniform credit, counted.
    let upd = record(&store, &s, "update");
    assert!(upd["outputs"]["policy"]["hash"].is_string());
    assert_eq!(upd["counters"]["no_cot_uniform_credit"].as_i64(), Some(1));
    assert_eq!(upd["counters"]["unclosed_uniform_credit"].as_i64(), Some(0));

    // 7. on_unclosed = skip: no segments or scores for the open trace, uniform credit in the update.
    let skip = run_ok(&store, &p, &["segment.on_unclosed=skip"], &[]);
    let segs: Vec<SegmentRow> = read_rows(
        &output(&store, &skip, "segment", "segments"),
        Schema::Segments,
    )
    .unwrap();
    assert_eq!(segs.len(), rollouts.len() - 2);
    assert!(!segs
        .iter()
        .any(|s| s.prompt_id == rollouts[4].prompt_id && s.sample_idx == 1));
    assert_eq!(
        record(&store, &skip, "segment")["counters"]["unclosed_skipped"].as_i64(),
        Some(1)
    );
    assert_eq!(
        record(&store, &skip, "update")["counters"]["unclosed_uniform_credit"].as_i64(),
        Some(1)
    );
    assert_eq!(
        record(&store, &skip, "update")["counters"]["no_cot_uniform_credit"].as_i64(),
        Some(1)
    );
    // on_unclosed = error: stops, naming the row.
    let out = worker(&store, &p, &["segment.on_unclosed=error"], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("row 4") && err.contains("never ends"), "{err}");
}
