//! Every pipeline shipped in `pipelines/` plans (stage kinds found, params typed, inputs wired, no
//! cycle) and its dry run lists what a cold store would compute, through the engine binary.

mod common;

use common::Project;

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

/// `--set TARGET.inputs.NAME=file:EXISTING` for every input of a pipeline that points at a file
/// under `../models/` or `../data/paper/` (not shipped): datasets to the GSM8K fixture, models to
/// a directory of the repo (planning hashes inputs, it does not load them).
fn user_files(pipeline: &std::path::Path) -> Vec<String> {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc: toml::Table = toml::from_str(&std::fs::read_to_string(pipeline).unwrap()).unwrap();
    let mut uses: Vec<(String, toml::Table)> = Vec::new();
    for st in doc.get("stage").and_then(|v| v.as_array()).into_iter().flatten() {
        uses.push((st["name"].as_str().unwrap().to_string(), st.get("inputs").and_then(|i| i.as_table()).cloned().unwrap_or_default()));
    }
    for ch in doc.get("chain").and_then(|v| v.as_array()).into_iter().flatten() {
        for st in ch["stage"].as_array().unwrap() {
            let target = format!("{}.{}", ch["name"].as_str().unwrap(), st["name"].as_str().unwrap());
            uses.push((target, st.get("inputs").and_then(|i| i.as_table()).cloned().unwrap_or_default()));
        }
    }
    let mut sets = Vec::new();
    for (target, inputs) in uses {
        for (name, v) in inputs {
            let v = v.as_str().unwrap_or("");
            let to = if v.starts_with("file:../data/paper/") {
                repo.join("data/gsm8k-mgs/gsm8k-mgs-eng.jsonl")
            } else if v.starts_with("file:../models/") {
                repo.join("data/layouts")
            } else {
                continue;
            };
            sets.push(format!("{target}.inputs.{name}=file:{}", to.display()));
        }
    }
    sets
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
            assert!(stages.contains(&format!("{m}.{s}[19]")), "{m}.{s}[19] missing: {stages:?}");
        }
    }
    for s in ["segment", "score"] {
        assert!(stages.contains(&format!("rredcot.{s}[0]")));
        assert!(!stages.contains(&format!("grpo.{s}[0]")), "GRPO does not score");
    }
    assert!(stages.contains(&"eval_base".to_string()));
}
