//! Seed 002 (progress reward + entropy-weighted advantages) and seed 004 (RRPO / SRPO resets)
//! through the real worker binary, on the shipped `pipelines/progress-reward.toml` and
//! `pipelines/resets.toml` at toy scale, each ending in a policy update. Values, reset points and
//! rewards are recomputed here from the artifacts and the checkpoints; forced reruns reproduce
//! the hashes.

use std::path::Path;
use std::process::Command;

use rredcot::artifact::rows::{PromptRow, RolloutRow, ScoreRow, SegmentRow};
use rredcot::artifact::{read_rows, Schema};
use rredcot_ml::model::{self, ChatMessage};
use rredcot_ml::traces::encode_prompt;
use serde_json::Value;

mod common;
use common::{output, record, repo, y_star_after, table, TINY_ROLLOUT, TINY_WORLD};

/// The prover: as tiny as the policy, another seed, a little longer.
const TINY_PROVER: &[&str] = &[
    "prover.steps=60", "prover.batch_size=8", "prover.layers=2", "prover.hidden=64", "prover.heads=2",
    "prover.kv_heads=1", "prover.intermediate=128", "prover.eval_n=4", "prover.eval_max_new_tokens=16",
];

fn run(store: &Path, pipeline: &str, sets: &[&str]) -> Value {
    run_with(store, pipeline, sets, &[])
}

/// `run` with extra command-line arguments (e.g. `--force STAGE`).
fn run_with(store: &Path, pipeline: &str, sets: &[&str], extra: &[&str]) -> Value {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store").arg(store).args(["pipeline", "run"]).arg(repo().join("pipelines").join(pipeline)).arg("--json");
    for s in TINY_WORLD.iter().chain(TINY_ROLLOUT).chain(["segment.max_segments=4"].iter()).chain(sets) {
        c.args(["--set", s]);
    }
    let out = c.args(extra).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn hash(store: &Path, s: &Value, stage: &str, name: &str) -> String {
    record(store, s, stage)["outputs"][name]["hash"].as_str().unwrap().to_string()
}

/// (prompt, rollout) of a segments row.
fn trace<'a>(prompts: &'a [PromptRow], rollouts: &'a [RolloutRow], seg: &SegmentRow) -> (&'a PromptRow, &'a RolloutRow) {
    let p = prompts.iter().find(|p| p.id == seg.prompt_id).unwrap();
    let r = rollouts.iter().find(|r| r.prompt_id == seg.prompt_id && r.sample_idx == seg.sample_idx).unwrap();
    (p, r)
}

