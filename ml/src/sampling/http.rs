//! The `http` sampling backend: completions from an OpenAI-compatible inference engine (vLLM,
//! SGLang, `rredcot serve`) instead of the model core, for every stage that samples (rollout,
//! eval, MC values, resets' continuations; see [`super::sample_seeded`]).
//!
//! The engine follows the policy: with `server_command` the stage starts it over the input
//! checkpoint (placeholders `{policy}`, `{policy_hash}`, `{port}`, `{seed}`, `{rredcot}`), waits
//! until `/v1/models` answers, samples, and stops it (SIGTERM, then SIGKILL after a grace period).
//! The engine runs in a process group of its own whose guardian (`rredcot::engine::group`) kills
//! it when this process dies, also by SIGKILL: no orphan engine. Without a command the stage uses
//! the running server at `base_url`. Either way `/v1/models` must list `served_model` (default
//! `{policy_hash}`: start the engine with `--served-model-name {policy_hash}`): samples from
//! another model are an error, never silent off-policy data.
//!
//! Requests: `/v1/completions` with the prompt as token ids, one request per row with the row's
//! seed and `n = 1` — or, for consecutive rows of one prompt whose seeds are `s, s+1, …`, one
//! request with `seed = s` and `n` choices (choice i samples with seed `s + i` in vLLM and
//! `rredcot serve`). Token ids come back as each choice's `token_ids` (`return_token_ids`) or as
//! `"token_id:123"` tokens (`return_tokens_as_token_ids`); a server that returns text only is
//! refused by a probe ([`HttpSampler::probe`]) before any sampling. The completion text is decoded here from the
//! ids with the policy's tokenizer, exactly as the built-in sampler does, so both backends write
//! the same rows for the same tokens.
//!
//! With `reload` (`"sglang"`, `"vllm"`), an engine the stage started is not stopped at its end but
//! kept by this process (a warm stage process runs one stage after another): the next stage that
//! would start the same `server_command` loads its checkpoint into the running engine instead
//! (SGLang's and `rredcot serve`'s `POST /update_weights_from_disk`; vLLM's `POST /collective_rpc`
//! `reload_weights`, then `POST /reset_prefix_cache`, so no KV block computed under the old
//! weights is reused), and a training chain starts its engine once, not once per step. With
//! `"vllm"` the engine is given untied views of tied checkpoints ([`super::untied`]).
//!
//! This module knows OpenAI's wire format and processes; nothing of stages' outputs.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use rredcot::engine::group::{die_with_parent, Group};
use rredcot::engine::StageContext;
use serde_json::{json, Value};

use crate::model::{FinishReason, SamplingParams};

/// Most choices asked for in one request (`rredcot serve` caps `n` at 16).
const MAX_N: usize = 16;
/// The seed and most tokens of [`HttpSampler::probe`]'s two requests.
const SEED_PROBE: u64 = 20_261_129;
const PROBE_TOKENS: usize = 16;
/// How long a stopped engine gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// The pause between looks at something about to happen (an engine that exits at SIGTERM, one
/// that starts answering): 2 ms at first, doubling up to 50 ms, so a quick event costs a stage a
/// few milliseconds rather than a fixed 50 ms poll's 25 on average, and a slow one few looks.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(2);
    const MOST: Duration = Duration::from_millis(50);

    fn new() -> Backoff {
        Backoff(Self::FIRST)
    }

    fn wait(&mut self) {
        std::thread::sleep(self.0);
        self.0 = (self.0 * 2).min(Self::MOST);
    }
}

/// Which sampler a stage uses (param `backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The model core in this process.
    Local,
    /// An OpenAI-compatible engine.
    Http,
}

/// How an engine kept from an earlier stage loads the next checkpoint (param `reload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reload {
    /// Never: the engine is started and stopped with each stage.
    #[default]
    None,
    /// `POST /update_weights_from_disk {"model_path"}` (SGLang; `rredcot serve`).
    Sglang,
    /// `POST /collective_rpc` with `reload_weights` from the checkpoint, then
    /// `POST /reset_prefix_cache` (vLLM started with `VLLM_SERVER_DEV_MODE=1`).
    Vllm,
}

/// Requests to send an engine in turn: (URL, JSON body).
type Calls = Vec<(String, Value)>;

impl Reload {
    /// The requests that put a kept engine to sleep (`param sleep`): its weights and KV cache
    /// dropped, their GPU memory given back. vLLM's level 2 (weights discarded, not kept in CPU
    /// memory: the next load brings new ones) needs `--enable-sleep-mode` and its dev mode;
    /// SGLang's release needs `--enable-memory-saver`. `root` is the server's address without `/v1`.
    fn sleep(self, root: &str) -> Calls {
        match self {
            Reload::None => vec![],
            Reload::Sglang => vec![(format!("{root}/release_memory_occupation"), json!({}))],
            Reload::Vllm => vec![(format!("{root}/sleep?level=2"), json!({}))],
        }
    }

    /// The requests that wake a sleeping engine, before and after its checkpoint load: vLLM's
    /// weights first and the KV cache once they are loaded (its documented order for weight
    /// updates, so the two are never both allocated with the old weights' memory); SGLang's whole
    /// resume before the load (a tag list it did not release is an error there).
    fn wake(self, root: &str) -> (Calls, Calls) {
        match self {
            Reload::None => (vec![], vec![]),
            Reload::Sglang => (vec![(format!("{root}/resume_memory_occupation"), json!({}))], vec![]),
            Reload::Vllm => (vec![(format!("{root}/wake_up?tags=weights"), json!({}))], vec![(format!("{root}/wake_up?tags=kv_cache"), json!({}))]),
        }
    }
}

