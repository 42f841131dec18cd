//! Sampling through an OpenAI-compatible engine (issue 20), end to end through the real binaries.
//!
//! - `rollout` with `backend = "http"`: the stage starts `rredcot serve` over the tiny policy,
//!   samples through `/v1/completions` and stops it; its rows equal the built-in rollout's for the
//!   same seeds (same tokens, text, rewards; logprobs within 1e-5; prefill entropies within 1e-5),
//!   with one request per row and with `group_requests` (one request of n choices per prompt);
//!   MC continuations (`score_mc`) through the engine equal the built-in ones. No engine outlives
//!   its stage.
//! - Bad engines, each a clear error naming the stage, the URL and the request, with nothing
//!   cached: unreachable, serving another model, text without token ids, fewer samples than asked,
//!   a hang (timeout), death mid-run; and a killed run leaves no engine behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rredcot::artifact::rows::RolloutRow;
use rredcot::artifact::{read_rows, Schema};
use serde_json::Value;

mod common;
use common::{instance, output, record, repo, world_front, TINY_WORLD};

fn worker() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rredcot-worker"))
}

/// `rredcot serve` over the policy, as a stage starts it.
const SERVE: &str = "{rredcot} serve --model {policy} --port {port} --model-name {policy_hash} --device cpu --threads 1 --max-new-tokens 64";

const ROLLOUT: &str = "inputs = { prompts = \"taskgen.eval\", policy = \"sft.model\" }\nparams = { seed = 3, limit = 3, group_size = 3, max_new_tokens = 40, batch_size = 4, device = \"cpu\", threads = 1";

fn pipeline(dir: &Path, stages: &str) -> PathBuf {
    let p = dir.join("engines.toml");
    std::fs::write(&p, format!("stage_dirs = [{:?}]\n{}\n{stages}", repo().join("stages").display().to_string(), world_front("", ""))).unwrap();
    p
}

fn run(store: &Path, pipeline: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(worker());
    c.arg("--store").arg(store).args(["pipeline", "run"]).arg(pipeline).arg("--json");
    for s in TINY_WORLD {
        c.args(["--set", s]);
    }
    c.args(args).output().unwrap()
}

fn run_ok(store: &Path, pipeline: &Path, args: &[&str]) -> Value {
    let out = run(store, pipeline, args);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Processes whose command line contains `needle` (the engine's model name is the policy hash).
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.chars().all(|c| c.is_ascii_digit()) || name == std::process::id().to_string() {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) && !cmd.contains("cargo") {
            found.push(format!("{name}: {cmd}"));
        }
    }
    found
}

fn rollouts(store: &Path, s: &Value, stage: &str) -> Vec<RolloutRow> {
    read_rows(&output(store, s, stage, "rollouts"), Schema::Rollouts).unwrap()
}

fn assert_same_rollouts(a: &[RolloutRow], b: &[RolloutRow], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        let at = format!("{what}: prompt {} sample {}", x.prompt_id, x.sample_idx);
        assert_eq!((&x.prompt_id, x.sample_idx, &x.completion_ids), (&y.prompt_id, y.sample_idx, &y.completion_ids), "{at}");
        assert_eq!((&x.text, x.reward, &x.finish_reason, &x.answer_extracted, x.cot_end), (&y.text, y.reward, &y.finish_reason, &y.answer_extracted, y.cot_end), "{at}");
        assert_eq!(x.policy_ckpt, y.policy_ckpt);
        for (k, (p, q)) in x.logprobs.iter().zip(&y.logprobs).enumerate() {
            assert!((p - q).abs() < 1e-5, "{at} token {k}: logprob {p} vs {q}");
        }
        for (k, (p, q)) in x.entropies.iter().zip(&y.entropies).enumerate() {
            assert!((p - q).abs() < 1e-5, "{at} token {k}: entropy {p} vs {q}");
        }
        assert_eq!((x.logprobs.len(), x.entropies.len()), (y.logprobs.len(), y.entropies.len()), "{at}");
    }
}

#[test]
fn rollouts_and_mc_continuations_through_rredcot_serve_equal_the_builtin_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let http = format!("backend = \"http\", server_command = \"{SERVE}\", concurrency = 4, timeout_s = 120.0");
    let sglang = proxied_serve(dir.path(), "sglang");
    let unseeded = proxied_serve(dir.path(), "unseeded");
    let stages = format!(
        r#"
[[stage]]
name = "local"
uses = "rollout"
{ROLLOUT} }}

[[stage]]
name = "http"
uses = "rollout"
{ROLLOUT}, {http} }}

[[stage]]
name = "local_grouped"
uses = "rollout"
{ROLLOUT}, group_requests = true }}

[[stage]]
name = "http_grouped"
uses = "rollout"
{ROLLOUT}, group_requests = true, entropies = "topk", top_logprobs = 5, {http} }}

