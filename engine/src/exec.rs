//! `stage exec KEY`: run one planned instance and commit it.
//!
//! Re-entrant and safe to run twice at once: the instance lock serialises writers, a finished
//! instance is never redone, and output becomes visible only through the atomic commit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command as Proc, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Map, Value};

use super::context::{emit_status, BuiltinFn, ExecStatus, StageContext};
use super::defs::Command;
use super::error::{EngineError, IoContext, Result};
use super::group::{self as signals, die_with_parent, Group};
use super::catalog::Catalog;
use super::schema::Layout;
use super::programs::Programs;
use super::record::RunRecord;
use super::spec::{short, InputSource, InstanceSpec, RunnerSpec};
use super::file_hashes::FileHashes;
use super::store::{hash_output, Store};

/// What this binary can run in-process.
pub struct Runtime {
    pub catalog: &'static Catalog,
    /// File name of the companion binary (next to this one) that runs the builtins tagged
    /// [`Executable::Worker`](super::programs::Executable) this one lacks.
    pub worker: &'static str,
    /// The application's version and those of the libraries that shape results (run records).
    pub versions: fn() -> BTreeMap<String, String>,
    /// Called in a warm stage process after each instance that succeeded: whether the process
    /// may take another (false: it ends, and the next instance gets a fresh process), see
    /// [`super::warm`].
    pub after_instance: fn() -> bool,
}

/// [`Runtime::after_instance`] of an application whose processes hold nothing between instances.
pub fn keep_serving() -> bool {
    true
}

pub enum ExecOutcome {
    Ran(Box<RunRecord>),
    AlreadyDone(Box<RunRecord>),
    /// This binary lacks the builtin's code: the worker binary (this path) runs it.
    NeedsWorker(PathBuf),
}

impl ExecOutcome {
    /// The line `stage exec` prints when it is done.
    pub fn summary(&self) -> String {
        match self {
            ExecOutcome::Ran(rec) => format!("committed {} ({}) in {:.2}s", rec.stage, short(&rec.key), rec.wall_s),
            ExecOutcome::AlreadyDone(rec) => format!("{} ({}) is already committed", rec.stage, short(&rec.key)),
            ExecOutcome::NeedsWorker(w) => format!("runs in {}", w.display()),
        }
    }
}