/// The stage params of the `http` backend (every sampling stage has them).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct HttpParams {
    pub server_command: String,
    pub base_url: String,
    pub served_model: String,
    /// Startup and per-request timeout, seconds.
    pub timeout_s: f64,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Attempts after the first for a request that failed to connect, timed out or got a 5xx.
    pub retries: u32,
    /// Keep the engine this stage started for the next stage of this process, which loads its
    /// checkpoint into it ([`Reload`]); the load is checked against the model core
    /// ([`super::finish_engine`]).
    pub reload: Reload,
    /// With `reload`: put the kept engine to sleep once the stage has sampled (its GPU memory
    /// free while the next stages run) and wake it before the next load ([`Reload::sleep`]).
    pub sleep: bool,
}

impl HttpParams {
    /// Errors (naming `stage`) unless the timeout and the concurrency are positive, and unless a
    /// stage that keeps its engine (`reload`) starts one.
    fn check(&self, stage: &str) -> Result<()> {
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) || self.concurrency == 0 {
            bail!("stage `{stage}`: timeout_s ({}) and concurrency ({}) must be positive", self.timeout_s, self.concurrency);
        }
        if self.reload != Reload::None && self.server_command.trim().is_empty() {
            bail!(
                "stage `{stage}`: reload = \"{}\" keeps an engine the stage starts, and there is no server_command: a server at base_url is not the stage's to load checkpoints into; set server_command, or reload = \"none\"",
                format!("{:?}", self.reload).to_lowercase()
            );
        }
        if self.sleep && self.reload == Reload::None {
            bail!("stage `{stage}`: sleep = true puts a kept engine to sleep between stages, and reload = \"none\" keeps none (the engine stops with the stage, freeing its memory); set reload, or sleep = false");
        }
        Ok(())
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s)
    }

    /// What an engine kept for reuse must have been started as: the same command template (its
    /// placeholders unfilled), served-model template and reload protocol.
    fn engine_key(&self) -> String {
        format!("{}\n{}\n{:?}", self.server_command, self.served_model, self.reload)
    }
}

/// The sampler whose engine this process kept after its stage ([`HttpParams::reload`]).
static PARKED: Mutex<Option<HttpSampler>> = Mutex::new(None);

/// The kept sampler, when its engine was started as `params` would start it and still runs; any
/// other kept engine is stopped.
fn take_parked(params: &HttpParams) -> Option<HttpSampler> {
    let parked = PARKED.lock().ok()?.take()?;
    let alive = parked.server.as_ref().is_some_and(|e| e.exited().is_none());
    (alive && parked.params.engine_key() == params.engine_key()).then_some(parked)
}

/// Records `gap` as the fresh gap ([`HttpSampler::fresh_gap`]) of the engine at `url` if this
/// process kept it and it has none: called by the stage that started it, once it was kept.
pub fn note_fresh_gap(url: &str, gap: f64) {
    with_parked_at(url, |parked| {
        parked.fresh_gap.get_or_insert(gap);
    });
}

/// Records `core`, the model core's logprobs of the kept engine's canary reply under the checkpoint
/// it holds, if this process kept the engine at `url` and its canary replied `tokens`: called by
/// the stage whose probe the canary is, once it was kept.
pub fn note_canary_core(url: &str, tokens: &[i64], core: Vec<f32>) {
    with_parked_at(url, |parked| {
        if let Some(c) = parked.canary.get_mut().ok().and_then(|c| c.as_mut()).filter(|c| c.reply.tokens == tokens) {
            c.core = Some(core);
        }
    });
}

/// Runs `f` on the sampler this process kept, if its engine is the one at `url`.
fn with_parked_at(url: &str, f: impl FnOnce(&mut HttpSampler)) {
    if let Some(parked) = PARKED.lock().ok().as_mut().and_then(|p| p.as_mut()).filter(|p| p.base == url) {
        f(parked);
    }
}

/// Stops the engine this process kept, if any (at the end of a warm stage process; the engine's
/// guardian kills it anyway when the process dies).
pub fn release_parked() {
    let parked = PARKED.lock().ok().and_then(|mut p| p.take());
    drop(parked);
}

/// One request: `n` completions of `prompt`, choice i with seed `seed + i`.
#[derive(Debug, Clone)]
pub struct CompletionRequest<'a> {
    pub prompt: &'a [i64],
    pub seed: u64,
    pub n: usize,
    pub max_tokens: usize,
    /// Names the request's first row in errors.
    pub label: String,
}

/// One completion as the engine sampled it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub tokens: Vec<i64>,
    pub logprobs: Vec<f32>,
    /// Logprobs of the top tokens at each position (empty unless asked for).
    pub top: Vec<Vec<f32>>,
    pub finish_reason: FinishReason,
}

/// Entropy estimate of one position from its top-k logprobs: the entropy of the top tokens plus
/// the remaining mass as one outcome (a lower bound of the true entropy; exact when the top k
/// hold all the mass).
pub fn topk_entropy(top: &[f32]) -> f32 {
    let mut h = 0.0f64;
    let mut mass = 0.0f64;
    for &lp in top.iter().filter(|l| l.is_finite()) {
        let p = (lp as f64).exp();
        mass += p;
        h -= p * lp as f64;
    }
    let rest = (1.0 - mass).max(0.0);
    if rest > 1e-12 {
        h -= rest * rest.ln();
    }
    h as f32
}

/// The first reply to [`HttpSampler::probe`], kept with the engine: after a kept engine loads the
/// next stage's checkpoint, the same request goes out again ([`HttpSampler::reuse`]). A reply
/// equal to the bit, while the model core says the new checkpoint moves these tokens'
/// logprobs, shows a load that did not take however small the training step: a bf16 engine's own
/// noise may hide one step's change from the logprob gap, not from this comparison.
#[derive(Debug, Clone)]
pub struct Canary {
    body: Value,
    pub prompt: Vec<i64>,
    max_tokens: usize,
    /// Top logprobs asked for.
    top: usize,
    pub reply: Sampled,
    /// The params the probe sampled with (the model core's logprobs of `reply` use them too).
    pub sampling: SamplingParams,
    /// The model core's logprobs of `reply.tokens` under the checkpoint the engine held when it
    /// answered ([`note_canary_core`]).
    pub core: Option<Vec<f32>>,
}

