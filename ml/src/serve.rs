//! `rredcot serve`: an OpenAI-compatible HTTP server over the model core, so the `judge` stage (or
//! any OpenAI client) can use a trained checkpoint or a GGUF model.
//!
//! Endpoints: `POST /v1/chat/completions` (`messages`, `temperature`, `top_p`, `top_k`,
//! `max_tokens` / `max_completion_tokens`, `n`, `seed`, `stop`, `stop_token_ids`, `stream`,
//! `stream_options.include_usage`, `logprobs` + `top_logprobs`), `POST /v1/completions` (the same, with `prompt` as a string or
//! a list of token ids, plus `logprobs` = how many top tokens per position,
//! `return_tokens_as_token_ids` (tokens as `"token_id:123"`, as vLLM writes them) and
//! `return_token_ids` (each choice's `token_ids`); those three not with `stream`),
//! `GET /v1/models`, `GET /version`, `GET /health`. Responses have OpenAI's shapes; a streamed one
//! is OpenAI's server-sent chunks ([`stream`]); a bad request gets HTTP 400 with an OpenAI-style
//! `{"error": {...}}` body, never a crash, and so does a field this server would have to ignore
//! (penalties, `logit_bias`, tools, a JSON `response_format`: [`refuse_unsupported`]).
//!
//! A completion's `token_logprobs` are those the sampler drew from (softmax(logits / T) after
//! top-k and top-p, as the built-in rollout records them); its `top_logprobs` come from one
//! prefill of the finished completion under that same distribution (only when `logprobs` > 0).
//!
//! One model, one generating thread: requests that arrive while others generate wait in the
//! front's queue and are taken together next time; those with equal sampling params are generated
//! together in `--max-batch` slots, a finished row's slot taking the next waiting row (continuous
//! batching, as the built-in rollout). Choice i of a request samples with seed `seed + i` (vLLM's
//! convention; a random seed when the request has none), so a request with `n = 1` and a row's
//! seed samples exactly that row of the built-in rollout. Rows share the decode step's products
//! with their neighbours, so a reply can differ in the last bits between a lone request and one
//! taken with others; the judge's response cache is what makes reruns reproducible.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io::Write;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use rredcot::cli::ServeArgs;
use serde_json::{json, Value};
use hyper::Method;

mod front;
mod session;
mod stream;

use front::{EventSink, Front, Incoming};
use stream::{Chunks, StreamOptions, TextStream};

use crate::model::{self, ChatMessage, DecoderLm, LoadOptions, SamplingParams, Tokenizer};

/// Largest request body read (bytes).
const MAX_BODY: usize = 16 << 20;
/// How long the server waits for more requests to batch with the first one.
const GATHER: std::time::Duration = std::time::Duration::from_millis(5);
/// Largest `n` per request.
const MAX_N: usize = 16;

/// A request rejected before generation: HTTP status and message.
#[derive(Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError { status: 400, message: message.into() }
}

fn error_body(e: &ApiError) -> Value {
    let kind = if e.status >= 500 { "server_error" } else { "invalid_request_error" };
    json!({ "error": { "message": e.message, "type": kind, "param": null, "code": null } })
}

/// A parsed `/v1/chat/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatBody {
    pub messages: Vec<ChatMessage>,
    pub sampling: SamplingParams,
    pub n: usize,
    pub seed: Option<u64>,
    pub stream: Option<StreamOptions>,
    /// `logprobs` / `top_logprobs`: `None` = no logprobs; `Some(k)` = each token's and its top k.
    pub logprobs: Option<usize>,
}

/// The text of a message's `content`: a string, or an array of `{type: "text", text}` parts.
fn content_text(v: &Value, i: usize) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) => Ok(t),
                _ => Err(bad(format!("messages[{i}].content: only text parts are supported"))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|t| t.concat()),
        _ => Err(bad(format!("messages[{i}].content must be a string or an array of text parts"))),
    }
}

/// Parses and validates a chat completion request; `max_new_tokens` is the server's default and
/// upper bound for `max_tokens`.
pub fn parse_chat(body: &[u8], max_new_tokens: usize) -> Result<ChatBody, ApiError> {
    let obj = body_object(body)?;
    let msgs = obj.get("messages").and_then(Value::as_array).ok_or_else(|| bad("`messages` (an array) is required"))?;
    if msgs.is_empty() {
        return Err(bad("`messages` is empty"));
    }
    let messages = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| bad(format!("messages[{i}].role must be a string")))?;
            if !["system", "developer", "user", "assistant"].contains(&role) {
                return Err(bad(format!("messages[{i}].role `{role}` is not supported")));
            }
            let role = if role == "developer" { "system" } else { role };
            Ok(ChatMessage::new(role, &content_text(m.get("content").unwrap_or(&Value::Null), i)?))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (sampling, n, seed) = parse_sampling(&obj, max_new_tokens)?;
    let stream = parse_stream(&obj)?;
    let logprobs = match obj.get("logprobs") {
        None | Some(Value::Null) => false,
        Some(v) => v.as_bool().ok_or_else(|| bad("`logprobs` must be a boolean"))?,
    };
    let top = match obj.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(k) if k as usize <= MAX_LOGPROBS => Some(k as usize),
            _ => return Err(bad(format!("`top_logprobs` must be an integer in 0..={MAX_LOGPROBS}"))),
        },
    };
    if top.is_some() && !logprobs {
        return Err(bad("`top_logprobs` needs logprobs = true"));
    }
    let logprobs = logprobs.then(|| top.unwrap_or(0));
    if logprobs.is_some() && stream.is_some() {
        return Err(bad("`logprobs` is not supported with stream = true"));
    }
    Ok(ChatBody { messages, sampling, n, seed, stream, logprobs })
}