pub fn exec_instance(store: &Store, key: &str, rt: &Runtime, force: bool) -> Result<ExecOutcome> {
    let programs = Programs::of(rt);
    let spec = store.read_spec(key)?;
    let fail = |m: String| EngineError::Instance {
        key: short(key).to_string(),
        stage: spec.instance.clone(),
        message: m,
    };
    if spec.compute_key() != key {
        return Err(fail(
            "spec does not hash to its key (edited by hand?)".into(),
        ));
    }
    let program = programs.for_runner(&spec.runner).map_err(&fail)?;
    if program != programs.this() {
        return Ok(ExecOutcome::NeedsWorker(program));
    }
    let builtin = match &spec.runner {
        RunnerSpec::Builtin { name, .. } => Some(rt.catalog.code(name).ok_or_else(|| fail(format!("builtin `{name}` is not in this build")))?),
        RunnerSpec::External { .. } => None,
    };

    let _lock = match store.try_lock(key)? {
        Some(l) => l,
        None => {
            eprintln!(
                "instance {} ({}) is being written by another process; waiting",
                short(key),
                spec.instance
            );
            emit_status(ExecStatus::Waiting);
            store.lock(key)?
        }
    };
    match store.checked_record(key) {
        Ok(Some(rec)) if !force => {
            emit_status(ExecStatus::Reused);
            return Ok(ExecOutcome::AlreadyDone(Box::new(rec)));
        }
        // Forced: the old instance is moved aside at commit.
        Ok(_) => {}
        Err(why) => {
            let dest = store.quarantine(key, &format!("corrupt: {why}"))?;
            eprintln!(
                "corrupt instance {} ({}): {why}; moved to {} and recomputing",
                short(key),
                spec.instance,
                dest.display()
            );
        }
    }

    // Inputs must be committed and byte-for-byte what the key was computed from: each is
    // hashed here, whatever its size, so a stage never reads an input it has not checked. A
    // large file's hash is remembered by its identity (inode, size, mtime, ctime: see
    // file_hashes.rs), so a checkpoint is read in full once, not by every stage that loads it.
    let hashes = FileHashes::in_store(&store.root, true);
    let mut inputs = BTreeMap::new();
    for (name, inp) in &spec.inputs {
        let schema = rt
            .catalog
            .schema(&inp.schema)
            .ok_or_else(|| fail(format!("input `{name}`: unknown schema {}", inp.schema)))?;
        let path = match &inp.source {
            InputSource::Instance {
                key: up,
                stage,
                output,
            } => {
                let rec = store.record(up).ok_or_else(|| {
                    fail(format!(
                        "input `{name}`: upstream {stage} ({}) is not committed",
                        short(up)
                    ))
                })?;
                let out = rec.outputs.get(output).ok_or_else(|| {
                    fail(format!(
                        "input `{name}`: upstream {stage} has no output `{output}`"
                    ))
                })?;
                if out.hash != inp.hash {
                    return Err(fail(format!(
                        "input `{name}`: upstream {stage} output `{output}` changed since planning"
                    )));
                }
                let up_schema = rt.catalog.schema(&out.schema).unwrap_or(schema);
                let path = up_schema.output_path(&store.outputs_dir(up), output);
                if hashes.source(&path).ok().as_deref() != Some(inp.hash.as_str()) {
                    return Err(fail(corrupt_input(store, name, up, stage, output)));
                }
                path
            }
            InputSource::File { path } => {
                let h = hashes.source(path)?;
                if h != inp.hash {
                    return Err(fail(format!(
                        "input `{name}`: {} changed since planning",
                        path.display()
                    )));
                }
                path.clone()
            }
        };
        inputs.insert(name.clone(), (schema, path));
    }

    let tmp = store.fresh_tmp(key)?;
    let outputs_dir = tmp.join("outputs");
    let scratch = tmp.join("scratch");
    std::fs::create_dir_all(&scratch).at(&scratch)?;
    let mut outputs = BTreeMap::new();
    for (name, s) in &spec.outputs {
        let schema =
            rt.catalog.schema(s).ok_or_else(|| fail(format!("output `{name}`: unknown schema {s}")))?;
        let p = schema.output_path(&outputs_dir, name);
        if schema.layout == Layout::Dir {
            std::fs::create_dir_all(&p).at(&p)?;
        }
        outputs.insert(name.clone(), (schema, p));
    }

    let start = SystemTime::now();
    let t0 = Instant::now();
    let mut ctx = StageContext {
        instance: spec.instance.clone(),
        key: key.to_string(),
        params: spec.params.clone(),
        inputs,
        input_hashes: spec
            .inputs
            .iter()
            .map(|(n, i)| (n.clone(), i.hash.clone()))
            .collect(),
        input_sources: spec
            .inputs
            .iter()
            .map(|(n, i)| (n.clone(), i.source.clone()))
            .collect(),
        outputs,
        scratch: scratch.clone(),
        cache_dir: store.cache_dir(),
        counters: BTreeMap::new(),
        metrics: Map::new(),
    };
    let result = match builtin {
        Some(f) => run_builtin(f, &mut ctx),
        None => run_external(&spec, &mut ctx, &tmp),
    };
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(match e {
            StageError::Interrupted(sig) => EngineError::Interrupted {
                key: short(key).to_string(),
                stage: spec.instance.clone(),
                signal: sig,
            },
            StageError::Failed(m) => fail(m),
        });
    }

    // Validate and hash every declared output; the scratch dir is not part of the artifact.
    let _ = std::fs::remove_dir_all(&scratch);
    let mut out_recs = BTreeMap::new();
    for (name, (schema, path)) in &ctx.outputs {
        if let Err(e) = (schema.validate)(path) {
            let _ = std::fs::remove_dir_all(&tmp);
            // The temp dir is gone: name the output by its place in the instance instead.
            let within = path
                .strip_prefix(&outputs_dir)
                .unwrap_or(path)
                .display()
                .to_string();
            let msg = e.replace(&path.display().to_string(), &format!("outputs/{within}"));
            return Err(fail(format!(
                "output `{name}` (outputs/{within}) does not match schema `{schema}`: {msg}"
            )));
        }
        out_recs.insert(
            name.clone(),
            hash_output(&outputs_dir, path, schema.name)?,
        );
    }
    let rec = RunRecord {
        key: key.to_string(),
        stage: spec.instance.clone(),
        kind: spec.kind.clone(),
        pipeline: spec.pipeline.clone(),
        code_version: spec.code_version.clone(),
        inputs: spec.inputs.clone(),
        inputs_verified: true,
        params: spec.params.clone(),
        outputs: out_recs,
        start: humantime::format_rfc3339_millis(start).to_string(),
        end: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        wall_s: t0.elapsed().as_secs_f64(),
        peak_rss_mb: peak_rss_mb(),
        host: hostname(),
        git_rev: spec.git_rev.clone(),
        versions: (rt.versions)(),
        counters: ctx.counters.clone(),
        metrics: ctx.metrics.clone(),
    };
    store.commit(&tmp, &rec)?;
    // The outputs were just hashed: the stages that read them need not read them again.
    let out_dir = store.outputs_dir(key);
    for f in rec.outputs.values().flat_map(|o| &o.files) {
        hashes.written(&out_dir.join(&f.path), &f.sha256);
    }
    Ok(ExecOutcome::Ran(Box::new(rec)))
}