/// The previous stage's [`Canary`], sent again after the kept engine loaded this stage's checkpoint.
#[derive(Debug, Clone)]
pub struct CanaryAfterLoad {
    /// With `core` set.
    pub before: Canary,
    /// Whether the engine answered exactly as before the load: the same tokens and logprobs, bit
    /// for bit.
    pub unchanged: bool,
}

/// The engine process started by the stage; stopped on drop.
struct EngineServer {
    child: Mutex<Child>,
    /// The engine's own process group; dropping it SIGKILLs what is left of the engine.
    group: Option<Group>,
    command: String,
    log: PathBuf,
    /// Whether the log is this server's own file, removed with it (a kept engine outlives the
    /// stage's scratch directory, so it logs to the system's temporary directory).
    own_log: bool,
    /// Where the untied views of its checkpoints are written (`reload = "vllm"`; see
    /// [`super::untied`]), removed with it.
    views: Option<PathBuf>,
}

/// The checkpoint directory to give an engine whose views live in `views` (`reload = "vllm"`) for
/// `checkpoint` (hash `hash`): its untied view ([`super::untied`]), or itself when untied. Any
/// earlier view is removed first: the engine has read it already.
fn engine_view(stage: &str, views: &Path, checkpoint: &Path, hash: &str) -> Result<PathBuf> {
    let _ = std::fs::remove_dir_all(views);
    super::untied::engine_checkpoint(checkpoint, &views.join(&hash[..16.min(hash.len())]))
        .with_context(|| format!("stage `{stage}`: giving the engine an untied view of {} (reload = \"vllm\")", checkpoint.display()))
}

impl EngineServer {
    /// Why the engine is gone, when it is: its exit status and the end of its log.
    fn exited(&self) -> Option<String> {
        let status = self.child.lock().ok()?.try_wait().ok()??;
        Some(format!("the engine process `{}` exited ({status}); its log ends:\n{}", self.command, log_tail(&self.log)))
    }
}

impl Drop for EngineServer {
    fn drop(&mut self) {
        let Ok(child) = self.child.get_mut() else { return };
        if child.try_wait().ok().flatten().is_none() {
            if let Some(g) = &self.group {
                g.signal(libc::SIGTERM);
            }
            let (t0, mut pause) = (Instant::now(), Backoff::new());
            while child.try_wait().ok().flatten().is_none() && t0.elapsed() < STOP_GRACE {
                pause.wait();
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Kills whatever the engine forked that outlived it, and the guardian.
        self.group.take();
        if self.own_log {
            let _ = std::fs::remove_file(&self.log);
        }
        if let Some(views) = &self.views {
            let _ = std::fs::remove_dir_all(views);
        }
    }
}

/// The last lines of an engine log.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// A free loopback port (the engine binds it next; a race with another process is unlikely and
/// ends in a clear startup error).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port for the engine")?;
    Ok(l.local_addr()?.port())
}

/// The `rredcot` binary next to this one (the worker runs `serve` too).
fn rredcot_exe() -> String {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("rredcot"));
    let light = exe.with_file_name("rredcot");
    if light.is_file() { light } else { exe }.display().to_string()
}

/// `template` with its placeholders filled.
fn render(template: &str, vars: &[(&str, String)]) -> String {
    vars.iter().fold(template.to_string(), |s, (k, v)| s.replace(&format!("{{{k}}}"), v))
}

/// A body's text clipped for an error message.
fn clip(text: &str) -> String {
    let t = text.trim();
    if t.chars().count() > 400 {
        format!("{}…", t.chars().take(400).collect::<String>())
    } else {
        t.to_string()
    }
}

/// A connected engine, ready to sample.
pub struct HttpSampler {
    stage: String,
    /// `…/v1`.
    base: String,
    /// The model id sent in requests (the one `/v1/models` listed).
    model: String,
    agent: ureq::Agent,
    params: HttpParams,
    /// `owned_by` of the served model (`vllm`, `sglang`, `rredcot`, …) and `/version`.
    pub engine: String,
    pub engine_version: String,
    server: Option<EngineServer>,
    /// Seconds from opening to the first answer of `/v1/models` (the engine's start), or to the
    /// end of loading the checkpoint into a kept engine.
    pub startup_s: f64,
    /// Whether the engine was kept from an earlier stage, and the seconds its checkpoint load
    /// took (0 when it held this checkpoint already).
    pub reused: bool,
    pub reload_s: f64,
    /// Whether the kept engine sleeps (param `sleep`), and the seconds this stage's wake took
    /// (before and after the load, the load not counted).
    asleep: bool,
    pub wake_s: f64,
    /// Whether the engine was given an untied view of the checkpoint ([`super::untied`]).
    pub untied_view: bool,
    /// The mean gap (nats per token) between the engine's logprobs and the model core's in the
    /// stage that started it, once measured: what this engine shows when it surely holds the
    /// checkpoint, against which a kept engine's loads are checked.
    pub fresh_gap: Option<f64>,
    /// The hash of the checkpoint the engine holds.
    policy_hash: String,
    /// The latest probe's first reply ([`Canary`]).
    canary: Mutex<Option<Canary>>,
    /// The previous stage's canary after this stage's load, when the engine was kept and loaded.
    pub after_load: Option<CanaryAfterLoad>,
    pub requests: AtomicI64,
    pub retried: AtomicI64,
}

