//! `rredcot serve`: an OpenAI-compatible HTTP server over the model core, so the `judge` stage (or
//! any OpenAI client) can use a trained checkpoint or a GGUF model.
//!
//! Endpoints: `POST /v1/chat/completions` (`messages`, `temperature`, `top_p`, `top_k`,
//! `max_tokens` / `max_completion_tokens`, `n`, `seed`, `stop`, `stop_token_ids`, `stream`,
//! `stream_options.include_usage`, `logprobs` + `top_logprobs`), `POST /v1/completions` (the same, with `prompt` as a string or
//! a list of token ids, plus `logprobs` = how many top tokens per position,
//! `return_tokens_as_token_ids` (tokens as `"token_id:123"`, as vLLM writes them) and
//! `return_token_ids` (each choice's `token_ids`); streamed, those come whole in a choice's last chunk),
//! `GET /v1/models`, `GET /version`, `GET /health`, and SGLang's `POST /update_weights_from_disk`
//! (`model_path`: another checkpoint, loaded once no request is generating; the served name
//! stays; what a stage whose `reload = "sglang"` calls), and SGLang's `POST
//! /release_memory_occupation` and `POST /resume_memory_occupation` (the weights dropped and the
//! memory given back while a kept engine waits for the next step; after the resume a checkpoint
//! must be loaded before sampling, as SGLang's weights are undefined then: what a stage whose
//! `sleep = true` calls). Both take vLLM's `ignore_eos`,
//! `skip_special_tokens` and `include_stop_str_in_output`; a chat also `add_generation_prompt` and
//! `chat_template_kwargs.enable_thinking`. Responses have OpenAI's shapes; a streamed one is
//! OpenAI's server-sent chunks ([`stream`]); a bad request gets HTTP 400 with an OpenAI-style
//! `{"error": {...}}` body, never a crash, and so does a field this server would have to ignore
//! (penalties, `logit_bias`, tools, a JSON `response_format`, vLLM's `min_tokens`, beam search,
//! ...: [`request`]).
//!
//! A completion's `token_logprobs` are those the sampler drew from (softmax(logits / T) after
//! top-k and top-p, as the built-in rollout records them); its `top_logprobs` come from one
//! prefill of the finished completion under that same distribution (only when `logprobs` > 0).
//!
//! One model, one generating thread: requests that arrive while others generate wait in the
//! front's queue and are taken together next time, generated together in `--max-batch` slots
//! (each row with its own budget, stop rules and sampling distribution: [`session`]), a finished
//! row's slot taking the next waiting row (continuous batching, as the built-in rollout). Choice i of a request samples with seed `seed + i` (vLLM's
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
mod request;
mod session;
mod stream;

use front::{EventSink, Front, Incoming};
use request::{parse_chat, parse_completion, ApiError, CompletionFormat, OutputOptions, PromptInput};
use request::{bad, error_body};
use stream::{Chunks, StreamOptions, TextStream};

use crate::model::{self, DecoderLm, LoadOptions, SamplingParams, Tokenizer};

/// Largest request body read (bytes).
const MAX_BODY: usize = 16 << 20;
/// How long the server waits for more requests to batch with the first one.
const GATHER: std::time::Duration = std::time::Duration::from_millis(5);

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
    output: OutputOptions,
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

/// A streamed job's sink, its chunks' builder, each choice's text, and why it failed after it
/// began (its other choices stop; the error is its last chunk).
struct Events {
    sink: EventSink,
    chunks: Chunks,
    texts: Vec<TextStream>,
    failed: Option<String>,
}

/// A request checked and tokenized.
struct Prepared {
    reply: Reply,
    prompt: Vec<i64>,
    sampling: SamplingParams,
    n: usize,
    seed: u64,
    stream: Option<StreamOptions>,
    output: OutputOptions,
}

/// A request that changes what the engine holds, applied in arrival order once no request
/// generates.
enum Admin {
    /// `POST /update_weights_from_disk`: the checkpoint at this path.
    Load(std::path::PathBuf),
    /// `POST /release_memory_occupation`: drop the weights, give the memory back.
    Release,
    /// `POST /resume_memory_occupation`: ready to load again.
    Resume,
}