/// Why a stage produced no output.
enum StageError {
    Failed(String),
    /// `stage exec` itself got this termination signal while the stage ran.
    Interrupted(i32),
}

/// What to say when an upstream output does not hash to what its record says: the upstream is
/// moved aside (under its lock, after checking again) so the next run recomputes it.
fn corrupt_input(store: &Store, name: &str, up: &str, stage: &str, output: &str) -> String {
    let what = format!("input `{name}`: upstream {stage} ({}) output `{output}` does not match its recorded content hash", short(up));
    match store.quarantine_if_corrupt(up, true, || {}) {
        Ok(Some((why, dest))) => format!("{what} ({why}); nothing was read from it; moved it to {} so the next run recomputes it", dest.display()),
        _ => format!("{what}; nothing was read from it; `rredcot artifact verify --fix` moves it aside"),
    }
}

fn run_builtin(f: BuiltinFn, ctx: &mut StageContext) -> std::result::Result<(), StageError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(ctx))) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(StageError::Failed(format!("{e:#}"))),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(StageError::Failed(format!("stage panicked: {msg}")))
        }
    }
}

/// Substitute `{io}`, `{script}`, `{inputs.X}`, `{outputs.X}`, `{params.X}` in a command word.
fn substitute(word: &str, io: &Path, script: Option<&Path>, ctx: &StageContext) -> String {
    let mut s = word.replace("{io}", &io.to_string_lossy());
    if let Some(sc) = script {
        s = s.replace("{script}", &sc.to_string_lossy());
    }
    for (n, (_, p)) in &ctx.inputs {
        s = s.replace(&format!("{{inputs.{n}}}"), &p.to_string_lossy());
    }
    for (n, (_, p)) in &ctx.outputs {
        s = s.replace(&format!("{{outputs.{n}}}"), &p.to_string_lossy());
    }
    for (n, v) in &ctx.params {
        let text = match v {
            Value::String(t) => t.clone(),
            other => other.to_string(),
        };
        s = s.replace(&format!("{{params.{n}}}"), &text);
    }
    s
}

