//! Every pipeline shipped in `pipelines/` plans (stage kinds found, params typed, inputs wired, no
//! cycle) and its dry run lists what a cold store would compute, through the engine binary.

mod common;

use common::Project;

fn dry_run(p: &Project, file: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines").join(file);
    let out = p.run(&["pipeline", "run", path.to_str().unwrap(), "--dry-run", "--json"]);
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
            assert!(stages.contains(&format!("{m}.{s}[19]")), "{m}.{s}[19] missing: {stages:?}");
        }
    }
    for s in ["segment", "score"] {
        assert!(stages.contains(&format!("rredcot.{s}[0]")));
        assert!(!stages.contains(&format!("grpo.{s}[0]")), "GRPO does not score");
    }
    assert!(stages.contains(&"eval_base".to_string()));
}