/// Request fields that would change what is generated or how, which this server does not do:
/// refused (400) unless they hold their do-nothing value, rather than silently ignored.
fn refuse_unsupported(obj: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    let inert = |name: &str, v: &Value| match name {
        "presence_penalty" | "frequency_penalty" | "min_p" => v.as_f64() == Some(0.0),
        "repetition_penalty" => v.as_f64() == Some(1.0),
        "logit_bias" => v.as_object().is_some_and(|o| o.is_empty()),
        "tools" | "functions" => v.as_array().is_some_and(|a| a.is_empty()),
        "tool_choice" | "function_call" => v.as_str() == Some("none"),
        "response_format" => v.get("type").and_then(Value::as_str) == Some("text"),
        "suffix" => v.as_str() == Some(""),
        "guided_json" | "guided_regex" | "guided_choice" | "guided_grammar" => false,
        _ => true,
    };
    for (name, v) in obj {
        if !v.is_null() && !inert(name, v) {
            return Err(bad(format!("`{name}` is not supported by rredcot serve")));
        }
    }
    Ok(())
}

/// A request body as a JSON object.
fn body_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("request body is not JSON: {e}")))?;
    let Value::Object(obj) = v else { return Err(bad("request body must be a JSON object")) };
    Ok(obj)
}

/// `stream` and `stream_options`: `None` for a whole reply.
fn parse_stream(obj: &serde_json::Map<String, Value>) -> Result<Option<StreamOptions>, ApiError> {
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(v) => v.as_bool().ok_or_else(|| bad("`stream` must be a boolean"))?,
    };
    let options = match obj.get("stream_options") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => Some(o),
        Some(_) => return Err(bad("`stream_options` must be an object")),
    };
    if !stream {
        return match options {
            Some(_) => Err(bad("`stream_options` is only allowed with stream = true")),
            None => Ok(None),
        };
    }
    let include_usage = match options.and_then(|o| o.get("include_usage")) {
        None | Some(Value::Null) => false,
        Some(v) => v.as_bool().ok_or_else(|| bad("`stream_options.include_usage` must be a boolean"))?,
    };
    Ok(Some(StreamOptions { include_usage }))
}

/// The sampling fields both endpoints share: params, `n` and `seed`.
fn parse_sampling(obj: &serde_json::Map<String, Value>, max_new_tokens: usize) -> Result<(SamplingParams, usize, Option<u64>), ApiError> {
    refuse_unsupported(obj)?;
    let num = |name: &str, default: f64| -> Result<f64, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_f64().filter(|f| f.is_finite()).ok_or_else(|| bad(format!("`{name}` must be a number"))),
        }
    };
    let int = |name: &str| -> Result<Option<u64>, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_u64().map(Some).ok_or_else(|| bad(format!("`{name}` must be a non-negative integer"))),
        }
    };
    let temperature = num("temperature", 1.0)?;
    let top_p = num("top_p", 1.0)?;
    if !(0.0..=2.0).contains(&temperature) {
        return Err(bad(format!("temperature {temperature} is outside [0, 2]")));
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(bad(format!("top_p {top_p} is outside (0, 1]")));
    }
    let top_k = match obj.get("top_k") {
        None | Some(Value::Null) => 0,
        Some(x) => x.as_i64().map(|k| k.max(0)).ok_or_else(|| bad("`top_k` must be an integer"))?,
    };
    let max_tokens = match (int("max_completion_tokens")?, int("max_tokens")?) {
        (Some(m), _) | (None, Some(m)) => (m as usize).min(max_new_tokens),
        (None, None) => max_new_tokens,
    };
    if max_tokens == 0 {
        return Err(bad("max_tokens must be at least 1"));
    }
    let n = int("n")?.unwrap_or(1) as usize;
    if !(1..=MAX_N).contains(&n) {
        return Err(bad(format!("n = {n} is outside 1..={MAX_N}")));
    }
    let stop_strings = match obj.get("stop") {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(String::from).ok_or_else(|| bad("`stop` must be a string or an array of strings")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("`stop` must be a string or an array of strings")),
    };
    if stop_strings.iter().any(String::is_empty) {
        return Err(bad("`stop` strings must not be empty"));
    }
    let stop_token_ids = match obj.get("stop_token_ids") {
        None | Some(Value::Null) => vec![],
        Some(v) => token_ids(v).ok_or_else(|| bad("`stop_token_ids` must be an array of token ids"))?,
    };
    let sampling = SamplingParams { temperature, top_p, top_k, max_new_tokens: max_tokens, stop_strings, stop_token_ids };
    // A seed is 64 bits, written unsigned or (as vLLM validates it, and as rredcot's http
    // backend sends it) signed: -1 is seed 2^64 - 1.
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => None,
        Some(x) => Some(x.as_u64().or_else(|| x.as_i64().map(|s| s as u64)).ok_or_else(|| bad("`seed` must be a 64-bit integer"))?),
    };
    Ok((sampling, n, seed))
}

