//! Unrolled GRPO and RREDCoT training through the real worker binary on a tiny default world:
//! a run killed between steps and mid-step resumes to the same checkpoint hashes as an
//! uninterrupted run; the trained checkpoint gives transformers' logits; a non-finite loss stops
//! the step with a clear error and caches nothing; an off-policy policy input and an empty batch
//! are refused.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Both training chains, 3 steps each, on a tiny SFT policy.
fn pipeline(dir: &Path) -> PathBuf {
    let body = format!(
        r#"stage_dirs = [{stages:?}]
[[stage]]
name = "taskgen"
params = {{ seed = 3, n_train = 600, n_eval = 20, min_steps = 1, max_steps = 1, max_value = 20, max_operand = 5, distractors = 0 }}
[[stage]]
name = "tokenizer"
uses = "tokenizer_train"
inputs = {{ corpus = "taskgen.train" }}
[[stage]]
name = "sft"
uses = "bootstrap_sft"
inputs = {{ train = "taskgen.train", eval = "taskgen.eval", tokenizer = "tokenizer.tokenizer" }}
params = {{ steps = 150, batch_size = 16, lr = 0.005, layers = 2, hidden = 64, heads = 2, kv_heads = 1, intermediate = 128, eval_n = 4, eval_max_new_tokens = 16 }}

[[chain]]
name = "grpo"
repeat = 3
carry = {{ "rollout.policy" = "update.policy", "update.policy" = "update.policy", "update.optimizer" = "update.optimizer" }}
  [[chain.stage]]
  name = "rollout"
  inputs = {{ prompts = "taskgen.train", policy = "sft.model" }}
  params = {{ seed = "{{step}}", batch_index = "{{step}}", limit = 4, group_size = 8, max_new_tokens = 40 }}
  [[chain.stage]]
  name = "update"
  inputs = {{ prompts = "taskgen.train", rollouts = "rollout.rollouts", policy = "sft.model", optimizer = "sft.model", reference = "sft.model" }}
  params = {{ step = "{{step}}", total_steps = "{{repeat}}", lr = 1e-3, beta = 0.05, micro_batch_size = 5, importance_sampling = "sequence" }}

[[chain]]
name = "rredcot"
repeat = 3
carry = {{ "rollout.policy" = "update.policy", "segment.tokenizer" = "update.policy", "score.policy" = "update.policy", "update.policy" = "update.policy", "update.optimizer" = "update.optimizer" }}
  [[chain.stage]]
  name = "rollout"
  inputs = {{ prompts = "taskgen.train", policy = "sft.model" }}
  params = {{ seed = "{{step}}", batch_index = "{{step}}", limit = 4, group_size = 8, max_new_tokens = 40 }}
  [[chain.stage]]
  name = "segment"
  inputs = {{ rollouts = "rollout.rollouts", tokenizer = "sft.model" }}
  [[chain.stage]]
  name = "score"
  uses = "score_sigma"
  inputs = {{ prompts = "taskgen.train", rollouts = "rollout.rollouts", segments = "segment.segments", policy = "sft.model" }}
  [[chain.stage]]
  name = "update"
  uses = "update_rredcot"
  inputs = {{ prompts = "taskgen.train", rollouts = "rollout.rollouts", scores = "score.scores", segments = "segment.segments", policy = "sft.model", optimizer = "sft.model", reference = "sft.model" }}
  params = {{ step = "{{step}}", total_steps = "{{repeat}}", lr = 1e-3, inner_epochs = 2, minibatch_size = 16, loss_type = "dapo" }}
"#,
        stages = repo().join("stages").display().to_string()
    );
    let p = dir.join("train.toml");
    std::fs::write(&p, body).unwrap();
    p
}

fn worker(store: &Path, p: &Path, sets: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot-worker"));
    c.arg("--store").arg(store).args(["pipeline", "run"]).arg(p).arg("--json");
    for s in sets {
        c.args(["--set", s]);
    }
    c
}

fn run_ok(store: &Path, p: &Path, sets: &[&str]) -> Value {
    run_ok_with(worker(store, p, sets))
}

