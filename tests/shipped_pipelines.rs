//! Every pipeline shipped in `pipelines/` plans (stage kinds found, params typed, inputs wired, no
//! cycle) and its dry run lists what a cold store would compute, through the engine binary.

mod common;

use common::{user_files, Project};

fn dry_run(p: &Project, file: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines").join(file);
    let mut args = vec!["pipeline".to_string(), "run".into(), path.to_str().unwrap().into(), "--dry-run".into(), "--json".into()];
    let rewired = user_files(&path);
    if !rewired.is_empty() {
        // The paper pipelines name files users bring (models, datasets): without them planning
        // stops at the first one, naming it; rewired to files that exist, they plan.
        let out = p.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("does not exist") && err.contains("file:../"), "{file}: {err}");
        for set in rewired {
            args.extend(["--set".into(), set]);
        }
    }
    let out = p.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn would_run(s: &serde_json::Value) -> Vec<String> {
    s["would_run"].as_array().unwrap().iter().map(|w| w[0].as_str().unwrap().to_string()).collect()
}

#[test]
fn every_shipped_pipeline_plans() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
    let p = Project::new();
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        if name.ends_with(".toml") {
            assert!(!would_run(&dry_run(&p, &name)).is_empty(), "{name} plans nothing");
            n += 1;
        }
    }
    assert!(n >= 4);
}

#[test]
fn quickstart_unrolls_both_training_chains_with_an_eval_per_step() {
    let p = Project::new();
    let stages = would_run(&dry_run(&p, "quickstart.toml"));
    for m in ["grpo", "rredcot"] {
        for s in ["rollout", "update", "eval"] {
            assert!(stages.contains(&format!("{m}.{s}[9]")), "{m}.{s}[9] missing: {stages:?}");
            // 10 steps: the 15-minute budget of issue 19 (README).
            assert!(!stages.contains(&format!("{m}.{s}[10]")), "{m}.{s}[10]: more than 10 steps");
        }
    }
    for s in ["segment", "score"] {
        assert!(stages.contains(&format!("rredcot.{s}[0]")));
        assert!(!stages.contains(&format!("grpo.{s}[0]")), "GRPO does not score");
    }
    assert!(stages.contains(&"eval_base".to_string()));
}

/// `rredcot serve --pipeline P --model STAGE[.OUTPUT]` names a stage's checkpoint; what it cannot
/// serve is said before any model loads: an unknown stage, a stage without a checkpoint output,
/// an output that is not one, and a stage that has not run.
#[test]
fn serve_by_stage_says_what_it_cannot_serve() {
    let p = Project::new();
    let quickstart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/quickstart.toml");
    let q = quickstart.to_str().unwrap();
    p.run_ok(&quickstart, &["--until", "taskgen"]);
    for (model, want) in [
        ("nosuch", "no stage `nosuch`"),
        ("taskgen", "stage `taskgen` (taskgen) has no checkpoint output to serve"),
        ("sft.nope", "stage `sft` (bootstrap_sft) has no checkpoint output `nope` (its checkpoint outputs: model)"),
        ("rredcot.update[9]", "stage `rredcot.update[9]` of"),
        ("sft", "is not up to date"),
    ] {
        let out = p.run(&["serve", "--pipeline", q, "--model", model, "--port", "0"]);
        let err = common::text(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{model}: {err}");
    }
}
