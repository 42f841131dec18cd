//! The HTTP judge against a scripted fake OpenAI server on loopback (a thread in this process):
//! 429 then success, garbage JSON, a server that hangs past the timeout, a server that is down,
//! a 400 that is not retried; replies received before a failure stay in the cache and a rerun
//! continues from them; and the `judge` stage through the real binary (votes, majority,
//! counters, a rerun that sends 0 HTTP requests).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rredcot::artifact::rows::EvalRow;
use rredcot::artifact::{read_batches, read_rows, write_rows, Schema};
use rredcot::judge::cache::ResponseCache;
use rredcot::judge::http::{ChatClient, ChatRequest, HttpConfig, Stats};
use rredcot::judge::JudgeError;
use serde_json::{json, Value};

/// What the fake server does with request number `i` (0-based).
enum Reply {
    Json(u16, Value),
    Raw(u16, &'static str, Option<&'static str>),
    Hang(Duration),
}

type Script = dyn Fn(usize, &Value) -> Reply + Send + Sync;

/// A fake chat completions server; stops by itself after `LIFETIME`.
struct FakeServer {
    url: String,
    requests: Arc<AtomicUsize>,
    auth: Arc<Mutex<Vec<String>>>,
}

const LIFETIME: Duration = Duration::from_secs(120);