fn run_ok_with(mut c: Command) -> Value {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn record(store: &Path, summary: &Value, stage: &str) -> Value {
    let key = summary["keys"][stage].as_str().unwrap_or_else(|| panic!("no key for {stage}"));
    serde_json::from_slice(&std::fs::read(store.join("instances").join(key).join("run.json")).unwrap()).unwrap()
}

fn final_hashes(store: &Path, s: &Value) -> Vec<Value> {
    ["grpo.update[2]", "rredcot.update[2]"]
        .iter()
        .flat_map(|st| {
            let r = record(store, s, st);
            [r["outputs"]["policy"]["hash"].clone(), r["outputs"]["optimizer"]["hash"].clone()]
        })
        .collect()
}

/// Starts the run and SIGKILLs the engine when a progress line containing `marker` appears
/// (after `delay_ms`); its stage processes die with it.
fn run_and_kill_at(store: &Path, p: &Path, marker: &str, delay_ms: u64) {
    let mut child = worker(store, p, &[]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    for line in err.lines() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.contains(marker) {
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            child.kill().unwrap();
            child.wait().unwrap();
            return;
        }
    }
    let _ = child.wait();
    panic!("marker `{marker}` never appeared:\n{}", seen.join("\n"));
}

#[test]
fn killed_runs_resume_to_the_uninterrupted_checkpoints_and_load_in_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path());
    let a = dir.path().join("a");
    // A process per stage here; the killed and resumed runs below reuse warm stage processes, and
    // must end at the same checkpoints.
    let mut fresh = worker(&a, &p, &[]);
    fresh.arg("--fresh-processes");
    let full = run_ok_with(fresh);
    for chain in ["grpo", "rredcot"] {
        for step in 0..3 {
            let rec = record(&a, &full, &format!("{chain}.update[{step}]"));
            assert!(rec["metrics"]["loss"].as_f64().unwrap().is_finite(), "{rec}");
            assert!(rec["counters"]["groups_all_rewards_equal"].as_i64().is_some());
            let roll = record(&a, &full, &format!("{chain}.rollout[{step}]"));
            let policy = if step == 0 { record(&a, &full, "sft") } else { record(&a, &full, &format!("{chain}.update[{}]", step - 1)) };
            let want = if step == 0 { &policy["outputs"]["model"]["hash"] } else { &policy["outputs"]["policy"]["hash"] };
            assert_eq!(&roll["inputs"]["policy"]["hash"], want, "{chain} step {step} samples from the previous step's policy");
        }
    }
    let r = record(&a, &full, "rredcot.update[1]");
    assert_eq!(r["counters"]["optimizer_steps"].as_i64(), Some(4), "2 inner epochs x 2 minibatches of 16");
    assert!(record(&a, &full, "grpo.update[0]")["metrics"]["kl"].as_f64().is_some());
    let want = final_hashes(&a, &full);

    // Some groups had mixed rewards, so the updates really moved the policy.
    let moved: i64 = (0..3)
        .map(|s| {
            let r = record(&a, &full, &format!("rredcot.update[{s}]"));
            r["counters"]["groups"].as_i64().unwrap() - r["counters"]["groups_all_rewards_equal"].as_i64().unwrap()
        })
        .sum();
    assert!(moved > 0, "every group had equal rewards: the test would not exercise training");

    // Activation checkpointing (layers recomputed, LM head in pieces) trains the same first step.
    let mut c = worker(&a, &p, &["grpo.update.gradient_checkpointing=true", "rredcot.update.gradient_checkpointing=true"]);
    let out = c.args(["--until", "grpo.update[0]", "--until", "rredcot.update[0]"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ckpt: Value = serde_json::from_slice(&out.stdout).unwrap();
    for stage in ["grpo.update[0]", "rredcot.update[0]"] {
        let (plain, with) = (record(&a, &full, stage), record(&a, &ckpt, stage));
        assert_ne!(plain["key"], with["key"], "{stage}: the checkpointed step ran");
        for m in ["loss", "grad_norm"] {
            let (x, y) = (plain["metrics"][m].as_f64().unwrap(), with["metrics"][m].as_f64().unwrap());
            assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{stage} {m}: {x} plain vs {y} checkpointed");
        }
    }

    // Killed between steps, then mid-step (rollout and segments of step 1 done, σ not), resumed.
    let b = dir.path().join("b");
    run_and_kill_at(&b, &p, "done     rredcot.update[0]", 0);
    run_and_kill_at(&b, &p, "run      rredcot.score[1]", 0);
    let resumed = run_ok(&b, &p, &[]);
    assert!(!resumed["cached"].as_array().unwrap().is_empty(), "finished steps are kept");
    assert_eq!(final_hashes(&b, &resumed), want, "resumed run (warm processes) differs from the uninterrupted one (a process per stage)");

    // The trained checkpoint loads in transformers with the same logits.
    let ckpt = b.join("instances").join(resumed["keys"]["rredcot.update[2]"].as_str().unwrap()).join("outputs/policy");
    let m = rredcot_ml::model::load(&ckpt, &Default::default()).unwrap();
    let ids: Vec<i64> = (1..40).collect();
    let ours = m.model.forward(&tch::Tensor::from_slice(&ids).view([1, -1]), None, None).unwrap();
    let ours: Vec<f32> = Vec::try_from(ours.flatten(0, -1)).unwrap();
    let py = std::env::var("RREDCOT_VENV").map(|v| format!("{v}/bin/python")).unwrap_or_else(|_| "python3".into());
    let out = Command::new(py)
        .args([
            "-c",
            "import sys, json, torch\nfrom transformers import AutoModelForCausalLM\n\
             m = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()\n\
             ids = torch.tensor([list(range(1, 40))])\n\
             print(json.dumps(m(ids).logits.flatten().tolist()))",
        ])
        .arg(&ckpt)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs: Vec<f32> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ours.len(), theirs.len());
    let diff = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff <= 1e-4, "trained checkpoint: max |Δlogit| vs transformers = {diff}");
}

