//! A client for OpenAI-compatible `/v1/chat/completions` servers (vLLM, llama.cpp's server,
//! `rredcot serve`, hosted APIs): per-request timeout, bounded retries with exponential backoff,
//! a concurrency limit, and the response cache.
//!
//! Retried: connection errors, timeouts, HTTP 429 (honouring `Retry-After`) and 5xx, and a 2xx
//! whose body is not a chat completion (garbage JSON). Not retried: any other 4xx (a bad request,
//! a wrong key or model stays wrong). When the retries are spent the error names the URL and the
//! request; replies obtained before that are already in the cache.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use super::cache::{Lookup, ResponseCache};
use super::reply_content;
use super::JudgeError;

/// How to reach the server and how hard to try.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Base URL (`http://127.0.0.1:8000/v1`) or the full `/chat/completions` endpoint.
    pub url: String,
    /// Sent as `Authorization: Bearer …` when set.
    pub api_key: Option<String>,
    /// Whole-request timeout (connect, send, wait, read).
    pub timeout: Duration,
    /// Retries after the first attempt.
    pub retries: u32,
    /// Delay before the first retry; doubles with each retry up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Requests in flight at once.
    pub concurrency: usize,
}

/// One chat completion request: the JSON body and a label that names it in errors.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub body: Value,
    pub label: String,
}

/// What a batch of requests cost; shared by the worker threads, read by the stage for its counters
/// (also when the batch failed).
#[derive(Debug, Default)]
pub struct Stats {
    /// HTTP requests sent (retries included).
    pub http_calls: AtomicI64,
    /// Attempts that were retried.
    pub retries: AtomicI64,
    pub cache_hits: AtomicI64,
    /// Unusable cache entries dropped and asked again.
    pub cache_corrupt: AtomicI64,
    /// `usage.completion_tokens` of the fresh responses.
    pub completion_tokens: AtomicI64,
}

impl Stats {
    fn add(counter: &AtomicI64, n: i64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicI64) -> i64 {
        counter.load(Ordering::Relaxed)
    }
}

/// `url` as the chat completions endpoint (`…/chat/completions` appended to a base URL).
pub fn endpoint(url: &str) -> String {
    let u = url.trim_end_matches('/');
    if u.ends_with("/chat/completions") {
        u.to_string()
    } else {
        format!("{u}/chat/completions")
    }
}

/// The path of an endpoint URL (what the cache key holds instead of the host).
fn url_path(endpoint: &str) -> &str {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.find('/').map_or("/", |i| &rest[i..])
}

/// The outcome of one HTTP attempt.
enum Attempt {
    Done { response: Value, reply: String },
    /// Worth another try; why, and the server's `Retry-After` if it sent one.
    Retry { why: String, after: Option<Duration> },
    Fatal { status: u16, body: String },
}

pub struct ChatClient {
    agent: ureq::Agent,
    endpoint: String,
    cfg: HttpConfig,
}