/// A JSON array of non-negative integers as token ids.
fn token_ids(v: &Value) -> Option<Vec<i64>> {
    v.as_array()?.iter().map(|x| x.as_u64().and_then(|t| i64::try_from(t).ok())).collect()
}

/// Most top tokens per position a completion request may ask for (`logprobs`).
const MAX_LOGPROBS: usize = 20;

/// A completion's prompt: text (tokenized without a chat template) or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<i64>),
}

/// How a `/v1/completions` reply reports tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionFormat {
    /// `logprobs`: `None` = no logprobs object; `Some(k)` = chosen-token logprobs and the top k.
    pub logprobs: Option<usize>,
    /// `return_tokens_as_token_ids`: tokens written `"token_id:123"`.
    pub ids_as_tokens: bool,
    /// `return_token_ids`: each choice carries its `token_ids`.
    pub return_ids: bool,
}

/// A parsed `/v1/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionBody {
    pub prompt: PromptInput,
    pub sampling: SamplingParams,
    pub n: usize,
    pub seed: Option<u64>,
    pub format: CompletionFormat,
    pub stream: Option<StreamOptions>,
}

/// Parses and validates a completion request (one prompt per request); `max_new_tokens` as in
/// [`parse_chat`].
pub fn parse_completion(body: &[u8], max_new_tokens: usize) -> Result<CompletionBody, ApiError> {
    let obj = body_object(body)?;
    let one = "`prompt` must be a string or a list of token ids (one prompt per request)";
    let prompt = match obj.get("prompt") {
        None | Some(Value::Null) => return Err(bad("`prompt` is required")),
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && !a[0].is_number() => match &a[0] {
            Value::String(s) => PromptInput::Text(s.clone()),
            v => PromptInput::Ids(token_ids(v).ok_or_else(|| bad(one))?),
        },
        Some(v) => PromptInput::Ids(token_ids(v).ok_or_else(|| bad(one))?),
    };
    if matches!(&prompt, PromptInput::Ids(ids) if ids.is_empty()) || matches!(&prompt, PromptInput::Text(t) if t.is_empty()) {
        return Err(bad("`prompt` is empty"));
    }
    if obj.get("echo").and_then(Value::as_bool) == Some(true) {
        return Err(bad("echo = true is not supported"));
    }
    if obj.get("best_of").and_then(Value::as_u64).is_some_and(|b| b > 1) {
        return Err(bad("best_of is not supported"));
    }
    let logprobs = match obj.get("logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(k) if k as usize <= MAX_LOGPROBS => Some(k as usize),
            _ => return Err(bad(format!("`logprobs` must be an integer in 0..={MAX_LOGPROBS}"))),
        },
    };
    let flag = |name: &str| -> Result<bool, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(v) => v.as_bool().ok_or_else(|| bad(format!("`{name}` must be a boolean"))),
        }
    };
    let format = CompletionFormat { logprobs, ids_as_tokens: flag("return_tokens_as_token_ids")?, return_ids: flag("return_token_ids")? };
    let (sampling, n, seed) = parse_sampling(&obj, max_new_tokens)?;
    let stream = parse_stream(&obj)?;
    // Top logprobs come from a prefill of the finished choice, and streamed text is cut where the
    // text allows, not at token boundaries: neither fits a stream.
    if stream.is_some() {
        for (asked, name) in [(logprobs.is_some(), "logprobs"), (format.ids_as_tokens, "return_tokens_as_token_ids"), (format.return_ids, "return_token_ids")] {
            if asked {
                return Err(bad(format!("`{name}` is not supported with stream = true")));
            }
        }
    }
    Ok(CompletionBody { prompt, sampling, n, seed, format, stream })
}

/// What a request is answered with: a chat message (with each token's logprob and its top k when
/// `Some(k)`), or a completion.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reply {
    Chat(Option<usize>),
    Completion(CompletionFormat),
}