struct State {
    /// `None` from a release until the next checkpoint is loaded: no request is admitted then.
    model: Option<DecoderLm>,
    /// The loaded model's context window (still listed while the weights are released).
    context: usize,
    tok: Tokenizer,
    /// How the model was loaded (a checkpoint loaded later is loaded the same way).
    load: LoadOptions,
    /// Released and not resumed since: a load is refused until the resume, as on SGLang.
    released: bool,
    /// Admin requests waiting for the requests taken before them.
    admin: std::cell::RefCell<VecDeque<(Incoming, Admin)>>,
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
    /// The model; only called for admitted requests, and none is admitted while the weights are
    /// released.
    fn model(&self) -> &DecoderLm {
        self.model.as_ref().expect("no request is admitted while the weights are released")
    }

    /// Answers what needs no generation; returns the chat jobs.
    fn route(&self, mut req: Incoming) -> Option<Job> {
        let path = req.path.trim_end_matches('/').to_string();
        let method = req.method.clone();
        match (method, path.as_str()) {
            (Method::GET, "/v1/models") => {
                let body = json!({ "object": "list", "data": [
                    { "id": self.name, "object": "model", "created": self.created, "owned_by": "rredcot", "root": self.name, "parent": null,
                      "max_model_len": self.context }
                ]});
                req.respond(200, &body);
            }
            (Method::GET, "/health") => req.respond(200, &json!({ "status": "ok" })),
            (Method::POST, "/update_weights_from_disk") => {
                let path = req.body.as_ref().ok().and_then(|b| serde_json::from_slice::<Value>(b).ok()).and_then(|v| v.get("model_path")?.as_str().map(std::path::PathBuf::from));
                match path {
                    Some(path) => self.admin.borrow_mut().push_back((req, Admin::Load(path))),
                    None => req.respond(400, &json!({ "success": false, "message": "the body must be JSON with a string model_path" })),
                }
            }
            (Method::POST, "/release_memory_occupation") => self.admin.borrow_mut().push_back((req, Admin::Release)),
            (Method::POST, "/resume_memory_occupation") => self.admin.borrow_mut().push_back((req, Admin::Resume)),
            (Method::GET, "/version") => req.respond(200, &json!({ "version": env!("CARGO_PKG_VERSION"), "engine": "rredcot" })),
            (Method::POST, "/v1/chat/completions" | "/v1/completions") if self.model.is_none() => {
                // Not a 5xx: a client would retry it, and nothing changes until a checkpoint loads.
                let why = if self.released { "the engine's memory is released (POST /resume_memory_occupation, then load a checkpoint)" } else { "the weights were released and no checkpoint was loaded since (POST /update_weights_from_disk)" };
                req.respond(409, &error_body(&ApiError { status: 409, message: why.into() }));
            }
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
            (_, "/v1/models" | "/health" | "/version" | "/v1/chat/completions" | "/v1/completions" | "/update_weights_from_disk" | "/release_memory_occupation" | "/resume_memory_occupation") => {
                req.respond(405, &error_body(&ApiError { status: 405, message: format!("method not allowed on {path}") }))
            }
            _ => req.respond(404, &error_body(&ApiError { status: 404, message: format!("no route {path}") })),
        }
        None
    }

    /// Reply kind, prompt ids, sampling params (`max_tokens` clamped to the context), n, seed and
    /// output options of a chat body.
    fn prepare(&self, body: &[u8]) -> Result<Prepared, ApiError> {
        let chat = parse_chat(body, self.max_new_tokens)?;
        self.check_model(chat.model.as_deref())?;
        let prompt = self
            .tok
            .encode_chat_thinking(&chat.messages, chat.add_generation_prompt, chat.enable_thinking)
            .map_err(|e| bad(format!("tokenizing the messages: {e}")))?;
        let p = self.admit(Reply::Chat(chat.logprobs), prompt, chat.sampling, chat.n, chat.seed, chat.stream)?;
        Ok(Prepared { output: chat.output, ..p })
    }