#[test]
fn progress_values_are_the_provers_and_reduce_to_grpo_without_progress_or_entropy() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let base: Vec<&str> = TINY_PROVER.iter().copied().chain(["progress.max_new_tokens=24", "progress.k=2"]).collect();

    // Prefill estimate: V_t = p_prover(y* | x, u_1..u_t), recomputed here with the prover.
    let pre: Vec<&str> = base.iter().copied().chain(["progress.estimate=prefill"]).collect();
    let s = run(&store, "progress-reward.toml", &pre);
    assert_ne!(hash(&store, &s, "sft", "model"), hash(&store, &s, "prover", "model"), "the prover is a checkpoint of its own");
    let prompts: Vec<PromptRow> = read_rows(&output(&store, &s, "taskgen", "train"), Schema::Prompts).unwrap();
    let rollouts: Vec<RolloutRow> = read_rows(&output(&store, &s, "rollout", "rollouts"), Schema::Rollouts).unwrap();
    let segs: Vec<SegmentRow> = read_rows(&output(&store, &s, "segment", "segments"), Schema::Segments).unwrap();
    let scores: Vec<ScoreRow> = read_rows(&output(&store, &s, "progress", "scores"), Schema::Scores).unwrap();
    let prover = model::load(&output(&store, &s, "prover", "model"), &Default::default()).unwrap();
    let tok = prover.tokenizer.as_ref().unwrap();
    assert_eq!(scores.len(), segs.len());
    let mut moved = 0;
    for (row, seg) in scores.iter().zip(&segs) {
        let (p, r) = trace(&prompts, &rollouts, seg);
        assert_eq!(row.method, "progress");
        assert_eq!(row.r.len(), seg.seg_ends.len() + 1, "V_0..V_T");
        let mut comp: Vec<i64> = r.completion_ids[..r.cot_len()].iter().map(|&t| t as i64).collect();
        if comp.last().is_some_and(|t| tok.eos_ids.contains(t)) {
            comp.pop();
        }
        let prompt = encode_prompt(tok, p).unwrap();
        let cuts = std::iter::once(0).chain(seg.seg_ends.iter().map(|&e| (e as usize).min(comp.len())));
        for (t, upto) in cuts.enumerate() {
            let ctx: Vec<i64> = prompt.iter().chain(&comp[..upto]).copied().collect();
            // The stage's default answer_template, joined to the prefix.
            let y = y_star_after(tok, "\nThe answer is {answer}.", p.answer.as_deref().unwrap().trim(), &ctx);
            let lp: f64 = model::logprob(&prover.model, &[(ctx, y)], 1).unwrap()[0].iter().map(|&x| x as f64).sum();
            assert!((row.r[t] - lp.exp()).abs() <= 1e-4 * lp.exp().max(1e-6), "V_{t} = {} vs p = {}", row.r[t], lp.exp());
        }
        moved += row.r.windows(2).any(|w| (w[1] - w[0]).abs() > 1e-6) as usize;
        let delta: Vec<f64> = row.r.windows(2).map(|w| w[1] - w[0]).collect();
        let mass: f64 = delta.iter().map(|d| d.abs()).sum();
        if mass > 0.0 {
            assert!(row.sigma.iter().zip(&delta).all(|(s, d)| (s - d / mass).abs() < 1e-9), "σ = signed_l1(Δ)");
        }
    }
    assert!(moved > 0, "some step changes the prover's probability");

    // The update: with no progress term and no entropy weighting it is exactly GRPO's (same
    // checkpoint bytes as credit = uniform); with them, a different policy.
    let reduced: Vec<&str> = pre.iter().copied().chain(["update.progress_coef=0.0", "update.entropy_mix=0.0"]).collect();
    let grpo: Vec<&str> = pre.iter().copied().chain(["update.credit=uniform"]).collect();
    let h_reduced = hash(&store, &run(&store, "progress-reward.toml", &reduced), "update", "policy");
    let h_grpo = hash(&store, &run(&store, "progress-reward.toml", &grpo), "update", "policy");
    assert_eq!(h_reduced, h_grpo);
    assert_ne!(hash(&store, &s, "update", "policy"), h_grpo, "progress + entropy weighting changed the update");

    // Monte Carlo estimate: V_T is the trace's own reward, the rest fractions of k = 2 prover
    // completions; deterministic under a forced rerun.
    let mc = run(&store, "progress-reward.toml", &base);
    let scores: Vec<ScoreRow> = read_rows(&output(&store, &mc, "progress", "scores"), Schema::Scores).unwrap();
    for (row, seg) in scores.iter().zip(&segs) {
        let (_, r) = trace(&prompts, &rollouts, seg);
        assert_eq!(*row.r.last().unwrap(), r.reward);
        assert!(row.r.iter().all(|v| [0.0, 0.5, 1.0].contains(v)), "{:?}", row.r);
    }
    let rec = record(&store, &mc, "progress");
    assert_eq!(rec["counters"]["completions"].as_i64(), Some(segs.iter().map(|g| 2 * g.seg_ends.len() as i64).sum()));
    let again = run_with(&store, "progress-reward.toml", &base, &["--force", "progress"]);
    assert!(again["ran"].as_array().unwrap().iter().any(|x| x == "progress"), "{again}");
    assert_eq!(hash(&store, &again, "progress", "scores"), hash(&store, &mc, "progress", "scores"));
}

use rredcot_ml::stages::reset::ResetRow;