[[stage]]
name = "sglang_grouped"
uses = "rollout"
{ROLLOUT}, group_requests = true, backend = "http", server_command = "{sglang}", concurrency = 4, timeout_s = 120.0 }}

[[stage]]
name = "unseeded"
uses = "rollout"
{ROLLOUT}, backend = "http", server_command = "{unseeded}", concurrency = 4, timeout_s = 120.0 }}

[[stage]]
name = "segment"
inputs = {{ rollouts = "local.rollouts", tokenizer = "sft.model" }}
params = {{ method = "keyword", max_segments = 4 }}

[[stage]]
name = "mc_local"
uses = "score_mc"
inputs = {{ rollouts = "local.rollouts", segments = "segment.segments", prompts = "taskgen.eval", policy = "sft.model" }}
params = {{ k = 2, max_new_tokens = 16, device = "cpu", threads = 1 }}

[[stage]]
name = "mc_http"
uses = "score_mc"
inputs = {{ rollouts = "local.rollouts", segments = "segment.segments", prompts = "taskgen.eval", policy = "sft.model" }}
params = {{ k = 2, max_new_tokens = 16, device = "cpu", threads = 1, {http} }}
"#
    );
    let p = pipeline(dir.path(), &stages);
    let s = run_ok(&store, &p, &[]);

    let local = rollouts(&store, &s, "local");
    assert_eq!(local.len(), 9);
    assert!(local.iter().any(|r| !r.completion_ids.is_empty()));
    assert_same_rollouts(&local, &rollouts(&store, &s, "http"), "one request per row");
    // Grouped seeds: sample i = sample 0's seed + i; the engine gets one request per prompt.
    let grouped = rollouts(&store, &s, "local_grouped");
    assert_ne!(grouped.iter().map(|r| &r.completion_ids).collect::<Vec<_>>(), local.iter().map(|r| &r.completion_ids).collect::<Vec<_>>());
    let http_grouped = rollouts(&store, &s, "http_grouped");
    // top-k entropies are estimates (lower bounds): compare tokens and logprobs, then the bound.
    let without_entropies = |rows: &[RolloutRow]| rows.iter().map(|r| RolloutRow { entropies: vec![], ..r.clone() }).collect::<Vec<_>>();
    assert_same_rollouts(&without_entropies(&grouped), &without_entropies(&http_grouped), "grouped requests");
    for (g, h) in grouped.iter().zip(&http_grouped) {
        assert_eq!(h.entropies.len(), g.entropies.len());
        for (exact, est) in g.entropies.iter().zip(&h.entropies) {
            assert!(*est <= exact + 1e-4 && *est >= 0.0, "top-5 estimate {est} vs exact {exact}");
        }
    }

    let rec = record(&store, &s, "http");
    let m = &rec["metrics"];
    assert_eq!((m["engine"].as_str(), m["engine_version"].as_str(), m["entropies"].as_str()), (Some("rredcot"), Some(env!("CARGO_PKG_VERSION")), Some("prefill")), "{rec}");
    assert!(m["engine_url"].as_str().unwrap().starts_with("http://127.0.0.1:"), "{rec}");
    assert!(m["engine_logprob_gap_max"].as_f64().unwrap() < 1e-5, "{rec}");
    // One probe plus one request per row; grouped: one probe plus one request per prompt.
    // The probe's two requests (one seed), then one request per row.
    assert_eq!(rec["counters"]["http_requests"].as_i64(), Some(2 + 9), "{rec}");
    assert_eq!(rec["metrics"]["engine_follows_seeds"].as_bool(), Some(true), "{rec}");
    let rec_g = record(&store, &s, "http_grouped");
    assert_eq!(rec_g["counters"]["http_requests"].as_i64(), Some(2 + 3), "{rec_g}");
    assert_eq!(rec_g["metrics"]["entropies"].as_str(), Some("topk-estimate"), "{rec_g}");
    // SGLang gives the choices of a request one seed: each row goes as a request of its own, with
    // the row's seed, and the rows are the grouped ones; its version comes from `/server_info`.
    assert_same_rollouts(&grouped, &rollouts(&store, &s, "sglang_grouped"), "grouped rows sent to SGLang one by one");
    let rec_s = record(&store, &s, "sglang_grouped");
    assert_eq!((rec_s["metrics"]["engine"].as_str(), rec_s["metrics"]["engine_version"].as_str()), (Some("sglang"), Some("0.5.23-proxy")), "{rec_s}");
    assert_eq!(rec_s["counters"]["http_requests"].as_i64(), Some(2 + 9), "{rec_s}");
    // An engine that draws its own seeds (SGLang without deterministic inference) is told apart.
    let rec_u = record(&store, &s, "unseeded");
    assert_eq!(rec_u["metrics"]["engine_follows_seeds"].as_bool(), Some(false), "{rec_u}");
    assert_eq!(rec["counters"]["tokens_generated"], record(&store, &s, "local")["counters"]["tokens_generated"]);

    // MC continuations through the engine: the same completions, so the same values.
    let (mc_l, mc_h) = (record(&store, &s, "mc_local"), record(&store, &s, "mc_http"));
    assert_eq!(mc_h["metrics"]["engine"].as_str(), Some("rredcot"), "{mc_h}");
    assert_eq!(mc_l["outputs"]["scores"]["hash"], mc_h["outputs"]["scores"]["hash"], "{mc_l}\n{mc_h}");
    assert_eq!(mc_l["outputs"]["completions"]["hash"], mc_h["outputs"]["completions"]["hash"]);

    // entropies = "none": NaN entropies, which keyword segmentation accepts and entropy-based
    // segmentation refuses, naming the row and the fix.
    let none = format!(
        r#"{stages}
[[stage]]
name = "http_none"
uses = "rollout"
{ROLLOUT}, entropies = "none", {http} }}