    /// [`State::prepare`] for a `/v1/completions` body.
    fn prepare_completion(&self, body: &[u8]) -> Result<Prepared, ApiError> {
        let c = parse_completion(body, self.max_new_tokens)?;
        self.check_model(c.model.as_deref())?;
        let prompt = match c.prompt {
            PromptInput::Text(t) => self.tok.encode(&t).map_err(|e| bad(format!("tokenizing the prompt: {e}")))?,
            PromptInput::Ids(ids) => ids,
        };
        let vocab = self.model().cfg.vocab_size;
        if let Some(t) = prompt.iter().chain(&c.sampling.stop_token_ids).find(|&&t| t >= vocab) {
            return Err(bad(format!("token id {t} is outside the model's vocabulary of {vocab}")));
        }
        let p = self.admit(Reply::Completion(c.format), prompt, c.sampling, c.n, c.seed, c.stream)?;
        Ok(Prepared { output: c.output, ..p })
    }

    /// A request for another model than the one served is answered 404, as by OpenAI and vLLM,
    /// rather than by this one.
    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.name => Err(ApiError { status: 404, message: format!("The model `{m}` does not exist (this server serves `{}`).", self.name) }),
            _ => Ok(()),
        }
    }

    /// Checks the prompt against the context, clamps `max_tokens` to it and draws a seed (the
    /// output options are the defaults: the caller sets the body's).
    fn admit(&self, reply: Reply, prompt: Vec<i64>, mut sampling: SamplingParams, n: usize, seed: Option<u64>, stream: Option<StreamOptions>) -> Result<Prepared, ApiError> {
        let context = self.context;
        if prompt.len() >= context {
            return Err(bad(format!("the prompt is {} tokens; the model's context is {context}", prompt.len())));
        }
        sampling.max_new_tokens = sampling.max_new_tokens.min(context - prompt.len());
        self.served.set(self.served.get() + 1);
        let seed = seed.unwrap_or_else(|| {
            let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
            t ^ self.served.get().wrapping_mul(0x9E37_79B9_7F4A_7C15)
        });
        Ok(Prepared { reply, prompt, sampling, n, seed, stream, output: OutputOptions::default() })
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
                let texts = (0..p.n).map(|_| TextStream::new(p.output.skip_special_tokens)).collect();
                Answerer::Events(Events { sink, chunks, texts, failed: None })
            }
        };
        Job { answer, reply: p.reply, prompt: p.prompt, sampling: p.sampling, n: p.n, seed: p.seed, output: p.output, started }
    }

    /// Choice `choice` of a job has `tokens` so far: a streamed job sends the text they add.
    /// False when the job's client has gone, so the choice stops decoding.
    fn progressed(&self, job: &mut Job, choice: usize, tokens: &[i64]) -> bool {
        if job.client_gone() {
            return false;
        }
        let Answerer::Events(ev) = &mut job.answer else { return true };
        if ev.failed.is_some() {
            return false;
        }
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

    /// Choice `choice` of a streamed job ended: sends the rest of its text and why it ended, with
    /// its logprobs and token ids when asked for. Those come whole in this last chunk: top
    /// logprobs come from a prefill of the finished choice, and the text pieces before were cut
    /// where the text allows, not at token boundaries.
    fn stream_end(&self, job: &mut Job, choice: usize, g: &model::Generation) {
        let Answerer::Events(ev) = &mut job.answer else { return };
        // No prefill for logprobs that no one would read.
        if ev.failed.is_some() || ev.sink.is_gone() {
            return;
        }
        let text = self.choice_text(job.output, &job.sampling.stop_strings, g).unwrap_or_else(|e| {
            tracing::warn!("{e}");
            g.text.clone().unwrap_or_default()
        });
        let logprobs = match self.logprobs(job.reply, &job.prompt, &job.sampling, g) {
            Ok(l) => l,
            Err(e) => return ev.failed = Some(e),
        };
        let token_ids = token_ids(job.reply, g);
        let rest = ev.texts[choice].finish(&text);
        ev.sink.send(&ev.chunks.end(choice, rest.as_deref(), g.finish_reason.as_str(), logprobs, token_ids));
    }

    /// Answers a job whose rows are all generated (choice i from `gens[i]`); a streamed one has
    /// sent its choices already and ends with the usage (if asked for) and `[DONE]`.
    fn answer(&self, job: Job, gens: Vec<model::Generation>) {
        let completion: usize = gens.iter().map(|g| g.tokens.len()).sum();
        let gone = job.client_gone();
        let request = match job.answer {
            Answerer::Events(ev) => {
                if let Some(msg) = ev.failed.clone() {
                    return fail(Job { answer: Answerer::Events(ev), ..job }, &msg);
                }
                if ev.chunks.include_usage {
                    ev.sink.send(&ev.chunks.usage(job.prompt.len(), completion));
                }
                let how = if gone { "streamed until the client went away" } else { "streamed" };
                tracing::info!("{} ({how}): n={} {completion} tokens in {:.2}s", ev.chunks.id, job.n, job.started.elapsed().as_secs_f64());
                return ev.sink.done();
            }
            Answerer::Whole(request) => request,
        };
        let choices: Result<Vec<Value>, String> = gens.iter().enumerate().map(|(i, g)| self.choice(job.reply, &job.prompt, &job.sampling, job.output, i, g)).collect();
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
        let f = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model::prefill_completion(self.model(), prompt, &g.tokens, sampling, k)))
            .map_err(|_| "the top-logprobs prefill panicked".to_string())?
            .map_err(|e| format!("the top-logprobs prefill failed: {e}"))?;
        Ok(f.top)
    }

    /// A choice's text as its request asked: the generation's own (special tokens left out, cut
    /// before the stop string that ended it) unless `skip_special_tokens` is false or
    /// `include_stop_str_in_output` true; then decoded again so, and cut before (or after) the
    /// stop string that starts first (the first listed of those starting there).
    fn choice_text(&self, output: OutputOptions, stops: &[String], g: &model::Generation) -> Result<String, String> {
        if output.skip_special_tokens && !output.include_stop_str {
            return Ok(g.text.clone().unwrap_or_default());
        }
        let mut text = self.tok.decode(&g.tokens, output.skip_special_tokens).map_err(|e| format!("decoding a choice: {e}"))?;
        if let Some((at, stop)) = stops.iter().filter_map(|s| text.find(s.as_str()).map(|at| (at, s))).min_by_key(|&(at, _)| at) {
            text.truncate(if output.include_stop_str { at + stop.len() } else { at });
        }
        Ok(text)
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
    fn choice(&self, reply: Reply, prompt: &[i64], sampling: &SamplingParams, output: OutputOptions, i: usize, g: &model::Generation) -> Result<Value, String> {
        let text = self.choice_text(output, &sampling.stop_strings, g)?;
        let finish = g.finish_reason.as_str();
        let logprobs = self.logprobs(reply, prompt, sampling, g)?.unwrap_or(Value::Null);
        if let Reply::Chat(_) = reply {
            return Ok(json!({ "index": i, "message": { "role": "assistant", "content": text }, "finish_reason": finish, "logprobs": logprobs }));
        }
        let mut choice = json!({ "index": i, "text": text, "finish_reason": finish, "logprobs": logprobs });
        if let Some(ids) = token_ids(reply, g) {
            choice["token_ids"] = json!(ids);
        }
        Ok(choice)
    }

    /// A choice's `logprobs` as its reply shows them, `None` when not asked for: a chat's
    /// (`content`, `refusal`), a completion's (`tokens`, `token_logprobs`, `top_logprobs`,
    /// `text_offset`).
    fn logprobs(&self, reply: Reply, prompt: &[i64], sampling: &SamplingParams, g: &model::Generation) -> Result<Option<Value>, String> {
        match reply {
            Reply::Chat(Some(k)) => self.chat_logprobs(prompt, sampling, g, k).map(Some),
            Reply::Completion(format @ CompletionFormat { logprobs: Some(k), .. }) => self.completion_logprobs(format, prompt, sampling, g, k).map(Some),
            _ => Ok(None),
        }
    }

    /// A completion choice's `logprobs`: its tokens (or `token_id:N` names), the logprob each was
    /// drawn with, the top `k` of each position with the chosen token, and each token's offset in
    /// the text.
    fn completion_logprobs(&self, format: CompletionFormat, prompt: &[i64], sampling: &SamplingParams, g: &model::Generation, k: usize) -> Result<Value, String> {
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
        Ok(json!({ "tokens": tokens, "token_logprobs": g.logprobs, "top_logprobs": top_json, "text_offset": offsets }))
    }
}