impl ChatClient {
    pub fn new(cfg: HttpConfig) -> Result<ChatClient, JudgeError> {
        let endpoint = endpoint(&cfg.url);
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(JudgeError::Config(format!("judge url `{}` must start with http:// or https://", cfg.url)));
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(cfg.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("rredcot/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(ChatClient { agent, endpoint, cfg })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// What the cache key is computed from: the endpoint's path and the body (not the host or key).
    pub fn cache_request(&self, body: &Value) -> Value {
        json!({ "path": url_path(&self.endpoint), "body": body })
    }

    fn attempt(&self, body: &Value) -> Attempt {
        let mut req = self.agent.post(&self.endpoint).header("Content-Type", "application/json");
        if let Some(key) = &self.cfg.api_key {
            req = req.header("Authorization", &format!("Bearer {key}"));
        }
        let mut resp = match req.send_json(body) {
            Ok(r) => r,
            Err(e @ (ureq::Error::BadUri(_) | ureq::Error::RequireHttpsOnly(_) | ureq::Error::InvalidProxyUrl)) => {
                return Attempt::Fatal { status: 0, body: e.to_string() }
            }
            Err(e) => return Attempt::Retry { why: e.to_string(), after: None },
        };
        let status = resp.status().as_u16();
        let after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64);
        let text = match resp.body_mut().read_to_string() {
            Ok(t) => t,
            Err(e) => return Attempt::Retry { why: format!("HTTP {status}, reading the body: {e}"), after: None },
        };
        match status {
            200..=299 => match serde_json::from_str::<Value>(&text) {
                Ok(response) => match reply_content(&response) {
                    Some(reply) => Attempt::Done { response, reply },
                    None => Attempt::Retry { why: format!("HTTP {status} but not a chat completion: {}", clip(&text)), after: None },
                },
                Err(e) => Attempt::Retry { why: format!("HTTP {status} with a body that is not JSON ({e}): {}", clip(&text)), after: None },
            },
            429 | 500..=599 => Attempt::Retry { why: format!("HTTP {status}: {}", clip(&text)), after },
            _ => Attempt::Fatal { status, body: clip(&text) },
        }
    }

    /// One request with bounded retries; returns the response and its reply text.
    pub fn complete(&self, req: &ChatRequest, stats: &Stats) -> Result<(Value, String), JudgeError> {
        let mut delay = self.cfg.backoff;
        let mut attempts = 0;
        loop {
            attempts += 1;
            Stats::add(&stats.http_calls, 1);
            let why = match self.attempt(&req.body) {
                Attempt::Done { response, reply } => return Ok((response, reply)),
                Attempt::Fatal { status, body } => {
                    return Err(JudgeError::Rejected { url: self.endpoint.clone(), request: req.label.clone(), status, body })
                }
                Attempt::Retry { why, after } => {
                    if attempts > self.cfg.retries {
                        return Err(JudgeError::GaveUp { url: self.endpoint.clone(), request: req.label.clone(), attempts, last: why });
                    }
                    std::thread::sleep(after.map_or(delay, |a| a.max(delay)).min(self.cfg.max_backoff));
                    delay = (delay * 2).min(self.cfg.max_backoff);
                    why
                }
            };
            Stats::add(&stats.retries, 1);
            tracing::info!("retrying POST {} ({}): {why}", self.endpoint, req.label);
        }
    }

    /// Replies to every request, in order: from the cache when it has them, else from the server
    /// with at most `concurrency` requests in flight. Fresh responses go into the cache as they
    /// arrive. On the first failure no new request is started, those in flight finish (and are
    /// cached), and the error is returned. `on_done` is called once per finished request.
    pub fn complete_all(
        &self,
        cache: Option<&ResponseCache>,
        requests: &[ChatRequest],
        stats: &Stats,
        on_done: &(dyn Fn() + Sync),
    ) -> Result<Vec<String>, JudgeError> {
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let replies: Mutex<Vec<Option<String>>> = Mutex::new(vec![None; requests.len()]);
        let first_error: Mutex<Option<JudgeError>> = Mutex::new(None);
        let one = |req: &ChatRequest| -> Result<String, JudgeError> {
            let cache_req = self.cache_request(&req.body);
            let key = ResponseCache::key(&cache_req);
            if let Some(cache) = cache {
                match cache.get(&key, &cache_req) {
                    Lookup::Hit(reply) => {
                        Stats::add(&stats.cache_hits, 1);
                        return Ok(reply);
                    }
                    Lookup::Corrupt(why) => {
                        tracing::warn!("dropped judge cache entry {why}");
                        Stats::add(&stats.cache_corrupt, 1);
                    }
                    Lookup::Miss => {}
                }
            }
            let (response, reply) = self.complete(req, stats)?;
            Stats::add(&stats.completion_tokens, response["usage"]["completion_tokens"].as_i64().unwrap_or(0));
            if let Some(cache) = cache {
                cache.put(&key, &cache_req, &response)?;
            }
            Ok(reply)
        };
        let workers = self.cfg.concurrency.clamp(1, requests.len().max(1));
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    while !stop.load(Ordering::SeqCst) {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(req) = requests.get(i) else { break };
                        match one(req) {
                            Ok(reply) => replies.lock().expect("replies")[i] = Some(reply),
                            Err(e) => {
                                stop.store(true, Ordering::SeqCst);
                                first_error.lock().expect("error").get_or_insert(e);
                            }
                        }
                        on_done();
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner().expect("error") {
            return Err(e);
        }
        Ok(replies.into_inner().expect("replies").into_iter().map(|r| r.expect("every request answered")).collect())
    }
}

/// At most 300 characters of a server's body, for error messages.
fn clip(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_paths() {
        assert_eq!(endpoint("http://127.0.0.1:8000/v1"), "http://127.0.0.1:8000/v1/chat/completions");
        assert_eq!(endpoint("http://h/v1/chat/completions/"), "http://h/v1/chat/completions");
        assert_eq!(url_path("https://api.example.org:443/v1/chat/completions"), "/v1/chat/completions");
        assert_eq!(url_path("http://h"), "/");
        assert!(ChatClient::new(HttpConfig {
            url: "localhost:8000".into(),
            api_key: None,
            timeout: Duration::from_secs(1),
            retries: 0,
            backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            concurrency: 1
        })
        .is_err());
    }

    #[test]
    fn clip_is_char_safe() {
        let long = "é".repeat(400);
        assert_eq!(clip(&long).chars().count(), 301);
        assert_eq!(clip(" short "), "short");
    }
}