[[stage]]
name = "segment_none"
uses = "segment"
inputs = {{ rollouts = "http_none.rollouts", tokenizer = "sft.model" }}
params = {{ method = "keyword", max_segments = 4 }}

[[stage]]
name = "segment_hybrid"
uses = "segment"
inputs = {{ rollouts = "http_none.rollouts", tokenizer = "sft.model" }}
params = {{ method = "hybrid", max_segments = 4 }}
"#
    );
    let p_none = pipeline(dir.path(), &none);
    let out = run(&store, &p_none, &["--until", "segment_none"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let no_entropies: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rollouts(&store, &no_entropies, "http_none");
    assert!(rows.iter().all(|r| r.entropies.len() == r.completion_ids.len() && r.entropies.iter().all(|e| e.is_nan())));
    assert_eq!(record(&store, &no_entropies, "http_none")["metrics"]["entropies"].as_str(), Some("none"));
    let out = run(&store, &p_none, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("segment_hybrid") && err.contains("no entropies") && err.contains("entropies = \"prefill\""), "{err}");

    // Every engine the stages started is gone.
    let hash = s["keys"].as_object().unwrap().len(); // the run is over
    assert!(hash > 0);
    let policy = rec["inputs"]["policy"]["hash"].as_str().unwrap().to_string();
    assert!(processes_with(&format!("--model-name {policy}")).is_empty(), "{:?}", processes_with(&policy));
}

/// `reload = "sglang"`: the engine the first rollout started is kept by the (warm) stage process,
/// and the next rollout, over another checkpoint, loads that checkpoint into it through
/// `POST /update_weights_from_disk` instead of starting one. Each rollout equals the built-in one
/// over its own checkpoint: an engine that kept sampling the first checkpoint fails this.
#[test]
fn a_kept_engine_loads_the_next_stages_checkpoint_and_samples_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let http = format!(", backend = \"http\", server_command = \"{SERVE}\", concurrency = 4, timeout_s = 120.0, reload = \"sglang\"");
    let roll = |name: &str, policy: &str, extra: &str| {
        format!("[[stage]]\nname = \"{name}\"\nuses = \"rollout\"\ninputs = {{ prompts = \"taskgen.eval\", policy = \"{policy}.model\" }}\nparams = {{ seed = 3, limit = 3, group_size = 3, max_new_tokens = 40, batch_size = 4, device = \"cpu\", threads = 1{extra} }}\n")
    };
    // A second policy with the same tokenizer: the tiny world's SFT with another seed and fewer steps.
    let stages = format!(
        "[[stage]]\nname = \"sft2\"\nuses = \"bootstrap_sft\"\ninputs = {{ train = \"taskgen.train\", eval = \"taskgen.eval\", tokenizer = \"tokenizer.tokenizer\" }}\n\
         params = {{ seed = 1, steps = 20, batch_size = 8, layers = 2, hidden = 64, heads = 2, kv_heads = 1, intermediate = 128, eval_n = 4, eval_max_new_tokens = 16 }}\n{}{}{}{}",
        roll("local_a", "sft", ""),
        roll("local_b", "sft2", ""),
        roll("http_a", "sft", &http),
        roll("http_b", "sft2", &http)
    );
    let p = pipeline(dir.path(), &stages);
    // One stage at a time, so one warm process runs them all (an engine is kept per process).
    let s = run_ok(&store, &p, &["--jobs", "1"]);
    let (a, b) = (rollouts(&store, &s, "local_a"), rollouts(&store, &s, "local_b"));
    assert_ne!(a.iter().map(|r| &r.completion_ids).collect::<Vec<_>>(), b.iter().map(|r| &r.completion_ids).collect::<Vec<_>>(), "the two policies sample alike");
    assert_same_rollouts(&a, &rollouts(&store, &s, "http_a"), "first checkpoint");
    assert_same_rollouts(&b, &rollouts(&store, &s, "http_b"), "second checkpoint");
    // Exactly one of the two started the engine; the other loaded its checkpoint into it.
    let recs = [record(&store, &s, "http_a"), record(&store, &s, "http_b")];
    let reused: Vec<bool> = recs.iter().map(|r| r["metrics"]["engine_reused"].as_bool().unwrap()).collect();
    assert_eq!(reused.iter().filter(|r| **r).count(), 1, "{:?}", recs.iter().map(|r| &r["metrics"]).collect::<Vec<_>>());
    let (started, kept) = if reused[0] { (&recs[1], &recs[0]) } else { (&recs[0], &recs[1]) };
    assert!(kept["metrics"]["engine_reload_s"].as_f64().unwrap() > 0.0, "{kept}");
    assert_eq!(kept["metrics"]["engine_url"], started["metrics"]["engine_url"], "the same engine");
    assert_eq!(started["metrics"]["engine_reload_s"].as_f64(), Some(0.0), "{started}");
    // After the load, the first stage's probe came back otherwise, as the checkpoint moved it.
    assert_eq!(kept["metrics"]["engine_canary_unchanged"], Value::Bool(false), "{kept}");
    assert!(kept["metrics"]["engine_canary_core_shift"].as_f64().unwrap() > 1e-6, "{kept}");
    // The kept engine ends with the run, and so does its log (outside the stage's scratch dir).
    let first = started["inputs"]["policy"]["hash"].as_str().unwrap().to_string();
    assert!(processes_with(&format!("--model-name {first}")).is_empty(), "{:?}", processes_with(&first));
    let logs = kept_engine_files(kept, "log");
    assert!(logs.is_empty(), "{logs:?}");

    // An engine that answers success to the load and keeps sampling from other weights (as vLLM
    // 0.32's CPU build does): the model core's prefill of its samples shows it, the stage fails
    // naming the cause, nothing of it is cached and the engine is stopped.
    let fake = dir.path().join("fake.py");
    std::fs::write(&fake, FAKE).unwrap();
    let pidfile = dir.path().join("engine.pid");
    let fake_http = format!(", backend = \"http\", server_command = \"python3 {} {{port}} ok {{policy_hash}} {}\", timeout_s = 20.0, reload = \"sglang\"", fake.display(), pidfile.display());
    let p = pipeline(dir.path(), &format!("{stages}{}{}", roll("fake_a", "sft", &fake_http), roll("fake_b", "sft2", &fake_http)));
    let out = run(&store, &p, &["--jobs", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("kept from an earlier stage") && err.contains("did not take") && err.contains("reload = \"none\""), "{err}");
    let failed = if err.contains("stage `fake_a`: the engine kept") { "fake_a" } else { "fake_b" };
    assert!(err.contains(&format!("stage `{failed}`: the engine kept")), "{err}");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cached = |st: &str| instance(&store, &summary, st).join("run.json").exists();
    assert!(!cached(failed) && cached(if failed == "fake_a" { "fake_b" } else { "fake_a" }), "the stage that started the engine is cached, the one that reused it is not");
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    assert!(!Path::new(&format!("/proc/{pid}")).exists() || is_zombie(&pid), "engine {pid} outlived the failed stage");

    // A load that did not take between two close checkpoints, as consecutive training steps are:
    // `rredcot serve` behind a proxy that answers success to the load without passing it on, so
    // the kept engine samples the first checkpoint exactly, and the second is the first with its
    // logits scaled by 1.03. Far below a wrong load's 0.54 nats (a fixed limit of 0.25 let it
    // pass), far above what the engine showed when it started: the stage fails.
    let near = dir.path().join("near");
    std::fs::create_dir(&near).unwrap();
    let sft = output(&store, &s, "sft", "model");
    for e in std::fs::read_dir(&sft).unwrap().flatten() {
        std::fs::copy(e.path(), near.join(e.file_name())).unwrap();
    }
    scale_final_norm(&near.join("model.safetensors"), 1.03);
    let proxied = |mode: &str, reload: &str| {
        format!(", backend = \"http\", server_command = \"{}\", concurrency = 4, timeout_s = 120.0, reload = \"{reload}\"", proxied_serve(dir.path(), mode))
    };
    let stale_http = proxied("stale", "sglang");
    let near_roll = roll("stale_b", "sft", &stale_http).replace("policy = \"sft.model\"", &format!("policy = \"file:{}\"", near.display()));
    let p = pipeline(dir.path(), &format!("{stages}{}{near_roll}", roll("stale_a", "sft", &stale_http)));
    let out = run(&store, &p, &["--jobs", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (failed, started) = if err.contains("stage `stale_a`: the engine kept") { ("stale_a", "stale_b") } else { ("stale_b", "stale_a") };
    assert!(err.contains(&format!("stage `{failed}`: the engine kept")) && err.contains("did not take"), "{err}");
    let gap: f64 = err.split("samples with logprobs ").nth(1).and_then(|t| t.split(' ').next()).and_then(|g| g.parse().ok()).expect(&err);
    eprintln!("a stale load between checkpoints whose logits differ by 3%: mean logprob gap {gap:.2e}");
    assert!(gap > 1e-3 && gap < 0.25, "the stale load's gap {gap} is meant to lie between the floor and a wrong load's: {err}");
    let rec = record(&store, &summary, started);
    assert!(rec["metrics"]["engine_logprob_gap_mean"].as_f64().unwrap() < 1e-5, "{rec}");

    // The same stale load between checkpoints 0.02% apart, as a small training step or a bf16
    // engine's noise makes it: the logprob gap stays under the floor, but the engine answers the
    // first stage's probe after the load exactly as before while the model core says the new
    // checkpoint moves it: the stage fails.
    let nearer = dir.path().join("nearer");
    std::fs::create_dir(&nearer).unwrap();
    for e in std::fs::read_dir(&sft).unwrap().flatten() {
        std::fs::copy(e.path(), nearer.join(e.file_name())).unwrap();
    }
    scale_final_norm(&nearer.join("model.safetensors"), 1.0002);
    let nearer_roll = roll("stale_d", "sft", &stale_http).replace("policy = \"sft.model\"", &format!("policy = \"file:{}\"", nearer.display()));
    let p = pipeline(dir.path(), &format!("{stages}{}{nearer_roll}", roll("stale_c", "sft", &stale_http)));
    let out = run(&store, &p, &["--jobs", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let failed = if err.contains("stage `stale_c`: the engine kept") { "stale_c" } else { "stale_d" };
    assert!(err.contains(&format!("stage `{failed}`: the engine kept")) && err.contains("exactly as before, to the bit") && err.contains("did not take"), "{err}");
    let shift: f64 = err.split("moves those tokens' logprobs by ").nth(1).and_then(|t| t.split(' ').next()).and_then(|g| g.parse().ok()).expect(&err);
    eprintln!("a stale load between checkpoints whose logits differ by 0.02%: the probe's logprobs move by {shift:.2e} in the model core");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!instance(&store, &summary, failed).join("run.json").exists(), "the failed stage is not cached");

    // reload = "vllm": the engine is started over an untied view of the (tied) checkpoint and loads
    // the next one's view; each rollout equals the built-in one over its own checkpoint, and no
    // view is left after the run.
    let vllm_http = proxied("vllm", "vllm");
    let p = pipeline(dir.path(), &format!("{stages}{}{}", roll("vllm_a", "sft", &vllm_http), roll("vllm_b", "sft2", &vllm_http)));
    let s = run_ok(&store, &p, &["--jobs", "1"]);
    assert_same_rollouts(&a, &rollouts(&store, &s, "vllm_a"), "first checkpoint through views");
    assert_same_rollouts(&b, &rollouts(&store, &s, "vllm_b"), "second checkpoint through views");
    let recs = [record(&store, &s, "vllm_a"), record(&store, &s, "vllm_b")];
    assert_eq!(recs.iter().filter(|r| r["metrics"]["engine_reused"] == Value::Bool(true)).count(), 1);
    assert!(recs.iter().all(|r| r["metrics"]["engine_untied_view"] == Value::Bool(true)), "{:?}", recs.iter().map(|r| &r["metrics"]).collect::<Vec<_>>());
    let left = kept_engine_files(&recs[0], "views");
    assert!(left.is_empty(), "{left:?}");

    // Stages that keep no logprobs of their samples check a kept engine on its probe reply, in the
    // model core they load once the engine is kept: evals over the two checkpoints through one
    // engine equal the built-in evals.
    let eval = |name: &str, policy: &str, extra: &str| {
        format!("[[stage]]\nname = \"{name}\"\nuses = \"eval\"\ninputs = {{ policy = \"{policy}.model\", \"benchmarks.tg\" = \"taskgen.eval\" }}\nparams = {{ limit = 3, k = 2, max_new_tokens = 24, device = \"cpu\", threads = 1{extra} }}\n")
    };
    let p = pipeline(dir.path(), &format!("{stages}{}{}{}{}", eval("ev_local_a", "sft", ""), eval("ev_local_b", "sft2", ""), eval("ev_a", "sft", &http), eval("ev_b", "sft2", &http)));
    let s = run_ok(&store, &p, &["--jobs", "1"]);
    for (local, through) in [("ev_local_a", "ev_a"), ("ev_local_b", "ev_b")] {
        assert_eq!(record(&store, &s, local)["outputs"]["eval"]["hash"], record(&store, &s, through)["outputs"]["eval"]["hash"], "{through}");
    }
    let recs = [record(&store, &s, "ev_a"), record(&store, &s, "ev_b")];
    let kept: Vec<&Value> = recs.iter().filter(|r| r["metrics"]["engine_reused"] == Value::Bool(true)).collect();
    assert_eq!(kept.len(), 1, "{:?}", recs.iter().map(|r| &r["metrics"]).collect::<Vec<_>>());
    assert_eq!(kept[0]["metrics"]["engine_canary_unchanged"], Value::Bool(false), "{}", kept[0]);
    assert!(recs.iter().all(|r| r["metrics"]["engine_probe_logprob_gap_mean"].as_f64().unwrap() < 1e-5), "{:?}", recs.iter().map(|r| &r["metrics"]).collect::<Vec<_>>());

    // An engine whose probe reply is far from the model core after the load fails such a stage
    // (the fake engine answers success to the load and samples what it always samples).
    let p = pipeline(dir.path(), &format!("{stages}{}{}", eval("ev_fake_a", "sft", &fake_http), eval("ev_fake_b", "sft2", &fake_http)));
    let out = run(&store, &p, &["--jobs", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("mean over its probe reply") && err.contains("did not take"), "{err}");

    // A rollout with top-k entropies (no prefill of its samples) is checked the same way: the
    // stale load 0.02% apart fails it.
    let topk_http = format!("{stale_http}, entropies = \"topk\", top_logprobs = 2");
    let nearer_topk = roll("stale_f", "sft", &topk_http).replace("policy = \"sft.model\"", &format!("policy = \"file:{}\"", nearer.display()));
    let p = pipeline(dir.path(), &format!("{stages}{}{nearer_topk}", roll("stale_e", "sft", &topk_http)));
    let out = run(&store, &p, &["--jobs", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("exactly as before, to the bit") && err.contains("did not take"), "{err}");
}

/// `sleep = true`: the kept engine (`rredcot serve`, SGLang's protocol) releases its weights once
/// a stage has sampled, and the next stage resumes it and loads its checkpoint, even the one the
/// engine held (the weights are gone: `rredcot serve` refuses to sample until a load, as SGLang's
/// weights are undefined then). Two rollouts over one checkpoint with two seeds through one kept
/// engine equal the built-in ones.
#[test]
fn a_sleeping_kept_engine_is_woken_and_loaded_before_it_samples() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let http = format!(", backend = \"http\", server_command = \"{SERVE}\", concurrency = 4, timeout_s = 120.0, reload = \"sglang\", sleep = true");
    let roll = |name: &str, seed: u64, extra: &str| {
        format!("[[stage]]\nname = \"{name}\"\nuses = \"rollout\"\ninputs = {{ prompts = \"taskgen.eval\", policy = \"sft.model\" }}\nparams = {{ seed = {seed}, limit = 3, group_size = 3, max_new_tokens = 40, batch_size = 4, device = \"cpu\", threads = 1{extra} }}\n")
    };
    let stages = [roll("local_a", 3, ""), roll("local_b", 4, ""), roll("http_a", 3, &http), roll("http_b", 4, &http)].concat();
    let p = pipeline(dir.path(), &stages);
    let s = run_ok(&store, &p, &["--jobs", "1"]);
    assert_same_rollouts(&rollouts(&store, &s, "local_a"), &rollouts(&store, &s, "http_a"), "seed 3");
    assert_same_rollouts(&rollouts(&store, &s, "local_b"), &rollouts(&store, &s, "http_b"), "seed 4");
    let recs = [record(&store, &s, "http_a"), record(&store, &s, "http_b")];
    let metrics: Vec<&Value> = recs.iter().map(|r| &r["metrics"]).collect();
    let kept: Vec<&&Value> = metrics.iter().filter(|m| m["engine_reused"] == Value::Bool(true)).collect();
    assert_eq!(kept.len(), 1, "{metrics:?}");
    // Both stages put the engine to sleep; the second woke it and loaded the checkpoint it held.
    assert!(metrics.iter().all(|m| m["engine_sleep_s"].as_f64().is_some()), "{metrics:?}");
    assert!(kept[0]["engine_reload_s"].as_f64().unwrap() > 0.0 && kept[0]["engine_wake_s"].as_f64().is_some(), "{metrics:?}");
    assert!(kept[0]["engine_probe_logprob_gap_mean"].as_f64().is_none() && kept[0]["engine_logprob_gap_mean"].as_f64().unwrap() < 1e-5, "{metrics:?}");
    let first = recs[0]["inputs"]["policy"]["hash"].as_str().unwrap().to_string();
    assert!(processes_with(&format!("--model-name {first}")).is_empty(), "{:?}", processes_with(&first));

    // vLLM's protocol (the proxy's vllm mode: `/sleep?level=2`, `/wake_up?tags=weights`, the
    // load, `/wake_up?tags=kv_cache`, `/is_sleeping`; sampling refused while a tag sleeps): the
    // same rollouts.
    let vllm = format!(", backend = \"http\", server_command = \"{}\", concurrency = 4, timeout_s = 120.0, reload = \"vllm\", sleep = true", proxied_serve(dir.path(), "vllm"));
    let p = pipeline(dir.path(), &format!("{stages}{}{}", roll("vllm_a", 3, &vllm), roll("vllm_b", 4, &vllm)));
    let s = run_ok(&store, &p, &["--jobs", "1"]);
    assert_same_rollouts(&rollouts(&store, &s, "local_a"), &rollouts(&store, &s, "vllm_a"), "seed 3, vLLM's protocol");
    assert_same_rollouts(&rollouts(&store, &s, "local_b"), &rollouts(&store, &s, "vllm_b"), "seed 4, vLLM's protocol");
    let recs = [record(&store, &s, "vllm_a"), record(&store, &s, "vllm_b")];
    assert_eq!(recs.iter().filter(|r| r["metrics"]["engine_reused"] == Value::Bool(true)).count(), 1);
    assert!(recs.iter().all(|r| r["metrics"]["engine_sleep_s"].as_f64().is_some()), "{:?}", recs.iter().map(|r| &r["metrics"]).collect::<Vec<_>>());
}

/// What a kept engine leaves in the system's temporary directory under its port (from the run
/// record `rec` of a stage that used it): `rredcot-engine-{pid}-{port}.{ext}` (`log`, `views`).
fn kept_engine_files(rec: &Value, ext: &str) -> Vec<String> {
    let port = rec["metrics"]["engine_url"].as_str().unwrap().trim_end_matches("/v1").rsplit(':').next().unwrap().to_string();
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("rredcot-engine-") && n.ends_with(&format!("-{port}.{ext}")))
        .collect()
}

/// Writes [`PROXY`] into `dir`; the `server_command` of `rredcot serve` behind it in `mode`.
fn proxied_serve(dir: &Path, mode: &str) -> String {
    let proxy = dir.join("proxy.py");
    std::fs::write(&proxy, PROXY).unwrap();
    format!("python3 {} {{port}} {mode} {}", proxy.display(), SERVE.replace("{port}", "INNER"))
}

/// Multiplies the final norm's weight of a checkpoint file by `factor` (so its logits), in place.
fn scale_final_norm(file: &Path, factor: f32) {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let mut data = view.data().to_vec();
        if name == "model.norm.weight" {
            assert_eq!(view.dtype(), safetensors::Dtype::F32);
            for c in data.chunks_exact_mut(4) {
                let v = f32::from_le_bytes(c.try_into().unwrap()) * factor;
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        tensors.push((name, view.dtype(), view.shape().to_vec(), data));
    }
    assert!(tensors.iter().any(|t| t.0 == "model.norm.weight"));
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, file).unwrap();
}

/// A proxy in front of an engine: `python3 proxy.py PORT MODE COMMAND…` starts COMMAND (`rredcot
/// serve`) with `INNER` replaced by a free port and passes every request on to it, except loads.
/// MODE `stale`: `POST /update_weights_from_disk` is answered with success and not passed on (a
/// load that does not take). MODE `vllm`: the engine speaks vLLM's reload protocol and insists on
/// untied views (`--model` and each `weights_path` must be one: `tie_word_embeddings` false,
/// `lm_head.safetensors`, linked weights), and is given the checkpoint each view links to; its
/// sleep routes (`/sleep?level=2`, `/wake_up?tags=…`, `/is_sleeping`) keep vLLM's tags and pass
/// on as SGLang's release and resume, and it refuses sampling while a tag sleeps. MODE
/// `sglang`: the engine shows SGLang 0.5.23's face as its source reads: `owned_by = "sglang"`, no
/// `/version` but `/server_info`, and the `n` choices of a request share one seed, so a request
/// with `n > 1` is refused here (the client must send each row with its own seed). MODE
/// `unseeded`: each completion request's seed is replaced by a random one.
const PROXY: &str = include_str!("engine_proxy.py");

/// A fake engine: `python3 fake.py PORT MODE MODEL PIDFILE`. MODE: ok, text (no token ids), fewer
/// (one choice short), hang (completions never answer), die (exits on the first sampling request,
/// the third completion request after the probe's two), model (lists another model). In every
/// mode it answers a load with success and refuses a release (as SGLang without its memory saver).
const FAKE: &str = r#"
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, mode, model, pidfile = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
open(pidfile, "w").write(str(os.getpid()))
calls = [0]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, body, status=200):
        b = json.dumps(body).encode()
        self.send_response(status); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_GET(self):
        if self.path == "/v1/models":
            self.reply({"object": "list", "data": [{"id": "someone-else" if mode == "model" else model, "owned_by": "fake"}]})
        elif self.path == "/version":
            self.reply({"version": "0.0-fake"})
        else:
            self.reply({"error": "no"}, 404)
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/update_weights_from_disk":
            return self.reply({"success": True, "message": "(not really)"})
        if self.path == "/release_memory_occupation":
            return self.reply({"success": False, "message": "started without --enable-memory-saver"}, 400)
        calls[0] += 1
        if mode == "hang":
            time.sleep(3600)
        if mode == "die" and calls[0] >= 3:
            os._exit(3)
        n = req["n"] - (1 if mode == "fewer" else 0)
        lp = {"tokens": ["a"] if mode == "text" else ["token_id:1"], "token_logprobs": [-0.5], "top_logprobs": [{"a": -0.5}]}
        choices = [{"index": i, "text": "a", "finish_reason": "length", "logprobs": lp} for i in range(n)]
        self.reply({"id": "x", "object": "text_completion", "model": model, "choices": choices})
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

#[test]
fn bad_engines_are_clear_errors_with_nothing_cached_and_no_engine_left() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let fake = dir.path().join("fake.py");
    std::fs::write(&fake, FAKE).unwrap();
    let pidfile = dir.path().join("engine.pid");
    let stages = format!("[[stage]]\nname = \"roll\"\nuses = \"rollout\"\n{ROLLOUT}, backend = \"http\", timeout_s = 20.0, retries = 1 }}\n");
    let p = pipeline(dir.path(), &stages);
    let world = run_ok(&store, &p, &["--until", "sft"]);
    let committed = || std::fs::read_dir(store.join("instances")).unwrap().flatten().filter(|e| e.path().join("run.json").exists()).count();
    let before = committed();
    assert_eq!(before, world["keys"].as_object().unwrap().len());
    let cmd = |mode: &str| format!("roll.server_command=python3 {} {{port}} {mode} {{policy_hash}} {}", fake.display(), pidfile.display());

    let cases: Vec<(Vec<String>, &[&str])> = vec![
        (vec!["roll.base_url=http://127.0.0.1:9/v1".into()], &["http://127.0.0.1:9/v1", "did not answer"]),
        (vec![cmd("model")], &["serves [\"someone-else\"]", "refusing samples from another model", "/v1/models"]),
        (vec![cmd("text")], &["no token ids", "return_tokens_as_token_ids", "/v1/completions", "probe"]),
        (vec![cmd("fewer")], &["0 choice(s) for n = 1", "/v1/completions"]),
        (vec![cmd("hang"), "roll.timeout_s=3.0".into(), "roll.retries=0".into()], &["/v1/completions", "probe", "failed after 1 attempt", "tim"]),
        (vec![cmd("die")], &["/v1/completions", "exited", "sample"]),
        (vec![cmd("ok"), "roll.served_model=".into(), "roll.server_command=".into(), "roll.base_url=http://127.0.0.1:9/v1".into()], &["served_model is empty"]),
        (vec!["roll.reload=vllm".into(), "roll.base_url=http://127.0.0.1:9/v1".into()], &["reload = \"vllm\" keeps an engine the stage starts", "no server_command"]),
        (vec![cmd("ok"), "roll.sleep=true".into()], &["sleep = true", "reload = \"none\" keeps none"]),
        (vec![cmd("ok"), "roll.reload=sglang".into(), "roll.sleep=true".into()], &["putting the kept engine to sleep", "/release_memory_occupation", "HTTP 400", "started without --enable-memory-saver"]),
    ];
    for (sets, want) in &cases {
        let _ = std::fs::remove_file(&pidfile);
        let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s.as_str()]).collect();
        let out = run(&store, &p, &args);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{sets:?} should fail: {text}");
        assert!(text.contains("stage `roll`"), "{sets:?}: the error names the stage: {text}");
        for w in *want {
            assert!(text.contains(w), "{sets:?}: no {w:?} in: {text}");
        }
        assert_eq!(committed(), before, "{sets:?}: nothing is cached");
        if let Ok(pid) = std::fs::read_to_string(&pidfile) {
            assert!(!Path::new(&format!("/proc/{pid}")).exists() || is_zombie(&pid), "{sets:?}: engine {pid} outlived its stage");
        }
    }

    // A run killed while the engine hangs leaves no engine behind.
    let _ = std::fs::remove_file(&pidfile);
    let mut c = Command::new(worker());
    c.arg("--store").arg(&store).args(["pipeline", "run"]).arg(&p);
    for s in TINY_WORLD.iter().map(|s| s.to_string()).chain([cmd("hang")]) {
        c.args(["--set", &s]);
    }
    let mut child = c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    while !pidfile.exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "the engine never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    child.kill().unwrap();
    child.wait().unwrap();
    let t0 = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(&pid) {
        assert!(t0.elapsed() < Duration::from_secs(20), "engine {pid} outlived the killed run");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(committed(), before);
}

fn is_zombie(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.split_whitespace().nth(2) == Some("Z")).unwrap_or(true)
}