impl HttpSampler {
    /// Starts the engine over the checkpoint wired to input `policy` (or connects to
    /// `base_url`), waits until it answers and checks that it serves the policy.
    pub fn open(ctx: &StageContext, policy: &str, params: &HttpParams, seed: u64) -> Result<HttpSampler> {
        params.check(&ctx.instance)?;
        let params = params.clone();
        let opened = Instant::now();
        let stage = ctx.instance.clone();
        let path = ctx.input(policy)?.canonicalize().with_context(|| format!("stage `{stage}`: input `{policy}`"))?;
        let hash = ctx.input_hash(policy)?.to_string();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(params.timeout()))
            .http_status_as_error(false)
            .user_agent(concat!("rredcot/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let mut vars = vec![("policy", path.display().to_string()), ("policy_hash", hash.clone()), ("seed", seed.to_string()), ("rredcot", rredcot_exe())];
        if params.server_command.trim().is_empty() && render(&params.served_model, &vars).is_empty() {
            bail!(
                "stage `{stage}`: served_model is empty, so nothing ties the server at {} to the policy {}; set served_model (e.g. \"{{policy_hash}}\")",
                params.base_url,
                &hash[..12.min(hash.len())]
            );
        }
        if params.reload != Reload::None && !params.server_command.trim().is_empty() {
            if let Some(parked) = take_parked(&params) {
                return parked.reuse(stage, agent, params, &path, hash, opened);
            }
        }
        let mut untied_view = false;
        let (base, server) = if params.server_command.trim().is_empty() {
            if params.base_url.trim().is_empty() {
                bail!("stage `{stage}`: backend = \"http\" needs server_command (an engine to start) or base_url (a running one)");
            }
            (params.base_url.trim_end_matches('/').to_string(), None)
        } else {
            let port = free_port()?;
            vars.push(("port", port.to_string()));
            let own_log = params.reload != Reload::None;
            let kept_name = format!("rredcot-engine-{}-{port}", std::process::id());
            let log = if own_log { std::env::temp_dir().join(format!("{kept_name}.log")) } else { ctx.scratch.join("engine.log") };
            let views = (params.reload == Reload::Vllm).then(|| std::env::temp_dir().join(format!("{kept_name}.views")));
            if let Some(views) = &views {
                let given = engine_view(&stage, views, &path, &hash)?;
                untied_view = given != path;
                if let Some(policy) = vars.iter_mut().find(|(name, _)| *name == "policy") {
                    policy.1 = given.display().to_string();
                }
            }
            let command = render(&params.server_command, &vars);
            std::fs::create_dir_all(&ctx.scratch).with_context(|| format!("creating {}", ctx.scratch.display()))?;
            let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
            let mut cmd = Command::new("sh");
            cmd.arg("-c").arg(&command).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
            let group = Group::new().context("creating the engine's process group")?;
            group.adopt(&mut cmd);
            die_with_parent(&mut cmd);
            let child = cmd.spawn().with_context(|| format!("stage `{stage}`: starting the engine `{command}`"))?;
            tracing::info!("stage `{stage}`: started the engine `{command}` (log {})", log.display());
            (format!("http://127.0.0.1:{port}/v1"), Some(EngineServer { child: Mutex::new(child), group: Some(group), command, log, own_log, views }))
        };
        let base = if base.ends_with("/v1") { base } else { format!("{base}/v1") };
        let mut s = HttpSampler {
            stage,
            base,
            model: String::new(),
            agent,
            params,
            engine: String::new(),
            engine_version: String::new(),
            server,
            startup_s: 0.0,
            reused: false,
            reload_s: 0.0,
            asleep: false,
            wake_s: 0.0,
            untied_view,
            fresh_gap: None,
            policy_hash: hash.clone(),
            canary: Mutex::new(None),
            after_load: None,
            requests: AtomicI64::new(0),
            retried: AtomicI64::new(0),
        };
        let models = s.wait_ready()?;
        s.startup_s = opened.elapsed().as_secs_f64();
        let expected = render(&s.params.served_model, &vars);
        let ids: Vec<&str> = models.iter().filter_map(|m| m.get("id").and_then(Value::as_str)).collect();
        let chosen = if expected.is_empty() {
            // Only for an engine the stage started over the policy itself (checked above).
            models.first()
        } else {
            models.iter().find(|m| m.get("id").and_then(Value::as_str) == Some(expected.as_str()))
        };
        let Some(entry) = chosen else {
            bail!(
                "stage `{}`: the server at {}/models serves {ids:?}, not `{expected}` (served_model for the policy checkpoint {}); refusing samples from another model. If that server does serve this checkpoint, name it: `--set {}.served_model=<its id>` (or start it with `--model-name {expected}`)",
                s.stage,
                s.base,
                &hash[..12.min(hash.len())],
                s.stage.split('[').next().unwrap_or(&s.stage)
            );
        };
        s.model = entry.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
        s.engine = entry.get("owned_by").and_then(Value::as_str).unwrap_or("unknown").to_string();
        let root = s.root();
        // vLLM and `rredcot serve` answer `/version`; SGLang says it in `/server_info`.
        s.engine_version = ["version", "server_info"]
            .iter()
            .find_map(|route| s.get_json(&format!("{root}/{route}")).ok()?.get("version")?.as_str().map(str::to_string))
            .unwrap_or_else(|| "unknown".into());
        Ok(s)
    }

    /// This kept sampler for another stage, its engine loaded with the checkpoint at `path`
    /// unless it holds it already.
    fn reuse(mut self, stage: String, agent: ureq::Agent, params: HttpParams, path: &Path, hash: String, opened: Instant) -> Result<HttpSampler> {
        self.stage = stage;
        self.agent = agent;
        self.params = params;
        self.reused = true;
        self.reload_s = 0.0;
        self.wake_s = 0.0;
        self.after_load = None;
        self.requests = AtomicI64::new(0);
        self.retried = AtomicI64::new(0);
        self.wait_ready()?;
        let (before_load, after_load) = if self.asleep { self.params.reload.wake(self.root()) } else { (vec![], vec![]) };
        let t0 = Instant::now();
        self.post_each(&before_load, "waking the engine")?;
        self.wake_s = t0.elapsed().as_secs_f64();
        // A woken engine's weights are undefined until a load (vLLM's level 2, SGLang's release):
        // it loads the checkpoint even when it held this one.
        let load = self.policy_hash != hash || self.asleep;
        if load {
            let t0 = Instant::now();
            let views = self.server.as_ref().and_then(|e| e.views.clone());
            let given = match views {
                Some(views) => engine_view(&self.stage, &views, path, &hash)?,
                None => path.to_path_buf(),
            };
            self.untied_view = given != path;
            self.load_checkpoint(&given)?;
            self.reload_s = t0.elapsed().as_secs_f64();
            self.policy_hash = hash;
        }
        let t0 = Instant::now();
        self.post_each(&after_load, "waking the engine")?;
        if self.asleep {
            self.check_sleeping(false)?;
        }
        self.wake_s += t0.elapsed().as_secs_f64();
        self.asleep = false;
        if load {
            self.after_load = self.resend_canary()?;
        }
        self.startup_s = opened.elapsed().as_secs_f64();
        tracing::info!("stage `{}`: reusing the engine at {} ({:.2} s to load the checkpoint)", self.stage, self.base, self.reload_s);
        Ok(self)
    }

    /// The previous stage's canary (with the model core's logprobs) sent again, once the engine
    /// loaded this stage's checkpoint; `None` without one.
    fn resend_canary(&mut self) -> Result<Option<CanaryAfterLoad>> {
        let Some(before) = self.canary.get_mut().ok().and_then(|c| c.take()).filter(|c| c.core.is_some() && !c.reply.tokens.is_empty()) else {
            return Ok(None);
        };
        let r = CompletionRequest { prompt: &before.prompt, seed: SEED_PROBE, n: 1, max_tokens: before.max_tokens, label: "the previous stage's probe again, after the load".into() };
        let after = self.complete(&r, &before.body, before.top)?;
        let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let unchanged = after[0].tokens == before.reply.tokens && bits(&after[0].logprobs) == bits(&before.reply.logprobs);
        Ok(Some(CanaryAfterLoad { before, unchanged }))
    }

    /// Loads the checkpoint at `path` into the running engine ([`Reload`]); an engine that says
    /// it failed, or answers with anything but success, is an error (it may hold either).
    fn load_checkpoint(&self, path: &Path) -> Result<()> {
        let root = self.root();
        let calls = match self.params.reload {
            Reload::None => vec![],
            Reload::Sglang => vec![(format!("{root}/update_weights_from_disk"), json!({ "model_path": path }))],
            Reload::Vllm => vec![
                (format!("{root}/collective_rpc"), json!({ "method": "reload_weights", "kwargs": { "weights_path": path, "is_checkpoint_format": true } })),
                (format!("{root}/reset_prefix_cache"), json!({})),
            ],
        };
        self.post_each(&calls, &format!("loading the checkpoint {} into the engine", path.display()))
    }

    /// Posts each (url, JSON body) in turn; an engine that answers anything but HTTP 200, or says
    /// `"success": false`, is an error naming `doing` (it may be in either state).
    fn post_each(&self, calls: &[(String, Value)], doing: &str) -> Result<()> {
        for (url, body) in calls {
            let what = || format!("stage `{}`: {doing}: POST {url}", self.stage);
            let mut resp = self.agent.post(url).header("Content-Type", "application/json").send_json(body).map_err(|e| anyhow!("{}: {e}{}", what(), self.engine_note()))?;
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            let refused = serde_json::from_str::<Value>(&text).ok().and_then(|v| v.get("success").and_then(Value::as_bool)) == Some(false);
            if status != 200 || refused {
                bail!("{}: HTTP {status}: {}{}", what(), clip(&text), self.engine_note());
            }
        }
        Ok(())
    }

    /// Where the engine says whether it sleeps (vLLM's `GET /is_sleeping`), that it does as
    /// `expected`; SGLang has no such route (its release and resume answer success or not).
    fn check_sleeping(&self, expected: bool) -> Result<()> {
        if self.params.reload != Reload::Vllm {
            return Ok(());
        }
        let url = format!("{}/is_sleeping", self.root());
        let sleeping = self.get_json(&url).with_context(|| format!("stage `{}`: after {} the engine", self.stage, if expected { "putting it to sleep" } else { "waking it" }))?.get("is_sleeping").and_then(Value::as_bool);
        if sleeping != Some(expected) {
            bail!("stage `{}`: GET {url} says is_sleeping = {sleeping:?} after the engine was {}{}", self.stage, if expected { "put to sleep" } else { "woken (weights, load, KV cache)" }, self.engine_note());
        }
        Ok(())
    }

    /// Puts the kept engine to sleep ([`Reload::sleep`]); returns the seconds it took.
    fn fall_asleep(&mut self) -> Result<f64> {
        let t0 = Instant::now();
        let flags = match self.params.reload {
            Reload::Vllm => " (vLLM needs --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1)",
            _ => " (SGLang needs --enable-memory-saver)",
        };
        self.post_each(&self.params.reload.sleep(self.root()), &format!("putting the kept engine to sleep (param sleep){flags}"))?;
        self.check_sleeping(true)?;
        self.asleep = true;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Most choices one request may ask for: SGLang gives all `n` choices of a request one seed
    /// (read in its 0.5.23 source; vLLM and `rredcot serve` give choice i `seed + i`), so a row
    /// goes to it as a request of its own, with its own seed.
    pub fn max_choices(&self) -> usize {
        if self.engine == "sglang" { 1 } else { MAX_N }
    }

    /// The endpoint base (`…/v1`).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The server's address without `/v1`, where the engines' own routes are (loads, sleep).
    fn root(&self) -> &str {
        self.base.trim_end_matches("/v1")
    }

    /// The model id the engine serves the policy as.
    pub fn model(&self) -> &str {
        &self.model
    }

    fn get_json(&self, url: &str) -> Result<Value> {
        let mut resp = self.agent.get(url).call().map_err(|e| anyhow!("GET {url}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().map_err(|e| anyhow!("GET {url}: reading the body: {e}"))?;
        if status != 200 {
            bail!("GET {url}: HTTP {status}: {}", clip(&text));
        }
        serde_json::from_str(&text).map_err(|e| anyhow!("GET {url}: not JSON ({e}): {}", clip(&text)))
    }

    /// Polls `/v1/models` until it lists models (the engine's start or the first contact with a
    /// running server); returns its `data`.
    fn wait_ready(&self) -> Result<Vec<Value>> {
        let url = format!("{}/models", self.base);
        let (t0, mut pause) = (Instant::now(), Backoff::new());
        loop {
            if let Some(server) = &self.server {
                if let Some(why) = server.exited() {
                    bail!("stage `{}`: the engine never answered at {url}: {why}", self.stage);
                }
            }
            let last = match self.get_json(&url) {
                Ok(v) => match v.get("data").and_then(Value::as_array) {
                    Some(d) if !d.is_empty() => return Ok(d.clone()),
                    _ => format!("GET {url}: no models in {}", clip(&v.to_string())),
                },
                Err(e) => e.to_string(),
            };
            // A running server that does not answer is an error at once; a starting engine gets
            // the whole timeout.
            if self.server.is_none() || t0.elapsed() > self.params.timeout() {
                let waited = if self.server.is_some() { format!(" within {:.0} s", self.params.timeout_s) } else { String::new() };
                let log = self.server.as_ref().map(|s| format!("; the engine's log ends:\n{}", log_tail(&s.log))).unwrap_or_default();
                bail!("stage `{}`: the server at {} did not answer{waited}: {last}{log}", self.stage, self.base);
            }
            pause.wait();
        }
    }

    /// The JSON body of a request.
    fn body(&self, r: &CompletionRequest, p: &SamplingParams, stop_ids: &[i64], top: usize) -> Value {
        json!({
            "model": self.model,
            "prompt": r.prompt,
            "n": r.n,
            // vLLM refuses seeds above i64::MAX: the same 64 bits as a signed number (vLLM's
            // torch generator and `rredcot serve` read them back modulo 2^64, so the row's seed
            // and the `seed + i` of choice i are unchanged).
            "seed": wire_seed(r.seed),
            "temperature": p.temperature,
            "top_p": p.top_p,
            "top_k": if p.top_k > 0 { p.top_k } else { -1 },
            "max_tokens": r.max_tokens,
            "stop": p.stop_strings,
            "stop_token_ids": stop_ids,
            "logprobs": top,
            "return_tokens_as_token_ids": true,
            "return_token_ids": true,
            "skip_special_tokens": false,
            "stream": false,
        })
    }

    /// What to add to an error about a failed request: the engine's death, when it died.
    fn engine_note(&self) -> String {
        self.server.as_ref().and_then(EngineServer::exited).map(|w| format!("; {w}")).unwrap_or_default()
    }

    /// One request with bounded retries (connection errors, timeouts, 5xx); the parsed choices.
    fn complete(&self, r: &CompletionRequest, body: &Value, top: usize) -> Result<Vec<Sampled>> {
        let url = format!("{}/completions", self.base);
        let what = || format!("stage `{}`: POST {url} ({}, n = {}, seed {})", self.stage, r.label, r.n, r.seed);
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.requests.fetch_add(1, Ordering::Relaxed);
            let why = match self.agent.post(&url).header("Content-Type", "application/json").send_json(body) {
                Err(e) => format!("{e}"),
                Ok(mut resp) => {
                    let status = resp.status().as_u16();
                    let mut text = String::new();
                    let read = resp.body_mut().as_reader().read_to_string(&mut text);
                    match (status, read) {
                        (_, Err(e)) => format!("HTTP {status}, reading the body: {e}"),
                        (200..=299, Ok(_)) => {
                            let v: Value = serde_json::from_str(&text).map_err(|e| anyhow!("{}: the reply is not JSON ({e}): {}", what(), clip(&text)))?;
                            return parse_choices(&v, r.n, top).map_err(|e| anyhow!("{}: {e}", what()));
                        }
                        (500..=599, Ok(_)) => format!("HTTP {status}: {}", clip(&text)),
                        (_, Ok(_)) => bail!("{}: HTTP {status}: {}", what(), clip(&text)),
                    }
                }
            };
            let dead = self.engine_note();
            if attempt > self.params.retries || !dead.is_empty() {
                bail!("{}: failed after {attempt} attempt(s): {why}{dead}", what());
            }
            self.retried.fetch_add(1, Ordering::Relaxed);
            tracing::info!("{}: retrying: {why}", what());
            std::thread::sleep(Duration::from_millis(500 * attempt as u64));
        }
    }

    /// Before any real sampling: checks that the engine returns token ids and logprobs, and says
    /// whether it follows a request's seed. The same request (`prompt`, at most `max_tokens` ≤
    /// [`PROBE_TOKENS`] tokens at the stage's sampling params, one seed) goes out twice and must
    /// parse; `false` when the two came back with other tokens: the engine's samples do not follow
    /// the rows' seeds and a rerun samples anew (SGLang without `--enable-deterministic-inference`).
    /// `true` may also mean a distribution too peaked to tell. The first reply is kept as the
    /// engine's [`Canary`].
    pub fn probe(&self, prompt: &[i64], max_tokens: usize, p: &SamplingParams, stop_ids: &[i64], top: usize) -> Result<bool> {
        let max_tokens = max_tokens.min(PROBE_TOKENS);
        let r = CompletionRequest { prompt, seed: SEED_PROBE, n: 1, max_tokens, label: "probe: the first prompt twice with one seed".into() };
        let sampling = SamplingParams { stop_strings: vec![], ..p.clone() };
        let body = self.body(&r, &sampling, stop_ids, top);
        let first = self.complete(&r, &body, top)?;
        let second = self.complete(&r, &body, top)?;
        let seeded = first[0].tokens == second[0].tokens;
        let canary = Canary { body, prompt: prompt.to_vec(), max_tokens, top, reply: first.into_iter().next().context("the probe's reply")?, sampling, core: None };
        *self.canary.lock().map_err(|_| anyhow!("the canary's lock"))? = Some(canary);
        Ok(seeded)
    }

    /// The latest probe's first reply ([`Canary`]).
    pub fn canary(&self) -> Option<Canary> {
        self.canary.lock().ok()?.clone()
    }

    /// Whether this sampler's engine is kept for the next stage when it stops.
    pub fn keeps_engine(&self) -> bool {
        self.server.is_some() && self.params.reload != Reload::None
    }

    /// Every request, at most `concurrency` in flight; choices in request order. On the first
    /// failure no new request starts and the error is returned. `on_done(rows)` after each
    /// request (progress).
    pub fn sample(&self, requests: &[CompletionRequest], p: &SamplingParams, stop_ids: &[i64], top: usize, on_done: &(dyn Fn(usize) + Sync)) -> Result<Vec<Vec<Sampled>>> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let results: Mutex<Vec<Option<Result<Vec<Sampled>>>>> = Mutex::new((0..requests.len()).map(|_| None).collect());
        std::thread::scope(|scope| {
            for _ in 0..self.params.concurrency.min(requests.len().max(1)) {
                scope.spawn(|| loop {
                    if failed.load(Ordering::SeqCst) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(r) = requests.get(i) else { break };
                    let out = self.complete(r, &self.body(r, p, stop_ids, top), top);
                    if out.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    } else {
                        on_done(r.n);
                    }
                    results.lock().expect("results lock")[i] = Some(out);
                });
            }
        });
        let results = results.into_inner().expect("results lock");
        let mut out = Vec::with_capacity(requests.len());
        for r in results {
            match r {
                Some(Ok(c)) => out.push(c),
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
        if out.len() != requests.len() {
            bail!("stage `{}`: {} of {} requests to {} were not sent", self.stage, requests.len() - out.len(), requests.len(), self.base);
        }
        Ok(out)
    }

    /// Stops the engine (when the stage started it; with `reload`, keeps it for the next stage)
    /// and checks it was still alive: an engine that died during the run is an error even when
    /// every reply had arrived.
    pub fn stop(mut self) -> Result<Option<f64>> {
        if let Some(why) = self.server.as_ref().and_then(EngineServer::exited) {
            bail!("stage `{}`: {why}", self.stage);
        }
        let mut slept = None;
        if self.keeps_engine() {
            if self.params.sleep {
                slept = Some(self.fall_asleep()?);
            }
            // Replaces (and so stops) any engine kept before.
            let old = PARKED.lock().map_err(|_| anyhow!("the kept engine's lock"))?.replace(self);
            drop(old);
        }
        Ok(slept)
    }
}

/// A row's seed as sent: its bits as a signed 64-bit integer (what OpenAI-compatible servers
/// written in Python validate `seed` against).
pub fn wire_seed(seed: u64) -> i64 {
    seed as i64
}

/// The token ids of a choice: `token_ids` (vLLM's `return_token_ids`) or its logprobs' tokens
/// written `"token_id:123"` (`return_tokens_as_token_ids`).
fn choice_ids(c: &Value) -> Option<Vec<i64>> {
    if let Some(ids) = c.get("token_ids").and_then(Value::as_array) {
        return ids.iter().map(Value::as_i64).collect();
    }
    let tokens = c.get("logprobs")?.get("tokens")?.as_array()?;
    tokens.iter().map(|t| t.as_str()?.strip_prefix("token_id:")?.parse().ok()).collect()
}

/// The `n` choices of a completion response, in index order.
pub fn parse_choices(v: &Value, n: usize, top: usize) -> Result<Vec<Sampled>> {
    let choices = v.get("choices").and_then(Value::as_array).ok_or_else(|| anyhow!("no `choices` in the reply: {}", clip(&v.to_string())))?;
    if choices.len() != n {
        bail!("the reply has {} choice(s) for n = {n}", choices.len());
    }
    let mut out: Vec<Option<Sampled>> = vec![None; n];
    for (k, c) in choices.iter().enumerate() {
        let i = c.get("index").and_then(Value::as_u64).map_or(k, |i| i as usize);
        if i >= n || out[i].is_some() {
            bail!("choice {k} has index {i}: not a permutation of 0..{n}");
        }
        let tokens = choice_ids(c).ok_or_else(|| {
            anyhow!(
                "choice {i} has text but no token ids (neither `token_ids` nor `token_id:N` logprob tokens): the server supports neither vLLM's \
                 `return_token_ids` nor `return_tokens_as_token_ids`, so its samples cannot be trained on exactly; reply: {}",
                clip(&c.to_string())
            )
        })?;
        let lp = c.get("logprobs").filter(|l| !l.is_null()).ok_or_else(|| anyhow!("choice {i} has no logprobs (the server ignored `logprobs`)"))?;
        let logprobs: Vec<f32> = lp
            .get("token_logprobs")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect())
            .ok_or_else(|| anyhow!("choice {i}: `logprobs.token_logprobs` is not a list of numbers"))?;
        if logprobs.len() != tokens.len() {
            bail!("choice {i}: {} token ids but {} logprobs", tokens.len(), logprobs.len());
        }
        let top_rows: Vec<Vec<f32>> = if top > 0 {
            let rows = lp.get("top_logprobs").and_then(Value::as_array).ok_or_else(|| anyhow!("choice {i}: no `logprobs.top_logprobs`"))?;
            if rows.len() != tokens.len() {
                bail!("choice {i}: {} token ids but {} top_logprobs", tokens.len(), rows.len());
            }
            rows.iter()
                .map(|m| m.as_object().map(|m| m.values().filter_map(Value::as_f64).map(|f| f as f32).collect()).unwrap_or_default())
                .collect()
        } else {
            vec![]
        };
        let finish_reason = match c.get("finish_reason").and_then(Value::as_str) {
            Some("stop") => FinishReason::Stop,
            Some("length") => FinishReason::Length,
            other => bail!("choice {i}: finish_reason {other:?} (expected \"stop\" or \"length\")"),
        };
        out[i] = Some(Sampled { tokens, logprobs, top: top_rows, finish_reason });
    }
    Ok(out.into_iter().map(|s| s.expect("every index filled")).collect())
}

/// Groups `rows` (prompt, seed, max tokens) into requests: consecutive rows of one prompt whose
/// seeds are `s, s+1, …` go into one request with `n` choices (at most `max_n` and [`MAX_N`]).
pub fn plan_requests<'a>(rows: &[(&'a [i64], u64, usize)], max_n: usize, name: impl Fn(usize) -> String) -> Vec<CompletionRequest<'a>> {
    let mut out: Vec<CompletionRequest<'a>> = Vec::new();
    for (i, &(prompt, seed, max_tokens)) in rows.iter().enumerate() {
        if let Some(last) = out.last_mut() {
            if last.n < max_n.min(MAX_N) && last.prompt == prompt && last.max_tokens == max_tokens && last.seed.wrapping_add(last.n as u64) == seed {
                last.n += 1;
                continue;
            }
        }
        out.push(CompletionRequest { prompt, seed, n: 1, max_tokens, label: name(i) });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_one_prompt_with_consecutive_seeds_share_a_request() {
        let (a, b) = (vec![1i64, 2], vec![3i64]);
        let rows = [(&a[..], 10, 8), (&a[..], 11, 8), (&a[..], 12, 8), (&a[..], 99, 8), (&b[..], 100, 8), (&b[..], 101, 4)];
        let reqs = plan_requests(&rows, MAX_N, |i| format!("row {i}"));
        let got: Vec<(usize, u64, usize, &str)> = reqs.iter().map(|r| (r.n, r.seed, r.max_tokens, r.label.as_str())).collect();
        assert_eq!(got, vec![(3, 10, 8, "row 0"), (1, 99, 8, "row 3"), (1, 100, 8, "row 4"), (1, 101, 4, "row 5")]);
        // An engine whose choices share one seed (SGLang) gets each row as a request.
        let single: Vec<(usize, u64)> = plan_requests(&rows, 1, |i| format!("row {i}")).iter().map(|r| (r.n, r.seed)).collect();
        assert_eq!(single, rows.iter().map(|r| (1, r.1)).collect::<Vec<_>>());
    }

    #[test]
    fn choices_need_token_ids_logprobs_and_a_known_finish_reason() {
        let ok = json!({"choices": [
            {"index": 1, "text": "b", "finish_reason": "length", "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5], "top_logprobs": [{"token_id:7": -0.5, "token_id:8": -1.0}]}},
            {"index": 0, "text": "a", "token_ids": [5, 6], "finish_reason": "stop", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2], "top_logprobs": [{"a": -0.1}, {"b": -0.2}]}},
        ]});
        let s = parse_choices(&ok, 2, 2).unwrap();
        assert_eq!((s[0].tokens.clone(), s[0].finish_reason, s[1].tokens.clone()), (vec![5, 6], FinishReason::Stop, vec![7]));
        assert_eq!((s[1].logprobs.clone(), s[1].top[0].len()), (vec![-0.5], 2));
        let err = |v: Value, n: usize| parse_choices(&v, n, 0).unwrap_err().to_string();
        assert!(err(ok.clone(), 3).contains("2 choice(s) for n = 3"));
        let text_only = json!({"choices": [{"index": 0, "text": "a", "finish_reason": "stop", "logprobs": {"tokens": ["a"], "token_logprobs": [-0.1]}}]});
        assert!(err(text_only, 1).contains("no token ids"));
        let no_lp = json!({"choices": [{"index": 0, "token_ids": [1], "finish_reason": "stop", "logprobs": null}]});
        assert!(err(no_lp, 1).contains("no logprobs"));
        let abort = json!({"choices": [{"index": 0, "token_ids": [1], "finish_reason": "abort", "logprobs": {"token_logprobs": [-1.0]}}]});
        assert!(err(abort, 1).contains("abort"));
    }

    #[test]
    fn the_topk_entropy_is_exact_when_the_top_holds_all_mass_and_a_lower_bound_otherwise() {
        let uniform = [0.25f32.ln(); 4];
        assert!((topk_entropy(&uniform) - 4.0f32.ln()).abs() < 1e-6);
        let partial = topk_entropy(&uniform[..2]);
        assert!((partial - (2.0 * 0.25 * 4.0f32.ln() - 0.5 * 0.5f32.ln())).abs() < 1e-6 && partial < 4.0f32.ln());
    }
}