/// A command line as a shell would take it back: words quoted only where needed.
fn shell_words(words: &[String]) -> String {
    let plain = |w: &str| {
        !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    };
    words
        .iter()
        .map(|w| {
            if plain(w) {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// How long a stage may take to end after SIGTERM before its group is SIGKILLed.
const TERM_GRACE: Duration = Duration::from_secs(5);

fn run_external(
    spec: &InstanceSpec,
    ctx: &mut StageContext,
    tmp: &Path,
) -> std::result::Result<(), StageError> {
    let RunnerSpec::External {
        command,
        script,
        workdir,
        ..
    } = &spec.runner
    else {
        unreachable!("external runner")
    };
    let io_path = tmp.join("io.json");
    let counters_path = tmp.join("counters.json");
    let io = json!({
        "instance": spec.instance,
        "key": spec.key,
        "params": Value::Object(spec.params.clone()),
        "inputs": ctx.inputs.iter().map(|(n, (s, p))| (n.clone(), json!({"path": p, "schema": s.name}))).collect::<Map<_, _>>(),
        "outputs": ctx.outputs.iter().map(|(n, (s, p))| (n.clone(), json!({"path": p, "schema": s.name}))).collect::<Map<_, _>>(),
        "counters": counters_path,
        "scratch": ctx.scratch,
    });
    let failed = StageError::Failed;
    std::fs::write(&io_path, serde_json::to_vec_pretty(&io).expect("json"))
        .map_err(|e| failed(format!("{}: {e}", io_path.display())))?;
    let script = script.as_deref();
    // `shown` is the command as it runs, placeholders filled, for messages.
    let (mut cmd, shown) = match command {
        Command::Argv(argv) if !argv.is_empty() => {
            let words: Vec<String> = argv
                .iter()
                .map(|w| substitute(w, &io_path, script, ctx))
                .collect();
            let mut c = Proc::new(&words[0]);
            c.args(&words[1..]);
            (c, shell_words(&words))
        }
        Command::Argv(_) => return Err(failed("empty command".into())),
        Command::Shell(s) => {
            let line = substitute(s, &io_path, script, ctx);
            let mut c = Proc::new("sh");
            c.arg("-c").arg(&line);
            (c, shell_words(&["sh".into(), "-c".into(), line]))
        }
    };
    cmd.current_dir(workdir)
        .env("RREDCOT_IO", &io_path)
        .env("RREDCOT_KEY", &spec.key)
        .env("RREDCOT_INSTANCE", &spec.instance)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    // Its own process group, killed when this process ends however it ends: nothing the
    // command forks outlives the instance lock.
    let group = Group::new()
        .map_err(|e| failed(format!("cannot create a process group for `{shown}`: {e}")))?;
    group.adopt(&mut cmd);
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| {
        failed(format!(
            "cannot start `{shown}` in {}: {e}",
            workdir.display()
        ))
    })?;
    // From here a SIGINT/SIGTERM is passed on to the command's group instead of killing us, so
    // the temp dir is removed and nothing is committed.
    signals::deferring(true);
    let status = wait_or_interrupt(&mut child, &group);
    signals::deferring(false);
    drop(group);
    let status = status.map_err(|e| failed(format!("waiting for `{shown}`: {e}")))?;
    if let Some(sig) = signals::received() {
        return Err(StageError::Interrupted(sig));
    }
    if !status.success() {
        // Its stderr went to our stderr (the instance log) as it ran; not repeated here.
        return Err(failed(format!(
            "external command `{shown}` failed ({status}); its stderr is above"
        )));
    }
    if let Ok(text) = std::fs::read(&counters_path) {
        let parsed: BTreeMap<String, Value> = serde_json::from_slice(&text).map_err(|e| {
            failed(format!(
                "{}: counters must be a JSON object: {e}",
                counters_path.display()
            ))
        })?;
        for (k, v) in parsed {
            match v.as_i64() {
                Some(i) => ctx.count(&k, i),
                None => ctx.metric(&k, v),
            }
        }
        let _ = std::fs::remove_file(&counters_path);
    }
    let _ = std::fs::remove_file(&io_path);
    Ok(())
}

/// Wait for `child`; on a termination signal to this process, SIGTERM its group, then SIGKILL it
/// after [`TERM_GRACE`].
fn wait_or_interrupt(
    child: &mut std::process::Child,
    group: &Group,
) -> std::io::Result<std::process::ExitStatus> {
    let mut termed: Option<Instant> = None;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        if signals::received().is_some() {
            match termed {
                None => {
                    group.signal(libc::SIGTERM);
                    termed = Some(Instant::now());
                }
                Some(t) if t.elapsed() > TERM_GRACE => group.signal(libc::SIGKILL),
                Some(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The peak resident memory of this process (since the last reset of `/proc/self/clear_refs`, see
/// [`super::warm`]) and of its waited-for children, in MiB.
pub fn peak_rss_mb() -> f64 {
    let own = own_peak_rss_kb().unwrap_or_else(|| rusage_max_kb(libc::RUSAGE_SELF));
    own.max(rusage_max_kb(libc::RUSAGE_CHILDREN)) as f64 / 1024.0
}

fn rusage_max_kb(who: libc::c_int) -> i64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut ru) } == 0 {
        ru.ru_maxrss
    } else {
        0
    }
}

/// `VmHWM` of `/proc/self/status` in KiB (Linux): unlike getrusage's, it can be reset.
fn own_peak_rss_kb() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        return String::from_utf8_lossy(&buf[..end]).to_string();
    }
    "unknown".into()
}