/// A request ready to generate.
struct Job {
    answer: Answerer,
    reply: Reply,
    prompt: Vec<i64>,
    sampling: SamplingParams,
    n: usize,
    seed: u64,
    started: Instant,
}

/// How a job is answered: whole when its choices have ended, or streamed as they decode.
enum Answerer {
    Whole(Incoming),
    Events(Events),
}

impl Job {
    /// Whether the client has gone (its connection closed: a timeout, a stopped stream): there
    /// is no one to decode for.
    fn client_gone(&self) -> bool {
        match &self.answer {
            Answerer::Whole(request) => request.is_gone(),
            Answerer::Events(ev) => ev.sink.is_gone(),
        }
    }
}

/// A streamed job's sink, its chunks' builder and each choice's text.
struct Events {
    sink: EventSink,
    chunks: Chunks,
    texts: Vec<TextStream>,
}

/// A request checked and tokenized.
struct Prepared {
    reply: Reply,
    prompt: Vec<i64>,
    sampling: SamplingParams,
    n: usize,
    seed: u64,
    stream: Option<StreamOptions>,
}

struct State {
    model: DecoderLm,
    tok: Tokenizer,
    name: String,
    created: u64,
    max_new_tokens: usize,
    max_batch: usize,
    /// Requests admitted so far (mixed into the seeds of requests without one).
    served: Cell<u64>,
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl State {
    /// Answers what needs no generation; returns the chat jobs.
    fn route(&self, mut req: Incoming) -> Option<Job> {
        let path = req.path.trim_end_matches('/').to_string();
        let method = req.method.clone();
        match (method, path.as_str()) {
            (Method::GET, "/v1/models") => {
                let body = json!({ "object": "list", "data": [
                    { "id": self.name, "object": "model", "created": self.created, "owned_by": "rredcot", "root": self.name, "parent": null,
                      "max_model_len": self.model.cfg.max_position_embeddings }
                ]});
                req.respond(200, &body);
            }
            (Method::GET, "/health") => req.respond(200, &json!({ "status": "ok" })),
            (Method::GET, "/version") => req.respond(200, &json!({ "version": env!("CARGO_PKG_VERSION"), "engine": "rredcot" })),
            (Method::POST, "/v1/chat/completions" | "/v1/completions") => {
                let started = req.received;
                let body = match std::mem::replace(&mut req.body, Ok(Vec::new())) {
                    Ok(b) => b,
                    Err(e) => {
                        req.respond(400, &error_body(&bad(format!("reading the request body: {e}"))));
                        return None;
                    }
                };
                let prepared = if path == "/v1/completions" { self.prepare_completion(&body) } else { self.prepare(&body) };
                match prepared {
                    Ok(p) => return Some(self.job(req, p, started)),
                    Err(e) => req.respond(e.status, &error_body(&e)),
                }
            }
            (_, "/v1/models" | "/health" | "/version" | "/v1/chat/completions" | "/v1/completions") => {
                req.respond(405, &error_body(&ApiError { status: 405, message: format!("method not allowed on {path}") }))
            }
            _ => req.respond(404, &error_body(&ApiError { status: 404, message: format!("no route {path}") })),
        }
        None
    }

    /// Reply kind, prompt ids, sampling params (`max_tokens` clamped to the context), n and seed
    /// of a chat body.
    fn prepare(&self, body: &[u8]) -> Result<Prepared, ApiError> {
        let chat = parse_chat(body, self.max_new_tokens)?;
        let prompt = self.tok.encode_chat(&chat.messages, true).map_err(|e| bad(format!("tokenizing the messages: {e}")))?;
        self.admit(Reply::Chat(chat.logprobs), prompt, chat.sampling, chat.n, chat.seed, chat.stream)
    }

    /// [`State::prepare`] for a `/v1/completions` body.
    fn prepare_completion(&self, body: &[u8]) -> Result<Prepared, ApiError> {
        let c = parse_completion(body, self.max_new_tokens)?;
        let prompt = match c.prompt {
            PromptInput::Text(t) => self.tok.encode(&t).map_err(|e| bad(format!("tokenizing the prompt: {e}")))?,
            PromptInput::Ids(ids) => ids,
        };
        let vocab = self.model.cfg.vocab_size;
        if let Some(t) = prompt.iter().chain(&c.sampling.stop_token_ids).find(|&&t| t >= vocab) {
            return Err(bad(format!("token id {t} is outside the model's vocabulary of {vocab}")));
        }
        self.admit(Reply::Completion(c.format), prompt, c.sampling, c.n, c.seed, c.stream)
    }

    /// Checks the prompt against the context, clamps `max_tokens` to it and draws a seed.
    fn admit(&self, reply: Reply, prompt: Vec<i64>, mut sampling: SamplingParams, n: usize, seed: Option<u64>, stream: Option<StreamOptions>) -> Result<Prepared, ApiError> {
        let context = self.model.cfg.max_position_embeddings as usize;
        if prompt.len() >= context {
            return Err(bad(format!("the prompt is {} tokens; the model's context is {context}", prompt.len())));
        }
        sampling.max_new_tokens = sampling.max_new_tokens.min(context - prompt.len());
        self.served.set(self.served.get() + 1);
        let seed = seed.unwrap_or_else(|| {
            let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
            t ^ self.served.get().wrapping_mul(0x9E37_79B9_7F4A_7C15)
        });
        Ok(Prepared { reply, prompt, sampling, n, seed, stream })
    }

    /// The reply's id: the same in every chunk of a streamed one.
    fn reply_id(&self, reply: Reply, seed: u64) -> String {
        match reply {
            Reply::Chat(_) => format!("chatcmpl-{:x}-{seed:x}", self.created),
            Reply::Completion(_) => format!("cmpl-{:x}-{seed:x}", self.created),
        }
    }

    /// The job of a prepared request. A streamed one is answered 200 at once, and a chat's choices
    /// get their first chunk (the role), as OpenAI's do.
    fn job(&self, req: Incoming, p: Prepared, started: Instant) -> Job {
        let answer = match p.stream {
            None => Answerer::Whole(req),
            Some(opts) => {
                let chat = matches!(p.reply, Reply::Chat(_));
                let chunks = Chunks { id: self.reply_id(p.reply, p.seed), created: now_s(), model: self.name.clone(), chat, include_usage: opts.include_usage };
                let sink = req.respond_events();
                if chat {
                    for i in 0..p.n {
                        sink.send(&chunks.role(i));
                    }
                }
                Answerer::Events(Events { sink, chunks, texts: (0..p.n).map(|_| TextStream::default()).collect() })
            }
        };
        Job { answer, reply: p.reply, prompt: p.prompt, sampling: p.sampling, n: p.n, seed: p.seed, started }
    }

    /// Choice `choice` of a job has `tokens` so far: a streamed job sends the text they add.
    /// False when the job's client has gone, so the choice stops decoding.
    fn progressed(&self, job: &mut Job, choice: usize, tokens: &[i64]) -> bool {
        if job.client_gone() {
            return false;
        }
        let Answerer::Events(ev) = &mut job.answer else { return true };
        let stops = &job.sampling.stop_strings;
        let hold = stops.iter().map(|s| s.chars().count()).max().unwrap_or(0).saturating_sub(1);
        match ev.texts[choice].advance(&self.tok, tokens, hold, stops) {
            Ok(Some(text)) => ev.sink.send(&ev.chunks.text(choice, &text)),
            Ok(None) => true,
            // The whole text is decoded again when the choice ends; what fails there fails the job.
            Err(e) => {
                tracing::warn!("decoding a streamed choice: {e}");
                true
            }
        }
    }

    /// Choice `choice` of a streamed job ended: sends the rest of its text and why it ended.
    fn stream_end(&self, job: &mut Job, choice: usize, g: &model::Generation) {
        let Answerer::Events(ev) = &mut job.answer else { return };
        let rest = ev.texts[choice].finish(g.text.as_deref().unwrap_or(""));
        ev.sink.send(&ev.chunks.end(choice, rest.as_deref(), g.finish_reason.as_str()));
    }

    /// Answers a job whose rows are all generated (choice i from `gens[i]`); a streamed one has
    /// sent its choices already and ends with the usage (if asked for) and `[DONE]`.
    fn answer(&self, job: Job, gens: Vec<model::Generation>) {
        let completion: usize = gens.iter().map(|g| g.tokens.len()).sum();
        let gone = job.client_gone();
        let request = match job.answer {
            Answerer::Events(ev) => {
                if ev.chunks.include_usage {
                    ev.sink.send(&ev.chunks.usage(job.prompt.len(), completion));
                }
                let how = if gone { "streamed until the client went away" } else { "streamed" };
                tracing::info!("{} ({how}): n={} {completion} tokens in {:.2}s", ev.chunks.id, job.n, job.started.elapsed().as_secs_f64());
                return ev.sink.done();
            }
            Answerer::Whole(request) => request,
        };
        let choices: Result<Vec<Value>, String> = gens.iter().enumerate().map(|(i, g)| self.choice(job.reply, &job.prompt, &job.sampling, i, g)).collect();
        let choices = match choices {
            Ok(c) => c,
            Err(msg) => return fail(Job { answer: Answerer::Whole(request), ..job }, &msg),
        };
        let id = self.reply_id(job.reply, job.seed);
        let object = if matches!(job.reply, Reply::Chat(_)) { "chat.completion" } else { "text_completion" };
        if gone {
            return tracing::info!("{object}: n={} {completion} tokens in {:.2}s; not sent, the client went away", job.n, job.started.elapsed().as_secs_f64());
        }
        let body = json!({
            "id": id,
            "object": object,
            "created": now_s(),
            "model": self.name,
            "choices": choices,
            "usage": {
                "prompt_tokens": job.prompt.len(),
                "completion_tokens": completion,
                "total_tokens": job.prompt.len() + completion,
            },
        });
        tracing::info!("{object}: n={} {completion} tokens in {:.2}s", job.n, job.started.elapsed().as_secs_f64());
        request.respond(200, &body);
    }

    /// The top `k` tokens (id, logprob) of each position of a choice under the distribution it
    /// was sampled from, from one prefill of the choice (none when `k` = 0).
    fn top_logprobs(&self, prompt: &[i64], sampling: &SamplingParams, g: &model::Generation, k: usize) -> Result<Vec<Vec<(i64, f32)>>, String> {
        if k == 0 {
            return Ok(vec![Vec::new(); g.tokens.len()]);
        }
        let f = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model::prefill_completion(&self.model, prompt, &g.tokens, sampling, k)))
            .map_err(|_| "the top-logprobs prefill panicked".to_string())?
            .map_err(|e| format!("the top-logprobs prefill failed: {e}"))?;
        Ok(f.top)
    }

    /// Token `t`'s text, special tokens written out.
    fn token_text(&self, t: i64) -> Result<String, String> {
        self.tok.decode(&[t], false).map_err(|e| format!("decoding token {t}: {e}"))
    }

    /// A chat choice's `logprobs` in OpenAI's shape: every sampled token (the stop token too) with
    /// the logprob it was drawn with and the top `k` of its position. `bytes` is null: a
    /// byte-level token may be part of a character, which its decoded text does not show.
    fn chat_logprobs(&self, prompt: &[i64], sampling: &SamplingParams, g: &model::Generation, k: usize) -> Result<Value, String> {
        let name = |t: i64| self.token_text(t);
        let top = self.top_logprobs(prompt, sampling, g, k)?;
        let content = g
            .tokens
            .iter()
            .zip(&g.logprobs)
            .zip(&top)
            .map(|((&t, &lp), pos)| {
                let top: Vec<Value> = pos.iter().map(|&(u, l)| Ok(json!({ "token": name(u)?, "logprob": l, "bytes": null }))).collect::<Result<_, String>>()?;
                Ok(json!({ "token": name(t)?, "logprob": lp, "bytes": null, "top_logprobs": top }))
            })
            .collect::<Result<Vec<Value>, String>>()?;
        Ok(json!({ "content": content, "refusal": null }))
    }

    /// Choice `i` of a reply to `prompt` sampled under `sampling`.
    fn choice(&self, reply: Reply, prompt: &[i64], sampling: &SamplingParams, i: usize, g: &model::Generation) -> Result<Value, String> {
        let text = g.text.clone().unwrap_or_default();
        let finish = g.finish_reason.as_str();
        let format = match reply {
            Reply::Completion(format) => format,
            Reply::Chat(logprobs) => {
                let logprobs = match logprobs {
                    Some(k) => self.chat_logprobs(prompt, sampling, g, k)?,
                    None => Value::Null,
                };
                return Ok(json!({ "index": i, "message": { "role": "assistant", "content": text }, "finish_reason": finish, "logprobs": logprobs }));
            }
        };
        let mut choice = json!({ "index": i, "text": text, "finish_reason": finish, "logprobs": null });
        if format.return_ids {
            choice["token_ids"] = json!(g.tokens);
        }
        if let Some(k) = format.logprobs {
            let name = |t: i64| -> Result<String, String> {
                if format.ids_as_tokens {
                    Ok(format!("token_id:{t}"))
                } else {
                    self.token_text(t)
                }
            };
            let top = self.top_logprobs(prompt, sampling, g, k)?;
            let tokens: Vec<String> = g.tokens.iter().map(|&t| name(t)).collect::<Result<_, _>>()?;
            let mut offsets = Vec::with_capacity(tokens.len());
            let mut at = 0usize;
            for (t, &id) in tokens.iter().zip(&g.tokens) {
                offsets.push(at);
                at += if format.ids_as_tokens { self.tok.decode(&[id], false).map(|s| s.chars().count()).unwrap_or(0) } else { t.chars().count() };
            }
            let mut top_json = Vec::with_capacity(top.len());
            for ((pos, &chosen), &lp) in top.iter().zip(&g.tokens).zip(&g.logprobs) {
                let mut m = serde_json::Map::new();
                for &(t, l) in pos {
                    m.insert(name(t)?, json!(l));
                }
                m.insert(name(chosen)?, json!(lp));
                top_json.push(Value::Object(m));
            }
            choice["logprobs"] = json!({ "tokens": tokens, "token_logprobs": g.logprobs, "top_logprobs": top_json, "text_offset": offsets });
        }
        Ok(choice)
    }
}