/// A choice's `token_ids`, when its reply asked for them (a completion's `return_token_ids`).
fn token_ids(reply: Reply, g: &model::Generation) -> Option<&[i64]> {
    matches!(reply, Reply::Completion(CompletionFormat { return_ids: true, .. })).then_some(g.tokens.as_slice())
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

impl State {
    /// Applies an admin request, answering it as SGLang does (`success` and `message`; HTTP 400
    /// when it cannot be done).
    fn apply(&mut self, req: Incoming, admin: Admin) {
        let refuse = |req: Incoming, message: &str| req.respond(400, &json!({ "success": false, "message": message }));
        match admin {
            Admin::Load(_) if self.released => refuse(req, "the engine's memory is released: POST /resume_memory_occupation before loading a checkpoint"),
            Admin::Load(path) => self.load_weights(req, &path),
            Admin::Release if self.released => refuse(req, "the engine's memory is released already"),
            Admin::Release => {
                // The CUDA caching allocator's reserved bytes before and after (`None` on the CPU or
                // in a build without the CUDA shim), so a client can see what went back.
                let on_cuda = self.model.as_ref().is_some_and(|m| m.device().is_cuda());
                let reserved = || if on_cuda { model::cuda_graph::memory_reserved() } else { None };
                let before = reserved();
                let bytes: i64 = self.model.take().map_or(0, |m| m.sorted_variables().iter().map(|(_, t)| t.numel() as i64 * t.kind().elt_size_in_bytes() as i64).sum());
                self.released = true;
                // The freed tensors' blocks go back to the system (CPU cache) and the driver (CUDA).
                let given_back = crate::stages::release_cached_memory();
                let after = reserved();
                tracing::info!("released the weights ({:.1} MB); cached memory given back: {given_back}; CUDA reserved {before:?} -> {after:?}", bytes as f64 / 1e6);
                req.respond(200, &json!({ "success": true, "message": format!("released {bytes} bytes of weights"), "weight_bytes": bytes, "cuda_memory_reserved_before": before, "cuda_memory_reserved_after": after }));
            }
            Admin::Resume if !self.released => refuse(req, "the engine's memory is not released"),
            Admin::Resume => {
                self.released = false;
                req.respond(200, &json!({ "success": true, "message": "resumed; the weights were not kept: load a checkpoint before sampling" }));
            }
        }
    }

    /// Replaces the model with the checkpoint at `path` (and its tokenizer), answering `req` as
    /// SGLang does; a checkpoint that fails to load leaves the old model serving (or none, after
    /// a release).
    fn load_weights(&mut self, req: Incoming, path: &std::path::Path) {
        let t0 = Instant::now();
        let loaded = model::load(path, &self.load)
            .with_context(|| format!("loading {}", path.display()))
            .and_then(|l| Ok((l.model, l.tokenizer.with_context(|| format!("{}: no tokenizer.json next to the checkpoint", path.display()))?)));
        match loaded {
            Ok((model, tok)) => {
                self.context = model.cfg.max_position_embeddings as usize;
                self.model = Some(model);
                self.tok = tok;
                tracing::info!("loaded {} in {:.2} s", path.display(), t0.elapsed().as_secs_f64());
                req.respond(200, &json!({ "success": true, "message": format!("loaded {}", path.display()), "num_paused_requests": 0 }));
            }
            Err(e) => req.respond(400, &json!({ "success": false, "message": format!("{e:#}") })),
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
    let mut state = State {
        context: loaded.model.cfg.max_position_embeddings as usize,
        model: Some(loaded.model),
        tok,
        load: opts,
        released: false,
        admin: std::cell::RefCell::new(VecDeque::new()),
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
            let admin = state.admin.borrow_mut().pop_front();
            if let Some((req, admin)) = admin {
                state.apply(req, admin);
                continue;
            }
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
