//! Continuous batching through the real worker (issue 17): `rollout` with
//! `continuous_batching = true` (5 slots refilled as rows finish, 24 rows of ragged length)
//! gives every row the tokens, finish reason and, within 1e-4, the log-probabilities of the
//! static batches.

mod common;

use std::path::Path;
use std::process::Command;

use rredcot::artifact::rows::RolloutRow;
use rredcot::artifact::{read_rows, Schema};
use serde_json::Value;

fn rollout(store: &Path, continuous: bool) -> Vec<RolloutRow> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store").arg(store).args(["pipeline", "run"]).arg(common::repo().join("pipelines/incremental-rescore.toml"));
    c.args(["--until", "rollout", "--json"]);
    let sets = ["rollout.limit=6", "rollout.group_size=4", "rollout.max_new_tokens=48", "rollout.batch_size=5"];
    for s in common::TINY_WORLD.iter().chain(&sets) {
        c.args(["--set", s]);
    }
    c.args(["--set", &format!("rollout.continuous_batching={continuous}")]);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    read_rows(&common::output(store, &summary, "rollout", "rollouts"), Schema::Rollouts).unwrap()
}

#[test]
fn continuous_batching_rollouts_equal_the_static_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (fixed, refilled) = (rollout(dir.path(), false), rollout(dir.path(), true));
    assert_eq!(fixed.len(), 24);
    let lens: Vec<usize> = fixed.iter().map(|r| r.completion_ids.len()).collect();
    assert!(lens.iter().min() < lens.iter().max(), "rows should finish at different steps: {lens:?}");
    for (a, b) in fixed.iter().zip(&refilled) {
        let at = format!("prompt {} sample {}", a.prompt_id, a.sample_idx);
        assert_eq!((&a.completion_ids, &a.finish_reason, &a.text), (&b.completion_ids, &b.finish_reason, &b.text), "{at}");
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "{at}: logprob {x} vs {y}");
        }
    }
}
