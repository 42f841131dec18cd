//! The RREDCoT credit chain through the real worker binary, on `pipelines/incremental-rescore.toml`
//! shrunk with `--set`: rollouts carry the policy hash and token counts; segments tile every
//! completion; σ is a distribution per trace that telescopes (normalize = none), equals an
//! independent per-prefix oracle, and agrees between the KV-shared and naive scorers; changing the
//! segmentation reruns exactly segment + score with 0 tokens generated.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rredcot::artifact::rows::{PromptRow, RolloutRow, ScoreRow, SegmentRow};
use rredcot::artifact::{read_rows, Schema};
use serde_json::Value;

// Each test binary uses part of the shared helpers.
mod common;
use common::{output, record, repo, u_star_after, y_star_after, TINY_ROLLOUT, TINY_WORLD};

fn run_pipeline(store: &Path, pipeline: &Path, sets: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store").arg(store).args(["pipeline", "run"]).arg(pipeline).arg("--json");
    for s in TINY_WORLD.iter().chain(TINY_ROLLOUT).chain(sets) {
        c.args(["--set", s]);
    }
    c.output().unwrap()
}

fn run_ok(store: &Path, sets: &[&str]) -> Value {
    let out = run_pipeline(store, &repo().join("pipelines/incremental-rescore.toml"), sets);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn names(v: &Value) -> Vec<String> {
    let mut n: Vec<String> = v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect();
    n.sort();
    n
}

fn scores(store: &Path, s: &Value) -> Vec<ScoreRow> {
    read_rows(&output(store, s, "score", "scores"), Schema::Scores).unwrap()
}

#[test]
fn credit_chain_scores_reruns_incrementally_and_matches_the_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let first = run_ok(&store, &[]);
    let gen = first["counters"]["tokens_generated"].as_i64().unwrap();
    assert!(gen > 0, "the first run samples: {first}");

    // Rollouts: group per prompt, policy hash, consistent per-token arrays, reward from the verifier.
    let rollouts: Vec<RolloutRow> = read_rows(&output(&store, &first, "rollout", "rollouts"), Schema::Rollouts).unwrap();
    assert_eq!(rollouts.len(), 3 * 2);
    let sft = record(&store, &first, "sft");
    let policy_hash = sft["outputs"]["model"]["hash"].as_str().unwrap();
    let roll_rec = record(&store, &first, "rollout");
    let tokens: i64 = rollouts.iter().map(|r| r.completion_ids.len() as i64).sum();
    assert_eq!(roll_rec["counters"]["tokens_generated"].as_i64(), Some(tokens));
    let prompts: Vec<PromptRow> = read_rows(&output(&store, &first, "taskgen", "eval"), Schema::Prompts).unwrap();
    let tok_world = tokenizers::Tokenizer::from_file(output(&store, &first, "sft", "model").join("tokenizer.json")).unwrap();
    assert_eq!(tok_world.token_to_id("</think>"), Some(4));
    for r in &rollouts {
        assert_eq!(r.policy_ckpt, policy_hash);
        assert_eq!(r.logprobs.len(), r.completion_ids.len());
        assert_eq!(r.entropies.len(), r.completion_ids.len());
        assert!(r.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
        let gold = prompts.iter().find(|p| p.id == r.prompt_id).unwrap().answer.clone().unwrap();
        // The default world thinks: cot_end follows the first `</think>` (the tokenizer's id 4), the
        // reward is the verifier on the text after it, and a completion without one has none.
        let think_end = r.completion_ids.iter().position(|&t| t == 4);
        assert_eq!(r.cot_end, think_end.map(|i| i as i32 + 1), "cot_end of {:?}", r.completion_ids);
        let answer = think_end.map(|i| {
            let tail: Vec<u32> = r.completion_ids[i + 1..].iter().map(|&t| t as u32).collect();
            tok_world.decode(&tail, true).unwrap()
        });
        assert_eq!(r.reward == 1.0, answer.is_some_and(|a| rredcot::math::verify_response(&gold, &a).correct));
        assert!(think_end.is_some() || r.answer_extracted.is_none());
    }
    assert_eq!(roll_rec["counters"]["thinking_unclosed"].as_i64(), Some(rollouts.iter().filter(|r| r.cot_end.is_none()).count() as i64));

    // Segments tile each completion; σ is a distribution with one value per segment.
    let segs: Vec<SegmentRow> = read_rows(&output(&store, &first, "segment", "segments"), Schema::Segments).unwrap();
    assert_eq!(segs.len(), rollouts.len());
    let sc = scores(&store, &first);
    for (s, r) in segs.iter().zip(&rollouts) {
        assert_eq!((s.prompt_id.as_str(), s.sample_idx), (r.prompt_id.as_str(), r.sample_idx));
        assert_eq!(s.seg_starts[0], 0);
        // Segments tile the chain of thought only (the whole completion when it never closed:
        // on_unclosed = truncate).
        assert_eq!(*s.seg_ends.last().unwrap() as usize, r.cot_len());
        assert!(s.seg_starts.iter().zip(&s.seg_ends).all(|(a, b)| a < b));
        assert!(s.seg_ends[..s.seg_ends.len() - 1] == s.seg_starts[1..]);
        assert!(s.seg_ends.len() <= 40);
    }
    for (row, s) in sc.iter().zip(&segs) {
        assert_eq!(row.sigma.len(), s.seg_ends.len());
        assert_eq!((row.r.len(), row.v.len()), (row.sigma.len() + 1, row.sigma.len() + 1));
        assert!((row.sigma.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{:?}", row.sigma);
        assert!(row.r.iter().chain(&row.v).all(|x| x.is_finite() && *x <= 0.0));
    }

    // An independent oracle: R_t by one plain teacher-forced pass per prefix (model::logprob).
    let ckpt = output(&store, &first, "sft", "model");
    let m = rredcot_ml::model::load(&ckpt, &Default::default()).unwrap();
    let tok = m.tokenizer.as_ref().unwrap();
    let (r0, s0) = (&rollouts[0], &segs[0]);
    let prompt = prompts.iter().find(|p| p.id == r0.prompt_id).unwrap();
    let pids = rredcot_ml::traces::encode_prompt(tok, prompt).unwrap();
    let mut comp: Vec<i64> = r0.completion_ids[..r0.cot_len()].iter().map(|&t| t as i64).collect();
    if comp.last().is_some_and(|t| tok.eos_ids.contains(t)) {
        comp.pop();
    }
    // After each cut, y* (the stages' default answer_template, its newline not stacked on the
    // cut's) and u* (the reference solution's chain of thought, on a line of its own): the
    // world's last cut ends `</think>`, so both ask for a newline there and not after line ends.
    let cuts: Vec<usize> = std::iter::once(0).chain(s0.seg_ends.iter().map(|&e| (e as usize).min(comp.len()))).collect();
    let prefixes: Vec<Vec<i64>> = cuts.iter().map(|&c| pids.iter().chain(&comp[..c]).copied().collect()).collect();
    let body = rredcot::credit::thinking::reasoning_body(prompt.solution.as_deref().unwrap());
    let y_star = |prefix: &[i64]| y_star_after(tok, "\nThe answer is {answer}.", prompt.answer.as_deref().unwrap(), prefix);
    let u_star = |prefix: &[i64]| u_star_after(tok, body, prefix);
    type TargetAfter<'a> = &'a dyn Fn(&[i64]) -> Vec<i64>;
    let checks: [(&str, TargetAfter, &[f64]); 2] = [("R", &y_star, &sc[0].r), ("v", &u_star, &sc[0].v)];
    for (name, target, got) in checks {
        let pairs: Vec<(Vec<i64>, Vec<i64>)> = prefixes.iter().map(|p| (p.clone(), target(p))).collect();
        let forms: std::collections::BTreeSet<usize> = pairs.iter().map(|(_, y)| y.len()).collect();
        assert!(forms.len() > 1, "{name}: trace 0's cuts ask for their target both after a newline and after `</think>`");
        let oracle = rredcot_ml::model::logprob(&m.model, &pairs, 4).unwrap();
        for (t, lp) in oracle.iter().enumerate() {
            let want: f64 = lp.iter().map(|&x| x as f64).sum();
            assert!((got[t] - want).abs() < 1e-4, "{name}_{t}: stage {} vs oracle {want}", got[t]);
        }
    }

    // Changing the segmentation reruns exactly segment + score + update; nothing is sampled again.
    for change in ["segment.max_segments=3", "segment.method=keyword", "segment.method=entropy"] {
        let again = run_ok(&store, &[change]);
        assert_eq!(names(&again["ran"]), vec!["score", "segment", "update"], "{change}: {again}");
        assert!(names(&again["cached"]).contains(&"rollout".to_string()));
        assert_eq!(again["counters"]["tokens_generated"].as_i64().unwrap_or(0), 0, "{change}");
        let segs: Vec<SegmentRow> = read_rows(&output(&store, &again, "segment", "segments"), Schema::Segments).unwrap();
        if change.ends_with("=3") {
            assert!(segs.iter().all(|s| s.seg_ends.len() <= 3));
        }
        assert!(segs.iter().all(|s| s.method == change.split('=').nth(1).unwrap() || change.contains("max_segments")));
    }

    // The naive scorer (one prefill per cut) gives the same values as the KV-shared one.
    let naive = run_ok(&store, &["score.scorer=naive"]);
    assert_eq!(names(&naive["ran"]), vec!["score", "update"]);
    for (a, b) in sc.iter().zip(scores(&store, &naive)) {
        for (x, y) in a.r.iter().chain(&a.v).zip(b.r.iter().chain(&b.v)) {
            assert!((x - y).abs() < 1e-4, "kv-shared {x} vs naive {y}");
        }
    }

    // Rows shared between traces are scored once: the same values, fewer positions run. Each
    // group (2 samples of one prompt) shares at least its prompt-end cut (2 targets).
    let all_rows = run_ok(&store, &["score.dedupe_rows=false"]);
    let (shared, every) = (record(&store, &first, "score"), record(&store, &all_rows, "score"));
    assert!(shared["counters"]["rows_reused"].as_i64().unwrap() >= 3 * 2, "{shared}");
    assert_eq!(every["counters"]["rows_reused"].as_i64(), Some(0));
    assert!(shared["counters"]["forward_tokens"].as_i64() < every["counters"]["forward_tokens"].as_i64());
    // Each cut is scored for its own forms of y* and u* only (trace 0 asks for two of each).
    let cuts: usize = sc.iter().map(|row| row.r.len()).sum();
    assert_eq!(every["counters"]["target_rows"].as_i64(), Some(2 * cuts as i64), "{every}");
    for (a, b) in sc.iter().zip(scores(&store, &all_rows)) {
        for (x, y) in a.r.iter().chain(&a.v).zip(b.r.iter().chain(&b.v)) {
            assert!((x - y).abs() < 1e-4, "shared rows {x} vs every row {y}");
        }
    }

    // normalize = none: Σσ telescopes to (R_T − R_0) + (v_T − v_0) (return equivalence).
    let none = run_ok(&store, &["score.normalize=none"]);
    for row in scores(&store, &none) {
        let t = row.r.len() - 1;
        let want = (row.r[t] - row.r[0]) + (row.v[t] - row.v[0]);
        assert!((row.sigma.iter().sum::<f64>() - want).abs() < 1e-9);
    }

    // Determinism: a fresh store gives the same rollout and score hashes.
    let other = dir.path().join("other");
    let again = run_ok(&other, &[]);
    for stage in ["rollout", "segment", "score"] {
        let out = if stage == "rollout" { "rollouts" } else if stage == "segment" { "segments" } else { "scores" };
        assert_eq!(
            record(&store, &first, stage)["outputs"][out]["hash"],
            record(&other, &again, stage)["outputs"][out]["hash"],
            "{stage} output differs between two fresh stores"
        );
    }
}

#[test]
fn missing_reference_solution_is_a_row_error_or_counted_uniform_credit() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // The same chain, with the solutions dropped from the scored prompts by an external stage.
    std::fs::create_dir_all(dir.path().join("stages")).unwrap();
    std::fs::write(
        dir.path().join("stages/drop_solutions.py"),
        "import sys, pyarrow as pa, pyarrow.parquet as pq\n\
         t = pq.read_table(sys.argv[1])\n\
         i = t.schema.get_field_index('solution')\n\
         t = t.set_column(i, pa.field('solution', pa.string(), nullable=True), pa.nulls(len(t), pa.string()))\n\
         pq.write_table(t, sys.argv[2])\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("stages/drop_solutions.toml"),
        "command = [\"python3\", \"{script}\", \"{inputs.prompts}\", \"{outputs.prompts}\"]\nscript = \"drop_solutions.py\"\n\
         [inputs]\nprompts = \"prompts\"\n[outputs]\nprompts = \"prompts\"\n",
    )
    .unwrap();
    let base = std::fs::read_to_string(repo().join("pipelines/incremental-rescore.toml")).unwrap();
    let body = format!(
        "stage_dirs = [{:?}, \"stages\"]\n{}\n[[stage]]\nname = \"nosol\"\nuses = \"drop_solutions\"\ninputs = {{ prompts = \"taskgen.eval\" }}\n",
        repo().join("stages").display().to_string(),
        base.replace("prompts = \"taskgen.eval\", rollouts", "prompts = \"nosol.prompts\", rollouts")
    );
    let p = dir.path().join("p.toml");
    std::fs::write(&p, body).unwrap();
    let out = run_pipeline(&store, &p, &[]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("no reference solution") && text.contains("row 0 (prompt tg-"), "{text}");
    // Nothing was committed for the failed stage.
    let out = run_pipeline(&store, &p, &["score.on_missing_reference=uniform"]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(names(&s["ran"]), vec!["score", "update"], "only the failed stage and what follows run");
    let rec = record(&store, &s, "score");
    assert_eq!(rec["counters"]["missing_reference"].as_i64(), Some(6));
    for row in scores(&store, &s) {
        assert_eq!(row.method, "uniform");
        let t = row.sigma.len() as f64;
        assert!(row.sigma.iter().all(|&x| (x - 1.0 / t).abs() < 1e-12));
    }
    // terms = answer needs no solution: R-only σ.
    let s = {
        let out = run_pipeline(&store, &p, &["score.terms=answer"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    for row in scores(&store, &s) {
        assert_eq!(row.method, "rredcot");
        assert!(row.v.is_empty() && row.r.len() == row.sigma.len() + 1);
    }
}

/// The incremental pipeline with an external stage spliced between rollout and segment/score.
fn spliced_pipeline(dir: &Path, stage: &str, script: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("stages")).unwrap();
    std::fs::write(dir.join(format!("stages/{stage}.py")), script).unwrap();
    std::fs::write(
        dir.join(format!("stages/{stage}.toml")),
        format!(
            "command = [\"python3\", \"{{script}}\", \"{{inputs.rollouts}}\", \"{{outputs.rollouts}}\"]\nscript = \"{stage}.py\"\n\
             [inputs]\nrollouts = \"rollouts\"\n[outputs]\nrollouts = \"rollouts\"\n"
        ),
    )
    .unwrap();
    let base = std::fs::read_to_string(repo().join("pipelines/incremental-rescore.toml")).unwrap();
    let body = format!(
        "stage_dirs = [{:?}, \"stages\"]\n{}\n[[stage]]\nname = \"bad\"\nuses = \"{stage}\"\ninputs = {{ rollouts = \"rollout.rollouts\" }}\n",
        repo().join("stages").display().to_string(),
        base.replace("rollouts = \"rollout.rollouts\", ", "rollouts = \"bad.rollouts\", ")
    );
    let p = dir.join(format!("{stage}.toml"));
    std::fs::write(&p, body).unwrap();
    p
}

fn failure_text(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure:\n{}", String::from_utf8_lossy(&out.stdout));
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn broken_rollouts_are_row_errors_and_long_traces_error_or_truncate() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let rewrite = |body: &str| {
        format!(
            "import sys, math, pyarrow as pa, pyarrow.parquet as pq\n\
             t = pq.read_table(sys.argv[1]).to_pylist()\n{body}\n\
             pq.write_table(pa.Table.from_pylist(t, schema=pq.read_schema(sys.argv[1])), sys.argv[2])\n"
        )
    };
    // An empty completion: an error naming the row, or a counted skip.
    let p = spliced_pipeline(
        dir.path(),
        "empty_first",
        &rewrite("for c in ['completion_ids', 'logprobs', 'entropies']:\n    t[1][c] = []\nt[1]['text'] = ''"),
    );
    let text = failure_text(&run_pipeline(&store, &p, &[]));
    assert!(text.contains("row 1 (prompt tg-") && text.contains("empty completion"), "{text}");
    let out = run_pipeline(&store, &p, &["segment.on_empty=skip"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record(&store, &s, "segment")["counters"]["empty_completions_skipped"].as_i64(), Some(1));
    assert_eq!(scores(&store, &s).len(), 5);

    // A NaN logprob / entropy: an error naming the row and the token.
    let p = spliced_pipeline(dir.path(), "nan_logprob", &rewrite("t[2]['logprobs'][0] = math.nan"));
    let text = failure_text(&run_pipeline(&store, &p, &[]));
    assert!(text.contains("row 2 (prompt tg-") && text.contains("logprob of token 0 is NaN"), "{text}");
    let p = spliced_pipeline(dir.path(), "nan_entropy", &rewrite("t[0]['entropies'][-1] = math.nan"));
    let text = failure_text(&run_pipeline(&store, &p, &[]));
    assert!(text.contains("row 0 (prompt tg-") && text.contains("entropy of token"), "{text}");
    // A cot_end past the completion or negative: an error naming the row (0, an empty chain of
    // thought, is valid: tests/thinking.rs).
    let p = spliced_pipeline(dir.path(), "cot_end_past", &rewrite("t[3]['cot_end'] = len(t[3]['completion_ids']) + 1"));
    let text = failure_text(&run_pipeline(&store, &p, &[]));
    assert!(text.contains("row 3 (prompt tg-") && text.contains("is outside the completion's 0..="), "{text}");
    let p = spliced_pipeline(dir.path(), "cot_end_negative", &rewrite("t[1]['cot_end'] = -1"));
    let text = failure_text(&run_pipeline(&store, &p, &[]));
    assert!(text.contains("row 1 (prompt tg-") && text.contains("cot_end -1 is outside"), "{text}");

    // A policy with a short context: rollouts are clamped to fit (counted); trace + targets
    // overflow scoring unless a shortened window may be scored (counted).
    let short = ["sft.max_len=112", "rollout.max_new_tokens=200", "rollout.temperature=2.0"];
    let pipeline = repo().join("pipelines/incremental-rescore.toml");
    let text = failure_text(&run_pipeline(&store, &pipeline, &short));
    assert!(text.contains("exceed the policy's context of 112"), "{text}");
    let s = {
        let sets: Vec<&str> = short.iter().copied().chain(["score.on_too_long=truncate"]).collect();
        let out = run_pipeline(&store, &pipeline, &sets);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    assert!(record(&store, &s, "rollout")["counters"]["rows_max_new_tokens_clamped"].as_i64().unwrap() > 0);
    let score = record(&store, &s, "score");
    assert!(score["counters"]["traces_truncated"].as_i64().unwrap() > 0, "{score}");
    assert!(score["counters"]["solution_targets_truncated"].as_i64().is_some());
    assert!(scores(&store, &s).iter().all(|r| (r.sigma.iter().sum::<f64>() - 1.0).abs() < 1e-9));
}
