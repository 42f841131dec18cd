//! `bootstrap_sft` through the real worker binary (it carries the engine CLI and every builtin):
//! a short configuration learns more than chance, the run record holds the accuracy, the output is
//! a Hugging Face checkpoint, and two fresh stores give the same checkpoint hash (one filled by
//! the engine binary, which hands the SFT to the worker).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn pipeline(dir: &Path, taskgen: &str, sft: &str) -> PathBuf {
    let p = dir.join("p.toml");
    let body = format!(
        "stage_dirs = [{stages:?}]\n\
         [[stage]]\nname = \"taskgen\"\nuses = \"taskgen\"\nparams = {{ {taskgen} }}\n\
         [[stage]]\nname = \"tokenizer\"\nuses = \"tokenizer_train\"\ninputs = {{ corpus = \"taskgen.train\" }}\n\
         [[stage]]\nname = \"sft\"\nuses = \"bootstrap_sft\"\n\
         inputs = {{ train = \"taskgen.train\", eval = \"taskgen.eval\", tokenizer = \"tokenizer.tokenizer\" }}\n\
         params = {{ {sft} }}\n",
        stages = repo().join("stages").display().to_string()
    );
    std::fs::write(&p, body).unwrap();
    p
}

/// Runs the pipeline into `store` through the worker binary.
fn run_output(store: &Path, p: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rredcot-worker"))
        .arg("--store")
        .arg(store)
        .args(["pipeline", "run"])
        .arg(p)
        .output()
        .unwrap()
}

/// Runs the pipeline into `store`, which must succeed; returns the sft run record.
fn run(store: &Path, p: &Path) -> serde_json::Value {
    let out = run_output(store, p);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    records(store).remove("sft").expect("sft run record")
}

fn records(store: &Path) -> BTreeMap<String, serde_json::Value> {
    std::fs::read_dir(store.join("instances"))
        .unwrap()
        .map(|e| {
            let rec: serde_json::Value =
                serde_json::from_slice(&std::fs::read(e.unwrap().path().join("run.json")).unwrap()).unwrap();
            (rec["stage"].as_str().unwrap().to_string(), rec)
        })
        .collect()
}

/// Share of eval problems whose answer is the most common training answer: what a model that
/// learned only the answer distribution would score.
fn majority_baseline(store: &Path) -> f64 {
    use rredcot::artifact::rows::PromptRow;
    use rredcot::artifact::{read_rows, Schema};
    let recs = records(store);
    let tg = &recs["taskgen"];
    let path = |name: &str| store.join("instances").join(tg["key"].as_str().unwrap()).join("outputs").join(format!("{name}.parquet"));
    let train: Vec<PromptRow> = read_rows(&path("train"), Schema::Prompts).unwrap();
    let eval: Vec<PromptRow> = read_rows(&path("eval"), Schema::Prompts).unwrap();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in &train {
        *counts.entry(r.answer.clone().unwrap()).or_default() += 1;
    }
    let top = counts.into_iter().max_by_key(|(_, n)| *n).unwrap().0;
    let eval = &eval[..100.min(eval.len())];
    eval.iter().filter(|r| r.answer.as_deref() == Some(top.as_str())).count() as f64 / eval.len() as f64
}

#[test]
fn short_sft_beats_chance_and_writes_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let p = pipeline(
        dir.path(),
        "seed = 1, n_train = 1500, n_eval = 100, min_steps = 1, max_steps = 2, max_value = 60, max_operand = 9, distractors = 0",
        "steps = 300, batch_size = 16, layers = 3, hidden = 192, heads = 4, kv_heads = 2, intermediate = 384, eval_n = 100",
    );
    let rec = run(&store, &p);
    let acc = rec["metrics"]["eval_accuracy"].as_f64().expect("eval_accuracy in the run record");
    let chance = majority_baseline(&store);
    eprintln!("short bootstrap SFT: greedy accuracy {acc:.3}, majority-answer baseline {chance:.3}");
    assert!(acc > chance && acc >= 0.05, "accuracy {acc} is not above chance {chance}");
    assert!(rec["counters"]["tokens_trained"].as_i64().unwrap() > 0);
    let loss = rec["metrics"]["loss_log"].as_array().unwrap();
    let first = loss.first().unwrap()[1].as_f64().unwrap();
    let last = rec["metrics"]["final_loss"].as_f64().unwrap();
    assert!(last < first / 3.0, "loss {first} -> {last}");
    let ckpt = store.join("instances").join(rec["key"].as_str().unwrap()).join("outputs/model");
    for f in ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"] {
        assert!(ckpt.join(f).is_file(), "{f} missing in {}", ckpt.display());
    }
    // The checkpoint loads back through the model core.
    let m = rredcot_ml::model::load(&ckpt, &Default::default()).unwrap();
    assert_eq!(m.model.cfg.num_hidden_layers, 3);
}