#[test]
fn resets_continue_the_trace_before_the_chosen_step_and_train_on_the_new_groups() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let k = 2usize;
    let sets = ["reset.k=2", "reset.max_new_tokens=24", "reset.traces=all"];
    let s = run(&store, "resets.toml", &sets);
    let prompts: Vec<PromptRow> = read_rows(&output(&store, &s, "taskgen", "train"), Schema::Prompts).unwrap();
    let rollouts: Vec<RolloutRow> = read_rows(&output(&store, &s, "rollout", "rollouts"), Schema::Rollouts).unwrap();
    let segs: Vec<SegmentRow> = read_rows(&output(&store, &s, "segment", "segments"), Schema::Segments).unwrap();
    let out_prompts: Vec<PromptRow> = read_rows(&output(&store, &s, "reset", "prompts"), Schema::Prompts).unwrap();
    let out_rollouts: Vec<RolloutRow> = read_rows(&output(&store, &s, "reset", "rollouts"), Schema::Rollouts).unwrap();
    let resets = table::<ResetRow>(&output(&store, &s, "reset", "resets"));
    let policy = model::load(&output(&store, &s, "sft", "model"), &Default::default()).unwrap();
    let tok = policy.tokenizer.as_ref().unwrap();

    assert_eq!(resets.len(), segs.len(), "traces = all: every trace is reset once");
    assert_eq!(out_rollouts.len(), rollouts.len() + k * segs.len(), "the originals, then k continuations per reset");
    assert_eq!(&out_rollouts[..rollouts.len()], &rollouts[..]);
    let template = "{question}\n\nA solution, step by step:\n{steps}\n\nWhich step is the first wrong one?";
    let (mut contexts, mut localize): (Vec<Vec<i64>>, i64) = (Vec::new(), 0);
    for (row, seg) in resets.iter().zip(&segs) {
        assert_eq!((row.prompt_id.as_str(), row.sample_idx, row.mode.as_str()), (seg.prompt_id.as_str(), seg.sample_idx, "self"));
        let (p, r) = trace(&prompts, &rollouts, seg);
        assert_eq!(row.original_reward, r.reward);
        let t = row.reset_step as usize;
        assert!(t >= 1 && t <= seg.seg_ends.len() && row.steps as usize == seg.seg_ends.len());
        // The prefix is the completion before step t, and the reset prompt is the original one
        // with it appended.
        let start = seg.seg_starts[t - 1] as usize;
        let prefix: Vec<i64> = r.completion_ids[..start].iter().map(|&x| x as i64).collect();
        assert_eq!(row.prefix_tokens as usize, prefix.len());
        let rp = out_prompts.iter().find(|q| q.id == row.reset_id).unwrap();
        assert_eq!((rp.answer.as_deref(), rp.prompt.as_str()), (p.answer.as_deref(), p.prompt.as_str()));
        let want: Vec<i64> = encode_prompt(tok, p).unwrap().into_iter().chain(prefix.iter().copied()).collect();
        assert_eq!(encode_prompt(tok, rp).unwrap(), want);
        if contexts.last() != Some(&want) {
            contexts.push(want);
        }
        // SRPO's step, recomputed: the most likely "first wrong step" answer (earliest on ties).
        let mut comp: Vec<i64> = r.completion_ids[..r.cot_len()].iter().map(|&x| x as i64).collect();
        if comp.last().is_some_and(|x| tok.eos_ids.contains(x)) {
            comp.pop();
        }
        let steps: Vec<String> = seg
            .seg_starts
            .iter()
            .zip(&seg.seg_ends)
            .enumerate()
            .map(|(i, (&a, &b))| {
                let (a, b) = ((a as usize).min(comp.len()), (b as usize).min(comp.len()));
                format!("Step {}: {}", i + 1, tok.decode(&comp[a..b], true).unwrap().trim())
            })
            .collect();
        let ask = template.replace("{question}", &rredcot::prompt_text::prompt_text(&p.prompt)).replace("{steps}", &steps.join("\n"));
        let ctx = tok.encode_chat(&[ChatMessage::new("user", &ask)], true).unwrap();
        let lps: Vec<f64> = (1..=steps.len())
            .map(|i| {
                let a = tok.encode(&format!("The first wrong step is step {i}.")).unwrap();
                localize += (ctx.len() + a.len()) as i64;
                model::logprob(&policy.model, &[(ctx.clone(), a)], 1).unwrap()[0].iter().map(|&x| x as f64).sum()
            })
            .collect();
        let best = lps.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (i, &l)| if l > b.1 + 1e-6 { (i, l) } else { b }).0 + 1;
        assert_eq!(t, best, "localized step vs {lps:?}");
        // The continuations: k rows, rewards re-verified on prefix + continuation.
        let conts: Vec<&RolloutRow> = out_rollouts.iter().filter(|c| c.prompt_id == row.reset_id).collect();
        assert_eq!(conts.len(), k);
        for c in &conts {
            // Judged after the continuation's end of thinking (`</think>`), as a rollout is.
            let ids: Vec<i64> = c.completion_ids.iter().map(|&x| x as i64).collect();
            let closed = ids.iter().position(|&x| Some(x) == tok.think_end_id);
            assert_eq!(c.cot_end, closed.map(|i| i as i32 + 1));
            let ok = closed.is_some_and(|i| rredcot::math::verify_response(p.answer.as_deref().unwrap(), &tok.decode(&ids[i + 1..], true).unwrap()).correct);
            assert_eq!(c.reward, if ok { 1.0 } else { 0.0 });
            assert_eq!(c.entropies.len(), c.completion_ids.len());
        }
        let mean = conts.iter().map(|c| c.reward).sum::<f64>() / k as f64;
        assert_eq!(row.continuation_mean_reward, mean);
    }
    // A reset's k continuations share its context's prefill (a run of equal contexts, once).
    let rec = record(&store, &s, "reset");
    let prefilled: i64 = contexts.iter().map(|c| c.len() as i64).sum();
    assert_eq!(rec["counters"]["prompt_positions_prefilled"].as_i64(), Some(prefilled), "{rec}");
    let generated: i64 = out_rollouts[rollouts.len()..].iter().map(|c| c.completion_ids.len() as i64).sum();
    assert_eq!(rec["counters"]["tokens_generated"].as_i64(), Some(generated));
    assert_eq!(rec["counters"]["forward_tokens"].as_i64(), Some(localize + prefilled + generated), "{rec}");
    // The update trained on the original groups and the reset groups.
    let upd = record(&store, &s, "update");
    let groups = rollouts.iter().map(|r| r.prompt_id.as_str()).collect::<std::collections::BTreeSet<_>>().len();
    assert_eq!(upd["counters"]["groups"].as_i64(), Some((groups + segs.len()) as i64));

    // RRPO: a random step per trace, deterministic for the seed; another seed moves some.
    let rr = run(&store, "resets.toml", &[&sets[..], &["reset.uses=reset_random"]].concat());
    let rows = table::<ResetRow>(&output(&store, &rr, "reset", "resets"));
    assert!(rows.iter().all(|r| r.mode == "random" && r.reset_step >= 1 && r.reset_step <= r.steps));
    let again = run_with(&store, "resets.toml", &[&sets[..], &["reset.uses=reset_random"]].concat(), &["--force", "reset"]);
    assert!(again["ran"].as_array().unwrap().iter().any(|x| x == "reset"), "{again}");
    assert_eq!(hash(&store, &again, "reset", "rollouts"), hash(&store, &rr, "reset", "rollouts"));
    let other = table::<ResetRow>(&output(&store, &run(&store, "resets.toml", &[&sets[..], &["reset.uses=reset_random", "reset.seed=7"]].concat()), "reset", "resets"));
    if rows.iter().any(|r| r.steps > 1) {
        let moved = rows.iter().zip(&other).filter(|(a, b)| a.reset_step != b.reset_step).count();
        assert!(moved > 0, "a different seed resets some multi-step trace elsewhere");
    }

    // SRPO's default: only incorrect traces are reset.
    let srpo = run(&store, "resets.toml", &["reset.k=2", "reset.max_new_tokens=24"]);
    let wrong = rollouts.iter().filter(|r| r.reward == 0.0).count();
    assert_eq!(table::<ResetRow>(&output(&store, &srpo, "reset", "resets")).len(), wrong);
}