fn completion(text: &str) -> Value {
    json!({
        "id": "x", "object": "chat.completion", "created": 0, "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    })
}

fn serve_one(mut stream: TcpStream, i: usize, script: &Script, auth: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        if lower.starts_with("authorization:") {
            auth.lock().unwrap().push(line["authorization:".len()..].trim().to_string());
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body).unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (status, text, retry_after) = match script(i, &body) {
        Reply::Json(s, v) => (s, v.to_string(), None),
        Reply::Raw(s, t, ra) => (s, t.to_string(), ra),
        Reply::Hang(d) => {
            std::thread::sleep(d);
            return;
        }
    };
    let extra = retry_after.map(|r| format!("Retry-After: {r}\r\n")).unwrap_or_default();
    let head = format!("HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n", text.len());
    let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(text.as_bytes()));
}

impl FakeServer {
    fn start(script: impl Fn(usize, &Value) -> Reply + Send + Sync + 'static) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let auth = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let (n, a) = (requests.clone(), auth.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while t0.elapsed() < LIFETIME {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        let i = n.fetch_add(1, Ordering::SeqCst);
                        let (script, a) = (script.clone(), a.clone());
                        std::thread::spawn(move || serve_one(stream, i, &*script, &a));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        FakeServer { url, requests, auth }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn config(url: &str, retries: u32) -> HttpConfig {
    HttpConfig {
        url: url.to_string(),
        api_key: None,
        timeout: Duration::from_secs(10),
        retries,
        backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
        concurrency: 1,
    }
}

fn request(i: usize) -> ChatRequest {
    ChatRequest {
        body: json!({"model": "m", "messages": [{"role": "user", "content": format!("question {i}")}], "seed": i}),
        label: format!("vote {i}"),
    }
}

fn err_text(e: JudgeError) -> String {
    e.to_string()
}

#[test]
fn rate_limits_are_retried_with_backoff_and_the_key_is_sent() {
    let server = FakeServer::start(|i, _| if i < 2 { Reply::Raw(429, "{\"error\":\"slow down\"}", Some("0")) } else { Reply::Json(200, completion("Verdict: YES")) });
    let client = ChatClient::new(HttpConfig { api_key: Some("sk-test".into()), ..config(&server.url, 3) }).unwrap();
    let stats = Stats::default();
    let (_, reply) = client.complete(&request(0), &stats).unwrap();
    assert_eq!(reply, "Verdict: YES");
    assert_eq!((Stats::get(&stats.http_calls), Stats::get(&stats.retries)), (3, 2));
    assert_eq!(server.requests(), 3);
    assert!(server.auth.lock().unwrap().iter().all(|a| a == "Bearer sk-test"));
}

#[test]
fn garbage_json_is_retried_then_reported_with_url_and_request() {
    let server = FakeServer::start(|_, _| Reply::Raw(200, "<html>oops", None));
    let client = ChatClient::new(config(&server.url, 2)).unwrap();
    let stats = Stats::default();
    let e = err_text(client.complete(&request(7), &stats).unwrap_err());
    assert!(e.contains(&format!("{}/chat/completions", server.url)) && e.contains("vote 7"), "{e}");
    assert!(e.contains("after 3 attempts") && e.contains("not JSON") && e.contains("<html>oops"), "{e}");
    assert_eq!(server.requests(), 3);
    // Valid JSON that is not a chat completion is garbage too.
    let server = FakeServer::start(|_, _| Reply::Json(200, json!({"result": "yes"})));
    let e = err_text(ChatClient::new(config(&server.url, 1)).unwrap().complete(&request(0), &stats).unwrap_err());
    assert!(e.contains("not a chat completion"), "{e}");
}

#[test]
fn a_hanging_server_times_out_within_the_bound() {
    let server = FakeServer::start(|_, _| Reply::Hang(Duration::from_secs(5)));
    let client = ChatClient::new(HttpConfig { timeout: Duration::from_millis(300), ..config(&server.url, 1) }).unwrap();
    let t0 = Instant::now();
    let e = err_text(client.complete(&request(1), &Stats::default()).unwrap_err());
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(3), "two attempts of 0.3 s took {took:?}");
    assert!(e.contains(&server.url) && e.contains("after 2 attempts") && e.to_lowercase().contains("timeout"), "{e}");
    assert_eq!(server.requests(), 2);
}

#[test]
fn a_server_that_is_down_is_reported_and_client_errors_are_not_retried() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/v1");
    let stats = Stats::default();
    let e = err_text(ChatClient::new(config(&url, 2)).unwrap().complete(&request(2), &stats).unwrap_err());
    assert!(e.contains(&format!("POST {url}/chat/completions (vote 2)")) && e.contains("after 3 attempts"), "{e}");
    assert_eq!(Stats::get(&stats.http_calls), 3);

    let server = FakeServer::start(|_, _| Reply::Json(400, json!({"error": {"message": "model `m` does not exist"}})));
    let e = err_text(ChatClient::new(config(&server.url, 5)).unwrap().complete(&request(3), &Stats::default()).unwrap_err());
    assert!(e.contains("HTTP 400") && e.contains("not retried") && e.contains("does not exist"), "{e}");
    assert_eq!(server.requests(), 1);
}

#[test]
fn replies_received_before_a_failure_stay_cached_and_a_rerun_continues() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ResponseCache::open(dir.path()).unwrap();
    let requests: Vec<ChatRequest> = (0..6).map(request).collect();
    // Three good replies, then the server breaks down.
    let broken = FakeServer::start(|i, body| {
        if i < 3 {
            Reply::Json(200, completion(&format!("reply to {}", body["messages"][0]["content"].as_str().unwrap())))
        } else {
            Reply::Raw(503, "overloaded", None)
        }
    });
    let stats = Stats::default();
    let e = err_text(ChatClient::new(config(&broken.url, 1)).unwrap().complete_all(Some(&cache), &requests, &stats, &|| ()).unwrap_err());
    assert!(e.contains("vote 3") && e.contains("HTTP 503"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3, "the three replies are cached");

    let healthy = FakeServer::start(|_, body| Reply::Json(200, completion(&format!("reply to {}", body["messages"][0]["content"].as_str().unwrap()))));
    let stats = Stats::default();
    let done = AtomicUsize::new(0);
    let client = ChatClient::new(HttpConfig { concurrency: 3, ..config(&healthy.url, 1) }).unwrap();
    let replies = client.complete_all(Some(&cache), &requests, &stats, &|| _ = done.fetch_add(1, Ordering::SeqCst)).unwrap();
    assert_eq!(replies, (0..6).map(|i| format!("reply to question {i}")).collect::<Vec<_>>());
    assert_eq!((Stats::get(&stats.cache_hits), Stats::get(&stats.http_calls)), (3, 3));
    assert_eq!(healthy.requests(), 3);
    assert_eq!(done.load(Ordering::SeqCst), 6);

    // Everything is cached now: no request at all, even with the server gone.
    let stats = Stats::default();
    let gone = ChatClient::new(config("http://127.0.0.1:9/v1", 0)).unwrap();
    assert_eq!(gone.complete_all(Some(&cache), &requests, &stats, &|| ()).unwrap(), replies);
    assert_eq!((Stats::get(&stats.cache_hits), Stats::get(&stats.http_calls)), (6, 0));
}

// ---- the `judge` stage through the real binary ----

fn eval_row(id: &str, text: &str, verifier: bool) -> EvalRow {
    EvalRow {
        prompt_id: id.into(),
        benchmark: "toy".into(),
        sample_idx: 0,
        question: format!("What is problem {id}?"),
        reference: Some("12".into()),
        text: text.into(),
        answer: Some("12".into()),
        correct_verifier: verifier,
        correct_judge: None,
    }
}

/// Fake judge: YES when the response says `[ok]`, NO for `[bad]`, no verdict otherwise.
fn fake_judge(_: usize, body: &Value) -> Reply {
    let prompt = body["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap();
    let verdict = if prompt.contains("[ok]") {
        "Looks right.\nVerdict: YES"
    } else if prompt.contains("[bad]") {
        "\\boxed{no}"
    } else {
        "I cannot tell."
    };
    Reply::Json(200, completion(verdict))
}

fn judge_pipeline(p: &common::Project, url: &str) -> std::path::PathBuf {
    let rows = vec![
        eval_row("a", "so it is 12 [ok]", true),
        eval_row("b", "it is 13 [bad]", false),
        eval_row("c", "twelve-ish [ok]", false),
        eval_row("d", "no idea", false),
    ];
    write_rows(&p.path().join("eval.parquet"), Schema::Eval, &rows).unwrap();
    p.pipeline(
        "judge",
        &format!(
            "[[stage]]\nname = \"judge\"\ninputs = {{ eval = \"file:eval.parquet\" }}\n\
             params = {{ url = \"{url}\", model = \"fake\", samples = 3, retries = 1, backoff_s = 0.01, timeout_s = 5.0, api_key_env = \"\" }}\n"
        ),
    )
}

#[test]
fn judge_stage_votes_fills_every_row_and_reruns_from_the_cache() {
    let p = common::Project::new();
    let server = FakeServer::start(fake_judge);
    let pl = judge_pipeline(&p, &server.url);
    let s = p.run_ok(&pl, &[]);
    let key = s["keys"]["judge"].as_str().unwrap().to_string();
    let rec = p.record(&key);
    let votes = 4 * 2 * 3;
    let c = |rec: &Value, k: &str| rec["counters"][k].as_i64().unwrap_or(-1);
    assert_eq!((c(&rec, "votes"), c(&rec, "http_calls"), c(&rec, "cache_hits")), (votes, votes, 0), "{rec}");
    assert_eq!(server.requests() as i64, votes);
    assert_eq!((c(&rec, "invalid_votes"), c(&rec, "rows_no_valid_vote"), c(&rec, "judge_ties")), (6, 1, 1));
    assert_eq!(c(&rec, "judge_verifier_disagreements"), 1, "row c: judge yes, verifier no");
    assert_eq!(rec["metrics"]["agreement_with_verifier"], json!(0.75));
    assert_eq!(rec["metrics"]["judge_accuracy"], json!(0.5));

    let out = p.store().join("instances").join(&key).join("outputs");
    let rows: Vec<EvalRow> = read_rows(&out.join("eval.parquet"), Schema::Eval).unwrap();
    let judged: Vec<(String, Option<bool>)> = rows.iter().map(|r| (r.prompt_id.clone(), r.correct_judge)).collect();
    assert_eq!(
        judged,
        vec![("a".into(), Some(true)), ("b".into(), Some(false)), ("c".into(), Some(true)), ("d".into(), Some(false))]
    );
    let table = read_batches(&out.join("judgments.parquet")).unwrap();
    assert_eq!(table.num_rows() as i64, votes);
    for col in ["prompt_id", "sample_idx", "template", "vote", "reply", "verdict"] {
        assert!(table.schema().index_of(col).is_ok(), "judgments has {col}");
    }

    // A forced rerun asks nothing: every reply comes from <store>/cache/judge, and the artifacts
    // are identical.
    let before = server.requests();
    let s2 = p.run_ok(&pl, &["--force", "judge"]);
    let rec2 = p.record(s2["keys"]["judge"].as_str().unwrap());
    assert_eq!((c(&rec2, "http_calls"), c(&rec2, "cache_hits")), (0, votes), "{rec2}");
    assert_eq!(server.requests(), before);
    for name in ["eval", "judgments"] {
        assert_eq!(rec2["outputs"][name]["hash"], rec["outputs"][name]["hash"], "{name}");
    }
}

#[test]
fn judge_stage_fails_clearly_when_the_server_is_down_and_keeps_nothing() {
    let p = common::Project::new();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let pl = judge_pipeline(&p, &url);
    let out = p.run(&["pipeline", "run", pl.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = common::text(&out.stderr);
    assert!(err.contains(&format!("POST {url}/chat/completions")) && err.contains("prompt a sample 0"), "{err}");
    assert!(err.contains("after 2 attempts") && err.contains("a rerun continues"), "{err}");
    assert!(p.committed().is_empty());
}
