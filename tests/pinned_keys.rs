//! Cache keys and artifact hashes pinned against a refactor (issue 21: "outputs unchanged, so
//! users' caches stay valid").
//!
//! 1. Every instance of every shipped pipeline gets a *structural key*: its real cache key, with
//!    each upstream artifact's hash replaced by a stand-in derived from the upstream's own
//!    structural key. It changes exactly when what enters a key changes anywhere upstream (stage
//!    kind, code version, builtin name, resolved params with their defaults, declared outputs,
//!    wiring, shipped input files), and needs nothing to run.
//! 2. The light pipelines (engine demo, world demo) and the quickstart's first stages (those
//!    without libtorch) run for real, and their instances' keys and output hashes are pinned too.
//!
//! The pins live in `tests/pinned/`. After a deliberate change of outputs, regenerate them with
//! `RREDCOT_REPIN=1 cargo test --test pinned_keys` and say in the commit which keys moved and why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rredcot::engine::hash::sha256_hex;
use rredcot::engine::plan::load_plan;
use rredcot::engine::record::{OutputRecord, RunRecord};
use rredcot::engine::resolve::Resolver;
use rredcot::engine::SetArg;
use rredcot::stages::CATALOG;
use serde_json::Map;

mod common;
use common::{user_files, Project};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

type Pins = BTreeMap<String, BTreeMap<String, String>>;

/// Compare with `tests/pinned/NAME`, or rewrite it under `RREDCOT_REPIN=1`.
fn check_pins(name: &str, now: &Pins) {
    let path = repo().join("tests/pinned").join(name);
    if std::env::var_os("RREDCOT_REPIN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_string_pretty(now).unwrap() + "\n").unwrap();
        return;
    }
    let pinned: Pins = serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap();
    let mut moved = Vec::new();
    for pipeline in pinned.keys().chain(now.keys()).collect::<std::collections::BTreeSet<_>>() {
        let (a, b) = (pinned.get(pipeline).cloned().unwrap_or_default(), now.get(pipeline).cloned().unwrap_or_default());
        for inst in a.keys().chain(b.keys()).collect::<std::collections::BTreeSet<_>>() {
            if a.get(inst) != b.get(inst) {
                moved.push(format!("{pipeline}: {inst}: pinned {:?}, now {:?}", a.get(inst), b.get(inst)));
            }
        }
    }
    assert!(
        moved.is_empty(),
        "{} pinned entries moved ({}); users' caches would go stale. If deliberate, rerun with RREDCOT_REPIN=1 and say why in the commit:\n{}",
        moved.len(),
        path.display(),
        moved.join("\n")
    );
}

/// The structural key of every instance of a pipeline (see the module doc), one pin per stage.
fn structural_keys(pipeline: &Path) -> BTreeMap<String, String> {
    let sets: Vec<SetArg> = user_files(pipeline).iter().map(|s| SetArg::parse(s).unwrap()).collect();
    let plan = load_plan(pipeline, &sets, &CATALOG).unwrap_or_else(|e| panic!("{}: {e}", pipeline.display()));
    let mut resolver = Resolver::new(&plan, rredcot::engine::file_hashes::FileHashes::none());
    let mut done: Vec<Option<Arc<RunRecord>>> = vec![None; plan.nodes.len()];
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for &i in &plan.order {
        let spec = resolver.spec(i, &done).unwrap_or_else(|e| panic!("{}: {}: {e}", pipeline.display(), plan.nodes[i].name));
        let outputs = spec
            .outputs
            .iter()
            .map(|(n, schema)| (n.clone(), OutputRecord { schema: schema.clone(), hash: sha256_hex(format!("{}/{n}", spec.key).as_bytes()), files: vec![] }))
            .collect();
        done[i] = Some(Arc::new(RunRecord {
            key: spec.key.clone(),
            stage: spec.instance.clone(),
            kind: spec.kind.clone(),
            pipeline: spec.pipeline.clone(),
            code_version: spec.code_version.clone(),
            inputs: spec.inputs.clone(),
            inputs_verified: true,
            params: spec.params.clone(),
            outputs,
            start: String::new(),
            end: String::new(),
            wall_s: 0.0,
            peak_rss_mb: 0.0,
            host: String::new(),
            git_rev: None,
            versions: BTreeMap::new(),
            counters: BTreeMap::new(),
            metrics: Map::new(),
        }));
        keys.entry(plan.nodes[i].base.clone()).or_default().push(format!("{} {}", spec.instance, spec.key));
    }
    // One pin per stage of the file: a chain's steps share one (digest of all their keys).
    keys.into_iter()
        .map(|(base, mut insts)| {
            insts.sort();
            let pin = if insts.len() == 1 { insts[0].split_once(' ').unwrap().1.to_string() } else { sha256_hex(insts.join("\n").as_bytes()) };
            (base, pin[..16].to_string())
        })
        .collect()
}