#[test]
fn same_inputs_params_and_seed_give_the_same_checkpoint_hash() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(
        dir.path(),
        "seed = 2, n_train = 200, n_eval = 20, max_steps = 2",
        "steps = 15, batch_size = 8, layers = 2, hidden = 64, heads = 2, kv_heads = 1, intermediate = 128, eval_n = 5, eval_max_new_tokens = 16",
    );
    let a = run(&dir.path().join("a"), &p);
    // The second store is filled by the engine binary, which hands the SFT to the worker.
    let engine = engine_binary();
    let out = Command::new(&engine).arg("--store").arg(dir.path().join("b")).args(["pipeline", "run"]).arg(&p).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let b = records(&dir.path().join("b")).remove("sft").expect("sft run record");
    assert_eq!(a["key"], b["key"]);
    assert_eq!(a["outputs"]["model"]["hash"], b["outputs"]["model"]["hash"]);
    assert!(a["outputs"]["model"]["hash"].as_str().is_some());
    // The record names the CPU kernels the numbers came from (other kernels, other hashes).
    let kernels = rredcot_ml::aten_kernels::cpu_capability().expect("ATen's kernel set");
    assert_eq!(b["versions"]["aten_cpu_capability"].as_str(), Some(kernels.as_str()), "{}", b["versions"]);
    // Without the worker next to it, the engine binary says so, naming the stage and the fix.
    let alone = dir.path().join("alone");
    std::fs::create_dir(&alone).unwrap();
    std::fs::copy(&engine, alone.join("rredcot")).unwrap();
    let out = Command::new(alone.join("rredcot")).arg("--store").arg(dir.path().join("c")).args(["pipeline", "run"]).arg(&p).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("sft") && text.contains("runs in the worker `rredcot-worker`") && text.contains("cargo build --workspace --bins"), "{text}");
}

/// The engine binary `rredcot`, built next to the worker by `cargo build --workspace --bins`.
fn engine_binary() -> PathBuf {
    let e = Path::new(env!("CARGO_BIN_EXE_rredcot-worker")).with_file_name("rredcot");
    assert!(e.is_file(), "{} missing: build it first with cargo build --workspace --bins (make test does)", e.display());
    e
}

#[test]
fn every_problem_over_max_len_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path(), "n_train = 50, n_eval = 5", "steps = 1, max_len = 8");
    let out = run_output(&dir.path().join("s"), &p);
    assert!(!out.status.success());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("longer than max_len = 8"), "{text}");
}

#[test]
fn an_imperfect_teacher_skips_the_last_step_of_a_fixed_share_of_demonstrations() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = "steps = 5, batch_size = 8, layers = 2, hidden = 64, heads = 2, kv_heads = 1, intermediate = 128, eval_n = 5, eval_max_new_tokens = 16";
    let taskgen = "seed = 4, n_train = 400, n_eval = 20, min_steps = 2, max_steps = 3";
    let clean = run(
        &dir.path().join("clean"),
        &pipeline(dir.path(), taskgen, tiny),
    );
    assert_eq!(clean["counters"]["teacher_skipped_last_step"], 0);
    let rec = run(
        &dir.path().join("half"),
        &pipeline(
            dir.path(),
            taskgen,
            &format!("{tiny}, teacher_skip_rate = 0.5"),
        ),
    );
    let skipped = rec["counters"]["teacher_skipped_last_step"]
        .as_i64()
        .unwrap();
    // Binomial(400, 0.5): 5 standard deviations either side.
    assert!(
        (150..=250).contains(&skipped),
        "{skipped} of 400 demonstrations skipped"
    );
    assert_ne!(
        rec["outputs"]["model"]["hash"],
        clean["outputs"]["model"]["hash"]
    );

    // A one-step solution has no last step to skip: an error naming the file, row and problem.
    let one_step = "seed = 4, n_train = 50, n_eval = 20, min_steps = 1, max_steps = 1";
    let out = run_output(
        &dir.path().join("bad"),
        &pipeline(
            dir.path(),
            one_step,
            &format!("{tiny}, teacher_skip_rate = 1.0"),
        ),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("train.parquet row 0 (problem tg-")
            && err.contains("teacher_skip_rate needs taskgen's worked solutions"),
        "{err}"
    );
    let out = run_output(
        &dir.path().join("bad"),
        &pipeline(
            dir.path(),
            taskgen,
            &format!("{tiny}, teacher_skip_rate = 1.5"),
        ),
    );
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("teacher_skip_rate must be in [0, 1], got 1.5"));
}