/// Answers a job with HTTP 500 (generation failed); a streamed one, answered 200 already, gets
/// the error as its last chunk before `[DONE]`, as vLLM sends it.
fn fail(job: Job, msg: &str) {
    tracing::error!("{msg}");
    let body = error_body(&ApiError { status: 500, message: msg.to_string() });
    match job.answer {
        Answerer::Whole(request) => request.respond(500, &body),
        Answerer::Events(ev) => {
            ev.sink.send(&body);
            ev.sink.done();
        }
    }
}

/// Runs the server until the process is stopped.
pub fn run(args: &ServeArgs) -> Result<()> {
    if args.threads > 0 {
        tch::set_num_threads(args.threads as i32);
    }
    let opts: LoadOptions = serde_json::from_value(json!({ "device": args.device, "dtype": args.dtype }))
        .with_context(|| format!("--device {} / --dtype {}", args.device, args.dtype))?;
    let loaded = model::load(&args.model, &opts).with_context(|| format!("loading {}", args.model.display()))?;
    let tok = loaded.tokenizer.with_context(|| format!("{}: no tokenizer.json next to the checkpoint", args.model.display()))?;
    let name = args.model_name.clone().unwrap_or_else(|| {
        let p = args.model.canonicalize().unwrap_or_else(|_| args.model.clone());
        p.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "model".into())
    });
    let server = Front::bind(&args.host, args.port, MAX_BODY)?;
    let addr = server.addr();
    let state = State {
        model: loaded.model,
        tok,
        name,
        created: now_s(),
        max_new_tokens: args.max_new_tokens,
        max_batch: args.max_batch,
        served: Cell::new(0),
    };
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "rredcot serve: model `{}` listening on http://{addr}/v1", state.name)?;
        out.flush()?;
    }
    // Requests waiting to generate, in arrival order.
    let mut queue: VecDeque<Job> = VecDeque::new();
    loop {
        if queue.is_empty() {
            let first = server.recv()?;
            queue.extend(state.route(first));
            // Requests sent together arrive over a few milliseconds: wait that long for the rest
            // (up to a batch of them) rather than start decoding one row alone. Later ones join
            // the decode as slots free up.
            while queue.len() < state.max_batch {
                match server.recv_timeout(GATHER)? {
                    Some(r) => queue.extend(state.route(r)),
                    None => break,
                }
            }
        }
        if !queue.is_empty() {
            session::run(&state, &server, &mut queue);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_bodies_parse_with_openai_defaults() {
        let b = parse_chat(br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#, 64).unwrap();
        assert_eq!(b.messages, vec![ChatMessage::new("user", "hi")]);
        assert_eq!((b.sampling.temperature, b.sampling.top_p, b.sampling.max_new_tokens, b.n, b.seed), (1.0, 1.0, 64, 1, None));
        let b = parse_chat(
            br#"{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"user","content":"q"}],
                "temperature":0,"top_p":0.9,"max_tokens":1000,"n":3,"seed":7,"stop":"\n\n","top_k":5}"#,
            64,
        )
        .unwrap();
        assert_eq!(b.messages[0], ChatMessage::new("system", "ab"));
        assert_eq!((b.sampling.temperature, b.sampling.top_p, b.sampling.top_k), (0.0, 0.9, 5));
        assert_eq!((b.sampling.max_new_tokens, b.n, b.seed), (64, 3, Some(7)));
        assert_eq!(b.sampling.stop_strings, vec!["\n\n".to_string()]);
        assert_eq!(b.stream, None);
        let streamed = |body: &[u8]| parse_chat(body, 64).unwrap().stream;
        assert_eq!(streamed(br#"{"messages":[{"role":"user","content":"q"}],"stream":true}"#), Some(StreamOptions { include_usage: false }));
        assert_eq!(
            streamed(br#"{"messages":[{"role":"user","content":"q"}],"stream":true,"stream_options":{"include_usage":true}}"#),
            Some(StreamOptions { include_usage: true })
        );
        assert_eq!(streamed(br#"{"messages":[{"role":"user","content":"q"}],"stream":false}"#), None);
        let logprobs = |body: &[u8]| parse_chat(body, 64).unwrap().logprobs;
        assert_eq!(logprobs(br#"{"messages":[{"role":"user","content":"q"}]}"#), None);
        assert_eq!(logprobs(br#"{"messages":[{"role":"user","content":"q"}],"logprobs":true}"#), Some(0));
        assert_eq!(logprobs(br#"{"messages":[{"role":"user","content":"q"}],"logprobs":true,"top_logprobs":3}"#), Some(3));
        // Fields at their do-nothing values are accepted (clients send them so).
        let inert = br#"{"messages":[{"role":"user","content":"q"}],"presence_penalty":0,"frequency_penalty":0.0,"logit_bias":{},
                         "tools":[],"tool_choice":"none","response_format":{"type":"text"},"user":"u","min_p":0,"repetition_penalty":1}"#;
        assert!(parse_chat(inert, 64).is_ok());
    }

    #[test]
    fn completion_bodies_take_token_ids_or_text_and_logprob_options() {
        let b = parse_completion(br#"{"model":"m","prompt":[5,6,7],"n":4,"seed":18446744073709551615,"logprobs":0,"return_tokens_as_token_ids":true,"stop_token_ids":[2]}"#, 64).unwrap();
        assert_eq!((b.prompt, b.n, b.seed), (PromptInput::Ids(vec![5, 6, 7]), 4, Some(u64::MAX)));
        assert_eq!(b.format, CompletionFormat { logprobs: Some(0), ids_as_tokens: true, return_ids: false });
        assert_eq!(b.sampling.stop_token_ids, vec![2]);
        assert_eq!(parse_completion(br#"{"prompt":[[5,6]],"return_token_ids":true}"#, 64).unwrap().prompt, PromptInput::Ids(vec![5, 6]));
        // vLLM's signed seeds: the same 64 bits.
        assert_eq!(parse_completion(br#"{"prompt":[1],"seed":-1}"#, 64).unwrap().seed, Some(u64::MAX));
        assert_eq!(parse_completion(br#"{"prompt":[1],"seed":-9223372036854775808}"#, 64).unwrap().seed, Some(1 << 63));
        let b = parse_completion(br#"{"prompt":"2+2=","max_tokens":3,"logprobs":5}"#, 64).unwrap();
        assert_eq!((b.prompt, b.sampling.max_new_tokens, b.format.logprobs), (PromptInput::Text("2+2=".into()), 3, Some(5)));
        for (body, want) in [
            (&br#"{"n":2}"#[..], "`prompt` is required"),
            (br#"{"prompt":[]}"#, "empty"),
            (br#"{"prompt":[[1],[2]]}"#, "one prompt per request"),
            (br#"{"prompt":[1,-2]}"#, "token ids"),
            (br#"{"prompt":[1],"logprobs":50}"#, "logprobs"),
            (br#"{"prompt":[1],"echo":true}"#, "echo"),
            (br#"{"prompt":[1],"return_tokens_as_token_ids":"yes"}"#, "boolean"),
            (br#"{"prompt":[1],"seed":1.5}"#, "64-bit integer"),
            (br#"{"prompt":[1],"stream":true,"logprobs":0}"#, "`logprobs` is not supported with stream = true"),
            (br#"{"prompt":[1],"stream":true,"return_token_ids":true}"#, "`return_token_ids` is not supported with stream"),
        ] {
            let e = parse_completion(body, 16).unwrap_err();
            assert!(e.status == 400 && e.message.contains(want), "{}: {}", String::from_utf8_lossy(body), e.message);
        }
    }

    #[test]
    fn bad_bodies_are_400_with_a_reason() {
        let cases: &[(&[u8], &str)] = &[
            (b"{not json", "not JSON"),
            (b"[1]", "JSON object"),
            (br#"{"messages":[]}"#, "empty"),
            (br#"{"model":"m"}"#, "`messages`"),
            (br#"{"messages":[{"role":"robot","content":"x"}]}"#, "robot"),
            (br#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#, "temperature"),
            (br#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#, "top_p"),
            (br#"{"messages":[{"role":"user","content":"x"}],"n":100}"#, "n = 100"),
            (br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#, "`stream` must be a boolean"),
            (br#"{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#, "only allowed with stream = true"),
            (br#"{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":1}}"#, "include_usage"),
            (br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#, "max_tokens"),
            (br#"{"messages":[{"role":"user","content":{"a":1}}]}"#, "content"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logprobs":1}"#, "`logprobs` must be a boolean"),
            (br#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#, "needs logprobs = true"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}"#, "top_logprobs"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"stream":true}"#, "not supported with stream"),
            // What would change the generation and is not done here is refused, not ignored.
            (br#"{"messages":[{"role":"user","content":"x"}],"presence_penalty":0.5}"#, "`presence_penalty` is not supported"),
            (br#"{"messages":[{"role":"user","content":"x"}],"repetition_penalty":1.1}"#, "`repetition_penalty`"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":-100}}"#, "`logit_bias`"),
            (br#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#, "`tools`"),
            (br#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}"#, "`response_format`"),
            (br#"{"messages":[{"role":"user","content":"x"}],"guided_json":{}}"#, "`guided_json`"),
        ];
        for (body, want) in cases {
            let e = parse_chat(body, 16).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains(want), "{}: {}", String::from_utf8_lossy(body), e.message);
            assert_eq!(error_body(&e)["error"]["type"], "invalid_request_error");
        }
    }
}