#[test]
fn every_shipped_pipeline_keeps_its_structural_keys() {
    let mut now = Pins::new();
    for e in std::fs::read_dir(repo().join("pipelines")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            now.insert(path.file_stem().unwrap().to_string_lossy().to_string(), structural_keys(&path));
        }
    }
    assert!(now.len() >= 10 && now["quickstart"].len() > 10, "{:?}", now.keys());
    check_pins("structural_keys.json", &now);
}

/// The structural key sees a param change two stages downstream, and only there and below.
#[test]
fn a_param_change_moves_the_structural_keys_downstream_only() {
    let p = Project::new();
    let base = p.pipeline("demo", common::DEMO);
    let changed = p.pipeline("demo2", &common::DEMO.replace("factor = 2.0", "factor = 2.5"));
    let (a, b) = (structural_keys(&base), structural_keys(&changed));
    let moved: Vec<&String> = a.keys().filter(|k| a[*k] != b[*k]).collect();
    assert_eq!(moved, ["double", "final", "sum_double", "train.step"]);
}

/// Key and output hashes of every instance of a pipeline run for real.
fn run_hashes(p: &Project, pipeline: &Path, args: &[&str]) -> BTreeMap<String, String> {
    let summary = p.run_ok(pipeline, args);
    let mut out = BTreeMap::new();
    for (inst, key) in summary["keys"].as_object().unwrap() {
        let rec = p.record(key.as_str().unwrap());
        out.insert(inst.clone(), key.as_str().unwrap()[..16].to_string());
        for (name, o) in rec["outputs"].as_object().unwrap() {
            out.insert(format!("{inst}.{name}"), o["hash"].as_str().unwrap()[..16].to_string());
        }
    }
    out
}

#[test]
fn the_light_pipelines_keep_their_keys_and_output_hashes() {
    let p = Project::new();
    let mut now = Pins::new();
    // The quickstart's first steps: its stages that do not need libtorch (the SFT and what
    // follows need the worker; their float outputs differ across CPU kernels, see README).
    let quickstart: &[&str] = &["--until", "tokenizer", "--until", "filter_gsm8k"];
    for (name, args) in [("engine-demo", &[][..]), ("world-demo", &[]), ("quickstart", quickstart)] {
        now.insert(name.to_string(), run_hashes(&p, &repo().join("pipelines").join(format!("{name}.toml")), args));
    }
    assert!(now["world-demo"].keys().any(|k| k.starts_with("tokenizer.")), "{now:?}");
    assert!(now["quickstart"].contains_key("filter_gsm8k.prompts") && !now["quickstart"].contains_key("sft"), "{now:?}");
    check_pins("light_outputs.json", &now);
}

/// The test can fail: a pin that does not match is reported with the instance that moved.
#[test]
#[should_panic(expected = "moved")]
fn a_moved_pin_is_reported() {
    if std::env::var_os("RREDCOT_REPIN").is_some() {
        panic!("moved (not checked while repinning)");
    }
    let mut now: Pins = serde_json::from_slice(&std::fs::read(repo().join("tests/pinned/light_outputs.json")).unwrap()).unwrap();
    now.get_mut("engine-demo").unwrap().insert("numbers".into(), "0000000000000000".into());
    check_pins("light_outputs.json", &now);
}