fn failure(out: Output) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "expected a failure:\n{text}");
    text
}

#[test]
fn non_finite_loss_and_off_policy_inputs_stop_the_step_and_cache_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path());
    let store = dir.path().join("s");
    // An absurd learning rate: the second optimizer step of the first update sees a non-finite loss.
    let text = failure(worker(&store, &p, &["grpo.update.lr=1e30", "grpo.update.inner_epochs=2", "grpo.repeat=1"]).output().unwrap());
    assert!(
        text.contains("update step 0: loss is") || text.contains("update step 0: gradient of"),
        "{text}"
    );
    assert!(text.contains("optimizer step 1"), "{text}");
    let committed = std::fs::read_dir(store.join("instances"))
        .unwrap()
        .filter(|e| {
            let run = e.as_ref().unwrap().path().join("run.json");
            run.exists() && std::fs::read_to_string(run).unwrap().contains("\"stage\": \"grpo.update[0]\"")
        })
        .count();
    assert_eq!(committed, 0, "a failed update must not be cached");

    // Rollouts sampled from one policy, the update handed another: refused by hash.
    let body = std::fs::read_to_string(&p).unwrap().replace(
        "rollouts = \"rollout.rollouts\", policy = \"sft.model\", optimizer",
        "rollouts = \"rollout.rollouts\", policy = \"sft2.model\", optimizer",
    ) + "[[stage]]\nname = \"sft2\"\nuses = \"bootstrap_sft\"\ninputs = { train = \"taskgen.train\", eval = \"taskgen.eval\", tokenizer = \"tokenizer.tokenizer\" }\n\
         params = { seed = 9, steps = 5, batch_size = 8, layers = 2, hidden = 64, heads = 2, kv_heads = 1, intermediate = 128, eval_n = 1, eval_max_new_tokens = 4 }\n";
    let q = dir.path().join("offpolicy.toml");
    std::fs::write(&q, body).unwrap();
    let text = failure(worker(&store, &q, &["grpo.repeat=1", "rredcot.repeat=1"]).output().unwrap());
    assert!(text.contains("was sampled from checkpoint") && text.contains("allow_off_policy"), "{text}");

    // σ credit under sequence-level importance sampling (GSPO) would change nothing: refused.
    let text = failure(worker(&store, &p, &["grpo.repeat=1", "rredcot.repeat=1", "rredcot.update.importance_sampling=sequence"]).output().unwrap());
    assert!(text.contains("rredcot.update[0]") && text.contains("sigma credit has no effect under sequence-level importance sampling"), "{text}");

    // An empty batch (e.g. every prompt of the step skipped): a clear error naming the file.
    let empty = dir.path().join("empty-rollouts.parquet");
    rredcot::artifact::write_rows(&empty, rredcot::artifact::Schema::Rollouts, &Vec::<rredcot::artifact::rows::RolloutRow>::new()).unwrap();
    let rewire = format!("grpo.update.inputs.rollouts=file:{}", empty.display());
    let text = failure(worker(&store, &p, &["grpo.repeat=1", "rredcot.repeat=1", &rewire]).output().unwrap());
    assert!(text.contains("no rollouts to train on") && text.contains("empty-rollouts.parquet"), "{text}");
}
