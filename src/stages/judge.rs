//! `judge`: the LLM judge ensemble over an OpenAI-compatible `/v1/chat/completions` server
//! (vLLM, llama.cpp's server, `rredcot serve`, a hosted API). Fills `correct_judge` of every
//! `eval` row by majority over templates × samples and writes one `judgments` row per vote.
//!
//! [`prepare`] and [`finish`] are shared with `judge_local` (the same ensemble on the local model
//! core, in the worker): the stages differ only in how a reply is obtained.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::artifact::rows::EvalRow;
use crate::artifact::{read_batches, read_rows, write_batch, write_rows, Schema};
use crate::engine::{Builtin, Executable, StageContext};
use crate::judge::cache::ResponseCache;
use crate::judge::http::{ChatClient, ChatRequest, HttpConfig, Stats};
use crate::judge::{aggregate, plan_votes, templates, JudgmentRow, PlanOptions, Template, Vote};

/// The eval rows and the votes to ask for.
pub struct Prepared {
    pub rows: Vec<EvalRow>,
    pub templates: Vec<Template>,
    pub votes: Vec<Vote>,
}

/// The params of stage `judge` (stages/judge.toml documents them); unknown or mistyped ones are
/// errors naming the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JudgeParams {
    url: String,
    model: String,
    api_key_env: String,
    templates: Vec<String>,
    samples: usize,
    seed: u64,
    temperature: f64,
    top_p: f64,
    max_tokens: u64,
    system: String,
    max_response_chars: usize,
    timeout_s: f64,
    retries: u32,
    backoff_s: f64,
    max_backoff_s: f64,
    concurrency: usize,
    cache: bool,
}

/// Reads the `eval` input and plans the votes from the params both judge stages share
/// (`templates`, `samples`, `seed`, `system`, `max_response_chars`).
pub fn prepare(ctx: &StageContext, templates: &[String], opts: PlanOptions) -> Result<Prepared> {
    let templates = templates::resolve(templates).with_context(|| format!("stage `{}`", ctx.instance))?;
    if opts.samples == 0 {
        bail!("stage `{}`: samples must be positive", ctx.instance);
    }
    let rows: Vec<EvalRow> = read_rows(ctx.input("eval")?, Schema::Eval)?;
    let votes = plan_votes(&rows, &templates, &opts);
    Ok(Prepared {
        rows,
        templates,
        votes,
    })
}

/// Aggregates the replies (`replies[i]` answers `votes[i]`) and writes both outputs, the counters
/// and the metrics.
pub fn finish(ctx: &mut StageContext, prepared: Prepared, replies: &[String]) -> Result<()> {
    let agg = aggregate(prepared.rows, &prepared.templates, &prepared.votes, replies);
    for (k, v) in &agg.counts {
        ctx.count(k, *v);
    }
    for (k, v) in agg.metrics {
        ctx.metric(&k, v);
    }
    write_rows(ctx.output("eval")?, Schema::Eval, &agg.rows)?;
    write_judgments(ctx.output("judgments")?, &agg.judgments)
}

/// The `judgments` table with its columns fixed by [`JudgmentRow`] (also when there are no votes).
fn write_judgments(path: &std::path::Path, rows: &[JudgmentRow]) -> Result<()> {
    use serde_arrow::schema::{SchemaLike, TracingOptions};
    let fields =
        Vec::<arrow::datatypes::FieldRef>::from_type::<JudgmentRow>(TracingOptions::default())?;
    let batch = serde_arrow::to_record_batch(&fields, &rows)?;
    write_batch(path, &batch).with_context(|| format!("writing {}", path.display()))
}

/// Reads a `judgments` table back (for reports and tests).
pub fn read_judgments(path: &std::path::Path) -> Result<Vec<JudgmentRow>> {
    let batch = read_batches(path)?;
    serde_arrow::from_record_batch(&batch)
        .with_context(|| format!("{}: not a judgments table", path.display()))
}

/// The OpenAI request body of a vote.
pub fn request_body(
    model: &str,
    vote: &Vote,
    temperature: f64,
    top_p: f64,
    max_tokens: u64,
) -> serde_json::Value {
    json!({
        "model": model,
        "messages": vote.messages,
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "seed": vote.seed,
    })
}

pub const STAGE: Builtin = Builtin { name: "judge", version: "1", runs_in: Executable::Engine, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: JudgeParams = ctx.params()?;
    let opts = PlanOptions { samples: p.samples, seed: p.seed, system: p.system.clone(), max_response_chars: p.max_response_chars };
    let prepared = prepare(ctx, &p.templates, opts)?;
    let model = p.model.clone();
    let (temperature, top_p, max_tokens) = (p.temperature, p.top_p, p.max_tokens);
    let key_env = p.api_key_env.clone();
    // The key itself never enters params (they are part of the key and the run record).
    let api_key = (!key_env.is_empty())
        .then(|| std::env::var(&key_env).ok())
        .flatten()
        .filter(|k| !k.is_empty());
    let secs = |name: &str, s: f64| -> Result<Duration> {
        Duration::try_from_secs_f64(s)
            .with_context(|| format!("stage `{}`: param `{name}` = {s}", ctx.instance))
    };
    let client = ChatClient::new(HttpConfig {
        url: p.url.clone(),
        api_key,
        timeout: secs("timeout_s", p.timeout_s)?,
        retries: p.retries,
        backoff: secs("backoff_s", p.backoff_s)?,
        max_backoff: secs("max_backoff_s", p.max_backoff_s)?,
        concurrency: p.concurrency,
    })?;
    let cache = if p.cache {
        Some(ResponseCache::open(&ctx.cache_dir.join("judge"))?)
    } else {
        None
    };

    let requests: Vec<ChatRequest> = prepared
        .votes
        .iter()
        .map(|v| {
            let row = &prepared.rows[v.row];
            let body = request_body(&model, v, temperature, top_p, max_tokens);
            let label = format!(
                "prompt {} sample {}, template {}, vote {}; request {}",
                row.prompt_id,
                row.sample_idx,
                prepared.templates[v.template].name,
                v.vote,
                &ResponseCache::key(&client.cache_request(&body))[..12]
            );
            ChatRequest { body, label }
        })
        .collect();
    let progress = Mutex::new(ctx.progress(
        requests.len() as u64,
        &format!("judge votes ({})", client.endpoint()),
    ));
    let stats = Stats::default();
    let result = client.complete_all(cache.as_ref(), &requests, &stats, &|| {
        progress.lock().expect("progress").inc(1)
    });
    progress.into_inner().expect("progress").finish();
    for (name, c) in [
        ("http_calls", &stats.http_calls),
        ("retries", &stats.retries),
        ("cache_hits", &stats.cache_hits),
        ("cache_corrupt", &stats.cache_corrupt),
        ("completion_tokens", &stats.completion_tokens),
    ] {
        ctx.count(name, Stats::get(c));
    }
    let replies = result.with_context(|| {
        format!(
            "stage `{}`: judging {} votes ({} cached, {} HTTP calls so far; replies received are kept in {} and a rerun continues from them)",
            ctx.instance,
            requests.len(),
            Stats::get(&stats.cache_hits),
            Stats::get(&stats.http_calls),
            ctx.cache_dir.join("judge").display()
        )
    })?;
    finish(ctx, prepared, &replies)
}
