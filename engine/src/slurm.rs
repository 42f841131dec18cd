//! Slurm executor: every launched instance becomes a batch job running
//! `<program> stage exec --store <store> KEY` on a cluster node (this binary or its worker).
//!
//! The store must be on a filesystem shared by the submit host and the nodes. The runner submits
//! an instance only when its inputs are committed, so no `--dependency` chains are needed; ready
//! instances of one stage kind with equal resources are submitted together as one job array.
//! Jobs are polled with `squeue` (throttled); a job that ends in any state but COMPLETED is
//! reported with its state, reason and exit code from `scontrol show job`. Caching is untouched:
//! a killed job leaves an incomplete instance that the next run redoes, and a job that runs twice
//! finds the instance committed (lock + run record) and exits.
//!
//! Resources map as `cpus` → `--cpus-per-task`, `mem` → `--mem`, `gpus` → `--gres=gpu[:type]:N`,
//! `time` → `--time`; partition, account, QoS and extra `sbatch` arguments come from a profile
//! file ([`SlurmProfile`]). This module knows nothing of what stages compute.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::context::{parse_progress, parse_status, ExecStatus};
use super::defs::{parse_toml_file, Resources};
use super::error::{EngineError, Result};
use super::programs::Programs;
use super::runner::{Event, Executor};
use super::spec::{short, InstanceSpec};
use super::store::Store;

/// Cluster settings that do not belong in stage files: where jobs go and how often to poll.
///
/// ```toml
/// partition = "gpu"
/// account = "my-lab"
/// qos = "normal"
/// extra_args = ["--constraint=a100", "--exclusive"]
/// gpu_type = "a100"        # --gres=gpu:a100:N
/// default_time = "04:00:00" # for stages without resources.time
/// default_mem = "8G"        # for stages without resources.mem
/// poll_interval_s = 5
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmProfile {
    /// `--partition` (checked against `sinfo` before anything is submitted).
    pub partition: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// `--qos`.
    pub qos: Option<String>,
    /// Further `sbatch` arguments, passed as given (one argument per item).
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// GPU type in the gres request (`--gres=gpu:TYPE:N`).
    pub gpu_type: Option<String>,
    /// Request `resources.gpus` as `--gres` (false on a cluster without GPU gres: stages run on CPU).
    #[serde(default = "yes")]
    pub request_gpus: bool,
    /// `--time` for stages that declare none (else the partition's default applies).
    pub default_time: Option<String>,
    /// `--mem` for stages that declare none (else the cluster's default applies).
    pub default_mem: Option<String>,
    /// Submit ready instances of one kind with equal resources as one job array.
    #[serde(default = "yes")]
    pub arrays: bool,
    /// Largest job array submitted (clusters cap it with MaxArraySize).
    #[serde(default = "max_array")]
    pub max_array: usize,
    /// Seconds between `squeue` queries.
    #[serde(default = "poll_interval")]
    pub poll_interval_s: f64,
}

fn yes() -> bool {
    true
}
fn max_array() -> usize {
    1000
}
fn poll_interval() -> f64 {
    2.0
}

impl Default for SlurmProfile {
    fn default() -> Self {
        SlurmProfile {
            partition: None,
            account: None,
            qos: None,
            extra_args: Vec::new(),
            gpu_type: None,
            request_gpus: true,
            default_time: None,
            default_mem: None,
            arrays: true,
            max_array: max_array(),
            poll_interval_s: poll_interval(),
        }
    }
}

impl SlurmProfile {
    /// Read a profile file (TOML); errors carry the path and line/column.
    pub fn load(path: &Path) -> Result<SlurmProfile> {
        let p: SlurmProfile = parse_toml_file(path)?;
        if p.max_array == 0 {
            return Err(EngineError::Parse {
                path: path.to_path_buf(),
                message: "max_array must be at least 1".into(),
            });
        }
        if p.poll_interval_s.is_nan() || p.poll_interval_s <= 0.0 {
            return Err(EngineError::Parse {
                path: path.to_path_buf(),
                message: "poll_interval_s must be positive".into(),
            });
        }
        Ok(p)
    }
}

/// Job states after which a job never runs again.
const TERMINAL: &[&str] = &[
    "COMPLETED",
    "FAILED",
    "TIMEOUT",
    "CANCELLED",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
];

/// Pending reasons that never resolve by waiting: the job is cancelled and reported.
const HOPELESS: &[&str] = &[
    "PartitionTimeLimit",
    "PartitionNodeLimit",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "DependencyNeverSatisfied",
];

/// How long a COMPLETED job may wait for its run record to become visible (shared filesystems
/// cache attributes) before it is reported as not committed.
const RECORD_GRACE: Duration = Duration::from_secs(20);

/// After `cancel_all`, jobs still not ended after this long are reported as failed anyway.
const CANCEL_GRACE: Duration = Duration::from_secs(30);

/// One instance waiting to be submitted (at the next poll, grouped into arrays).
struct Pending {
    key: String,
    instance: String,
    kind: String,
    exe: PathBuf,
    resources: Resources,
    force: bool,
}

/// One submitted instance.
struct Job {
    instance: String,
    /// The id `squeue -r` prints: `123` or `123_4` for array task 4.
    id: String,
    /// File that receives what Slurm itself writes (time-limit and cancel notices).
    slurm_out: PathBuf,
    /// Read position in the instance log (for progress lines).
    log_offset: u64,
    state: String,
    completed_at: Option<Instant>,
    /// Its `stage exec` said the instance was already committed by someone else.
    reused: bool,
}

pub struct SlurmExecutor {
    store: Store,
    programs: Programs,
    workdir: PathBuf,
    profile: SlurmProfile,
    pending: Vec<Pending>,
    jobs: BTreeMap<String, Job>,
    events: VecDeque<Event>,
    last_query: Option<Instant>,
    cancelled_at: Option<Instant>,
}

impl SlurmExecutor {
    /// Check that the Slurm tools are there and the controller answers, and that the profile's
    /// partition exists. `store` is made absolute: jobs run elsewhere.
    pub fn new(store: &Store, programs: Programs, profile: SlurmProfile) -> Result<SlurmExecutor> {
        let cluster = |message: String| EngineError::Store {
            path: store.root.clone(),
            message,
        };
        for tool in ["sbatch", "squeue", "scontrol", "scancel", "sinfo"] {
            if find_on_path(tool).is_none() {
                return Err(cluster(format!(
                    "--executor slurm: `{tool}` is not on PATH; run on a Slurm submit host (with the Slurm client tools) \
                     or use --executor local"
                )));
            }
        }
        let parts = tool_output("sinfo", &["-h", "-o", "%R"]).map_err(|e| {
            cluster(format!(
                "--executor slurm: cannot reach the Slurm controller: {e}"
            ))
        })?;
        let parts: Vec<&str> = parts.split_whitespace().collect();
        if let Some(p) = &profile.partition {
            if !parts.contains(&p.as_str()) {
                return Err(cluster(format!(
                    "--executor slurm: unknown Slurm partition `{p}` (the cluster has: {})",
                    if parts.is_empty() {
                        "none".to_string()
                    } else {
                        parts.join(", ")
                    }
                )));
            }
        }
        let root = std::fs::canonicalize(&store.root)
            .map_err(|e| cluster(format!("cannot resolve the store path: {e}")))?;
        let workdir = std::env::current_dir()
            .map_err(|e| cluster(format!("cannot read the current directory: {e}")))?;
        Ok(SlurmExecutor {
            store: Store { root },
            programs,
            workdir,
            profile,
            pending: Vec::new(),
            jobs: BTreeMap::new(),
            events: VecDeque::new(),
            last_query: None,
            cancelled_at: None,
        })
    }

    /// Submit everything pending: one job per group of equal (kind, exe, resources, force).
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut groups: Vec<Vec<Pending>> = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            let slot = groups.iter_mut().find(|g| {
                let h = &g[0];
                self.profile.arrays
                    && g.len() < self.profile.max_array
                    && h.kind == p.kind
                    && h.exe == p.exe
                    && h.resources == p.resources
                    && h.force == p.force
            });
            match slot {
                Some(g) => g.push(p),
                None => groups.push(vec![p]),
            }
        }
        for g in groups {
            if let Err(message) = self.submit(&g) {
                for p in g {
                    self.events.push_back(Event::Finished {
                        key: p.key,
                        ok: false,
                        message: message.clone(),
                        reused: false,
                    });
                }
            }
        }
    }

    /// The `sbatch` arguments for a group (without `--array`).
    fn sbatch_args(&self, head: &Pending, n: usize) -> Vec<String> {
        let r = &head.resources;
        let logs = self.store.root.join("logs");
        let out = if n > 1 {
            "slurm-%A_%a.out"
        } else {
            "slurm-%j.out"
        };
        let name = if n > 1 {
            format!("rredcot:{}[{n}]", head.kind)
        } else {
            format!("rredcot:{}", head.instance)
        };
        let mut a = vec![
            "--parsable".to_string(),
            format!("--job-name={name}"),
            format!("--chdir={}", self.workdir.display()),
            format!("--output={}", logs.join(out).display()),
            "--open-mode=append".into(),
            "--nodes=1".into(),
            "--ntasks=1".into(),
            format!("--cpus-per-task={}", r.cpus.max(1)),
        ];
        if let Some(m) = r.mem.as_ref().or(self.profile.default_mem.as_ref()) {
            a.push(format!("--mem={}", slurm_mem(m)));
        }
        if let Some(t) = r.time.as_ref().or(self.profile.default_time.as_ref()) {
            a.push(format!("--time={t}"));
        }
        if r.gpus > 0 && self.profile.request_gpus {
            match &self.profile.gpu_type {
                Some(t) => a.push(format!("--gres=gpu:{t}:{}", r.gpus)),
                None => a.push(format!("--gres=gpu:{}", r.gpus)),
            }
        }
        if let Some(p) = &self.profile.partition {
            a.push(format!("--partition={p}"));
        }
        if let Some(acc) = &self.profile.account {
            a.push(format!("--account={acc}"));
        }
        if let Some(q) = &self.profile.qos {
            a.push(format!("--qos={q}"));
        }
        a.extend(self.profile.extra_args.iter().cloned());
        if n > 1 {
            a.push(format!("--array=0-{}", n - 1));
        }
        a
    }

    fn submit(&mut self, group: &[Pending]) -> std::result::Result<(), String> {
        let head = &group[0];
        let n = group.len();
        let args = self.sbatch_args(head, n);
        let script = batch_script(
            &self.store.root,
            &head.exe,
            head.force,
            &group.iter().map(|p| p.key.as_str()).collect::<Vec<_>>(),
        );
        let names = group
            .iter()
            .map(|p| p.instance.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        // sbatch reads the script from a file, not a pipe: a sbatch that exits before reading
        // (a rejected flag) would otherwise end this process with SIGPIPE, which the CLI leaves
        // at its default. Slurm keeps its own copy at submission, so the file goes right after.
        let tmp = self.store.root.join("tmp");
        let path = tmp.join(format!("sbatch-{}.{}.sh", &head.key[..head.key.len().min(16)], std::process::id()));
        std::fs::create_dir_all(&tmp)
            .and_then(|()| std::fs::write(&path, script.as_bytes()))
            .map_err(|e| format!("writing the job script {}: {e}", path.display()))?;
        let out = Command::new("sbatch")
            .args(&args)
            .arg(&path)
            .stdin(Stdio::null())
            .output();
        let _ = std::fs::remove_file(&path);
        let out = out.map_err(|e| format!("cannot run sbatch for {names}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "sbatch rejected the job for {names} ({}): {}\n  sbatch {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                args.join(" ")
            ));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let job_id = stdout.trim().split(';').next().unwrap_or("").to_string();
        if job_id.is_empty() || !job_id.chars().all(|c| c.is_ascii_digit()) {
            return Err(format!(
                "sbatch printed no job id for {names}: {:?}",
                stdout.trim()
            ));
        }
        let logs = self.store.root.join("logs");
        for (i, p) in group.iter().enumerate() {
            let (id, out) = if n > 1 {
                (
                    format!("{job_id}_{i}"),
                    logs.join(format!("slurm-{job_id}_{i}.out")),
                )
            } else {
                (job_id.clone(), logs.join(format!("slurm-{job_id}.out")))
            };
            let log_offset = std::fs::metadata(self.store.log_path(&p.key))
                .map(|m| m.len())
                .unwrap_or(0);
            self.events.push_back(Event::Progress {
                key: p.key.clone(),
                pos: 0,
                len: 1,
                message: format!("Slurm job {id} submitted"),
            });
            self.jobs.insert(
                p.key.clone(),
                Job {
                    instance: p.instance.clone(),
                    id,
                    slurm_out: out,
                    log_offset,
                    state: "SUBMITTED".into(),
                    completed_at: None,
                    reused: false,
                },
            );
        }
        tracing::info!(job = %job_id, instances = %names, "submitted");
        Ok(())
    }

    /// Ask Slurm about every job not yet reported, and turn state changes into events.
    fn query(&mut self) {
        if self.jobs.is_empty() {
            return;
        }
        let mut ids: Vec<&str> = self
            .jobs
            .values()
            .map(|j| j.id.split('_').next().unwrap_or(&j.id))
            .collect();
        ids.sort();
        ids.dedup();
        let list = ids.join(",");
        let states: BTreeMap<String, (String, String)> = match tool_output(
            "squeue",
            &["-h", "-r", "-t", "all", "-j", &list, "-o", "%i|%T|%r"],
        ) {
            Ok(text) => text
                .lines()
                .filter_map(|l| {
                    let mut f = l.trim().splitn(3, '|');
                    Some((
                        f.next()?.to_string(),
                        (f.next()?.to_string(), f.next().unwrap_or("").to_string()),
                    ))
                })
                .collect(),
            // squeue fails when none of the ids is known any more (all purged).
            Err(e) if e.contains("Invalid job id") => BTreeMap::new(),
            Err(e) => {
                tracing::warn!("squeue failed (will retry): {e}");
                return;
            }
        };
        let keys: Vec<String> = self.jobs.keys().cloned().collect();
        for key in keys {
            let job = self.jobs.get_mut(&key).expect("job");
            let (state, reason) = match states.get(&job.id) {
                Some((s, r)) => (s.clone(), r.clone()),
                None => ("GONE".to_string(), String::new()),
            };
            if state == "PENDING" && HOPELESS.contains(&reason.as_str()) {
                let _ = tool_output("scancel", &[&job.id]);
                let message =
                    format!("Slurm job {} cannot start: pending with reason {reason} (check the profile and resources.time/mem/gpus)", job.id);
                self.finish(&key, false, message);
                continue;
            }
            if state != job.state && !TERMINAL.contains(&state.as_str()) && state != "GONE" {
                job.state = state.clone();
                let what = if reason.is_empty() || reason == "None" {
                    state.clone()
                } else {
                    format!("{state} ({reason})")
                };
                self.events.push_back(Event::Progress {
                    key: key.clone(),
                    pos: 0,
                    len: 1,
                    message: format!("Slurm job {} {what}", job.id),
                });
            }
            match state.as_str() {
                "COMPLETED" => {
                    if self.store.record(&key).is_some() {
                        self.finish(&key, true, String::new());
                    } else {
                        let job = self.jobs.get_mut(&key).expect("job");
                        let since = *job.completed_at.get_or_insert_with(Instant::now);
                        if since.elapsed() > RECORD_GRACE {
                            let id = job.id.clone();
                            self.finish(
                                &key,
                                false,
                                format!("Slurm job {id} COMPLETED but the instance has no run record (is the store on a filesystem the nodes share?)"),
                            );
                        }
                    }
                }
                "GONE" => {
                    // Purged from the controller (MinJobAge) before we saw it end: the store decides.
                    let id = job.id.clone();
                    let acct = sacct_state(&id);
                    if self.store.record(&key).is_some() {
                        self.finish(&key, true, String::new());
                    } else {
                        let how = acct
                            .map(|s| format!("ended {s}"))
                            .unwrap_or_else(|| "is no longer known to Slurm".into());
                        self.finish(
                            &key,
                            false,
                            format!("Slurm job {id} {how} and the instance is not committed"),
                        );
                    }
                }
                s if TERMINAL.contains(&s) && self.store.record(&key).is_some() => {
                    // The stage exited 0 and committed; Slurm still flags the job when one of its
                    // child processes was killed (e.g. OOM of a subprocess the stage survived).
                    let id = job.id.clone();
                    eprintln!("warning: Slurm job {id} ended {s}, but its stage exited 0 and committed the instance");
                    self.finish(&key, true, String::new());
                }
                s if TERMINAL.contains(&s) => {
                    let id = job.id.clone();
                    let said = std::fs::read_to_string(&job.slurm_out).unwrap_or_default();
                    let message = describe_failure(&id, s, &said);
                    self.finish(&key, false, message);
                }
                _ => {}
            }
        }
    }

    /// Report a job's end: move Slurm's own output into the instance log, emit the event.
    fn finish(&mut self, key: &str, ok: bool, message: String) {
        let Some(mut job) = self.jobs.remove(key) else {
            return;
        };
        // The last lines of the log may say that the instance was reused.
        scan_log(&self.store, key, &mut job, &mut self.events);
        if let Ok(text) = std::fs::read_to_string(&job.slurm_out) {
            if !text.trim().is_empty() {
                if let Ok(mut f) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.store.log_path(key))
                {
                    let _ = f.write_all(text.as_bytes());
                }
            }
        }
        let _ = std::fs::remove_file(&job.slurm_out);
        if !ok {
            tracing::info!(instance = %job.instance, key = %short(key), job = %job.id, "{message}");
        }
        self.events.push_back(Event::Finished {
            key: key.to_string(),
            ok,
            message,
            reused: job.reused,
        });
    }

    /// Progress and status lines the stages wrote to their logs since the last look.
    fn read_progress(&mut self) {
        for (key, job) in self.jobs.iter_mut() {
            scan_log(&self.store, key, job, &mut self.events);
        }
    }
}

/// Turn the progress and status lines a job wrote to its instance log since `job.log_offset`
/// into events (the last progress line only).
fn scan_log(store: &Store, key: &str, job: &mut Job, events: &mut VecDeque<Event>) {
    let path = store.log_path(key);
    let Ok(mut f) = std::fs::File::open(&path) else {
        return;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len <= job.log_offset || f.seek(SeekFrom::Start(job.log_offset)).is_err() {
        return;
    }
    let mut buf = Vec::new();
    if f.take(len - job.log_offset).read_to_end(&mut buf).is_err() {
        return;
    }
    // Only whole lines; a partial last line is read again next time.
    let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
        return;
    };
    job.log_offset += end as u64 + 1;
    let text = String::from_utf8_lossy(&buf[..end]);
    for line in text.lines() {
        match parse_status(line) {
            Some(ExecStatus::Waiting) => events.push_back(Event::Waiting {
                key: key.to_string(),
            }),
            Some(ExecStatus::Reused) => job.reused = true,
            None => {}
        }
    }
    if let Some((pos, len, message)) = text.lines().rev().find_map(parse_progress) {
        events.push_back(Event::Progress {
            key: key.to_string(),
            pos,
            len,
            message,
        });
    }
}

impl Executor for SlurmExecutor {
    fn launch(&mut self, spec: &InstanceSpec, _gpu_ids: &[usize], force: bool) -> Result<()> {
        let exe = self.programs.for_runner(&spec.runner).map_err(|message| EngineError::Instance {
            key: short(&spec.key).to_string(),
            stage: spec.instance.clone(),
            message,
        })?;
        let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
        self.pending.push(Pending {
            key: spec.key.clone(),
            instance: spec.instance.clone(),
            kind: spec.kind.clone(),
            exe,
            resources: spec.resources.clone(),
            force,
        });
        Ok(())
    }

    fn poll(&mut self, timeout: Duration) -> Vec<Event> {
        if self.cancelled_at.is_none() {
            self.flush();
        }
        if self.events.is_empty() {
            let interval = Duration::from_secs_f64(self.profile.poll_interval_s);
            let due = self
                .last_query
                .map(|t| interval.saturating_sub(t.elapsed()))
                .unwrap_or(Duration::ZERO);
            if due > timeout {
                std::thread::sleep(timeout);
                self.read_progress();
            } else {
                std::thread::sleep(due);
                self.last_query = Some(Instant::now());
                self.read_progress();
                self.query();
                if let Some(t) = self.cancelled_at {
                    if t.elapsed() > CANCEL_GRACE {
                        for key in self.jobs.keys().cloned().collect::<Vec<_>>() {
                            let id = self.jobs[&key].id.clone();
                            self.finish(&key, false, format!("cancelled; Slurm job {id} did not end within {CANCEL_GRACE:?} (check squeue)"));
                        }
                    }
                }
            }
        }
        self.events.drain(..).collect()
    }

    /// `scancel` once (a second Ctrl-C changes nothing: Slurm escalates to SIGKILL itself).
    fn cancel_all(&mut self, _force: bool) {
        if self.cancelled_at.is_some() {
            return;
        }
        for p in std::mem::take(&mut self.pending) {
            self.events.push_back(Event::Finished {
                key: p.key,
                ok: false,
                message: "cancelled before submission".into(),
                reused: false,
            });
        }
        let mut ids: Vec<String> = self.jobs.values().map(|j| j.id.clone()).collect();
        ids.sort();
        ids.dedup();
        if !ids.is_empty() {
            let args: Vec<&str> = ids.iter().map(String::as_str).collect();
            match tool_output("scancel", &args) {
                Ok(_) => eprintln!("scancel: cancelled Slurm jobs {}", ids.join(" ")),
                Err(e) => eprintln!("scancel {} failed: {e}", ids.join(" ")),
            }
        }
        self.cancelled_at = Some(Instant::now());
        self.last_query = None;
    }
}

/// The batch script: pick this task's key, send all output to the instance log, exec the stage.
fn batch_script(store: &Path, exe: &Path, force: bool, keys: &[&str]) -> String {
    let logs = store.join("logs");
    format!(
        "#!/bin/sh\n\
         # rredcot: {n} stage instance(s); array task i runs key i\n\
         set -- {keys}\n\
         shift \"${{SLURM_ARRAY_TASK_ID:-0}}\"\n\
         key=\"$1\"\n\
         exec >>{logs}/\"$key\".log 2>&1\n\
         echo \"rredcot: Slurm job ${{SLURM_JOB_ID}} on $(hostname) runs $key\"\n\
         exec {exe} stage exec --store {store}{force} \"$key\"\n",
        n = keys.len(),
        keys = keys.join(" "),
        logs = sh_quote(&logs.to_string_lossy()),
        exe = sh_quote(&exe.to_string_lossy()),
        store = sh_quote(&store.to_string_lossy()),
        force = if force { " --force" } else { "" },
    )
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// `4GB`/`4GiB`/`4g` → `4G` (sbatch takes K, M, G, T suffixes); plain numbers are megabytes.
fn slurm_mem(m: &str) -> String {
    let t = m.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| t.strip_suffix('B'))
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(t);
    t.to_ascii_uppercase()
}

/// "FAILED (reason NonZeroExitCode, exit code 1:0, ran 00:00:02 of 01:00:00 on node-3)", from
/// `scontrol show job`, with a hint for limits. `slurm_said` is what Slurm wrote to the job's
/// output: without cgroups, a job killed for memory ends FAILED and only that text says why.
fn describe_failure(id: &str, state: &str, slurm_said: &str) -> String {
    let fields: BTreeMap<String, String> = tool_output("scontrol", &["show", "job", "-o", id])
        .map(|t| {
            t.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    let state = fields.get("JobState").map(String::as_str).unwrap_or(state);
    let mut parts = Vec::new();
    if let Some(r) = fields.get("Reason").filter(|r| r.as_str() != "None") {
        parts.push(format!("reason {r}"));
    }
    if let Some(c) = fields.get("ExitCode") {
        parts.push(format!("exit code {c}"));
    }
    if let (Some(run), Some(lim)) = (fields.get("RunTime"), fields.get("TimeLimit")) {
        parts.push(format!("ran {run} of limit {lim}"));
    }
    if let Some(n) = fields.get("NodeList").filter(|n| n.as_str() != "(null)") {
        parts.push(format!("on {n}"));
    }
    let mem_limit = fields.get("MinMemoryNode").or(fields.get("MinMemoryCPU")).map(String::as_str);
    let over_mem = memory_kill(state, fields.get("ExitCode").map(String::as_str), slurm_said, mem_limit);
    if let Some(how) = over_mem {
        let mem = mem_limit.map(|m| format!(" of {m}")).unwrap_or_default();
        parts.insert(0, format!("{how} for exceeding its memory limit{mem}"));
    }
    let hint = match state {
        _ if over_mem.is_some() => "; raise resources.mem in the stage file (or default_mem in the profile)",
        "TIMEOUT" => "; raise resources.time in the stage file (or default_time in the profile)",
        "NODE_FAIL" | "PREEMPTED" | "BOOT_FAIL" => "; rerun to redo it",
        _ => "",
    };
    let detail = if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    };
    format!("Slurm job {id} ended {state}{detail}; the instance is left incomplete{hint}")
}

/// How a failed job was killed for memory, if it was: "killed" when Slurm says so (state
/// OUT_OF_MEMORY, or "exceeded job memory limit" in its output), "killed by SIGKILL, likely" when
/// a job with a memory limit ended on signal 9 (exit code `N:9`) and Slurm said nothing more:
/// without cgroups its sampling enforcer kills that way, and a kill early in the step's life
/// reads FAILED with reason JobLaunchFailure and no message (seen on the test cluster under load).
fn memory_kill(state: &str, exit_code: Option<&str>, slurm_said: &str, mem_limit: Option<&str>) -> Option<&'static str> {
    if state == "OUT_OF_MEMORY" || slurm_said.to_ascii_lowercase().contains("exceeded job memory limit") {
        return Some("killed");
    }
    let sigkill = exit_code.and_then(|c| c.split_once(':')).is_some_and(|(_, sig)| sig == "9");
    // "50M" is a limit, "0" (or "0M") none.
    let limited = mem_limit.is_some_and(|m| m.trim_start_matches('0').starts_with(|c: char| c.is_ascii_digit()));
    (state == "FAILED" && sigkill && limited).then_some("killed by SIGKILL, likely")
}

/// The job's final state from accounting, where the cluster keeps it.
fn sacct_state(id: &str) -> Option<String> {
    let out = tool_output(
        "sacct",
        &["-n", "-X", "-P", "-j", id, "-o", "State,ExitCode"],
    )
    .ok()?;
    let line = out.lines().next()?.trim();
    (!line.is_empty()).then(|| line.replace('|', " exit code "))
}

/// Run a Slurm tool; Ok(stdout) or Err("<tool> failed (status): stderr").
fn tool_output(tool: &str, args: &[&str]) -> std::result::Result<String, String> {
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {tool}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(format!(
            "{tool} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn find_on_path(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(kind: &str, res: Resources) -> Pending {
        Pending {
            key: "k".into(),
            instance: "inst".into(),
            kind: kind.into(),
            exe: "/bin/rredcot".into(),
            resources: res,
            force: false,
        }
    }

    fn exec(profile: SlurmProfile) -> SlurmExecutor {
        SlurmExecutor {
            store: Store {
                root: "/shared/store".into(),
            },
            programs: Programs::at("/bin/rredcot".into(), &crate::Runtime { catalog: &crate::catalog::EMPTY, worker: "worker", versions: BTreeMap::new, after_instance: crate::exec::keep_serving }),
            workdir: "/work".into(),
            profile,
            pending: Vec::new(),
            jobs: BTreeMap::new(),
            events: VecDeque::new(),
            last_query: None,
            cancelled_at: None,
        }
    }

    #[test]
    fn resources_map_to_sbatch_args() {
        let p = SlurmProfile {
            partition: Some("gpu".into()),
            account: Some("lab".into()),
            gpu_type: Some("a100".into()),
            extra_args: vec!["--exclusive".into()],
            ..Default::default()
        };
        let res = Resources {
            cpus: 4,
            gpus: 2,
            mem: Some("16GB".into()),
            time: Some("02:00:00".into()),
        };
        let a = exec(p).sbatch_args(&pending("rollout", res), 3);
        for want in [
            "--cpus-per-task=4",
            "--mem=16G",
            "--time=02:00:00",
            "--gres=gpu:a100:2",
            "--partition=gpu",
            "--account=lab",
            "--exclusive",
            "--array=0-2",
            "--output=/shared/store/logs/slurm-%A_%a.out",
            "--job-name=rredcot:rollout[3]",
        ] {
            assert!(a.contains(&want.to_string()), "{want} missing from {a:?}");
        }
    }

    #[test]
    fn defaults_apply_and_gpus_can_be_left_out() {
        let p = SlurmProfile {
            default_time: Some("10".into()),
            default_mem: Some("1G".into()),
            request_gpus: false,
            ..Default::default()
        };
        let res = Resources {
            cpus: 0,
            gpus: 1,
            mem: None,
            time: None,
        };
        let a = exec(p).sbatch_args(&pending("x", res), 1);
        assert!(a.contains(&"--cpus-per-task=1".to_string()));
        assert!(a.contains(&"--time=10".to_string()) && a.contains(&"--mem=1G".to_string()));
        assert!(
            !a.iter()
                .any(|x| x.starts_with("--gres") || x.starts_with("--array")),
            "{a:?}"
        );
        assert!(a.contains(&"--output=/shared/store/logs/slurm-%j.out".to_string()));
    }

    #[test]
    fn script_selects_key_by_array_index() {
        // A store path with a space, and a fake exe that prints its arguments.
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("st ore");
        std::fs::create_dir_all(store.join("logs")).unwrap();
        let s = batch_script(&store, Path::new("/bin/echo"), true, &["aaa", "bbb", "ccc"]);
        for (i, k) in ["aaa", "bbb", "ccc"].iter().enumerate() {
            let st = Command::new("sh")
                .arg("-c")
                .arg(&s)
                .env("SLURM_ARRAY_TASK_ID", i.to_string())
                .status()
                .unwrap();
            assert!(st.success());
            let log = std::fs::read_to_string(store.join("logs").join(format!("{k}.log"))).unwrap();
            assert!(
                log.contains(&format!(
                    "stage exec --store {} --force {k}",
                    store.display()
                )),
                "{log}"
            );
        }
    }

    #[test]
    fn a_memory_kill_is_named_from_the_state_the_output_or_a_sigkill_under_a_limit() {
        assert_eq!(memory_kill("OUT_OF_MEMORY", Some("0:125"), "", Some("50M")), Some("killed"));
        assert_eq!(memory_kill("FAILED", Some("0:9"), "slurmstepd: error: Exceeded job memory limit", Some("50M")), Some("killed"));
        assert_eq!(memory_kill("FAILED", Some("0:9"), "", Some("50M")), Some("killed by SIGKILL, likely"));
        // No limit (0 = none), another signal, a plain exit code or a cancel: not memory.
        assert_eq!(memory_kill("FAILED", Some("0:9"), "", Some("0")), None);
        assert_eq!(memory_kill("FAILED", Some("0:9"), "", None), None);
        assert_eq!(memory_kill("FAILED", Some("0:15"), "", Some("50M")), None);
        assert_eq!(memory_kill("FAILED", Some("1:0"), "", Some("50M")), None);
        assert_eq!(memory_kill("CANCELLED", Some("0:9"), "", Some("50M")), None);
    }

    #[test]
    fn mem_units() {
        assert_eq!(slurm_mem("4GB"), "4G");
        assert_eq!(slurm_mem("512MiB"), "512M");
        assert_eq!(slurm_mem("2g"), "2G");
        assert_eq!(slurm_mem("1000"), "1000");
    }

    #[test]
    fn profile_rejects_unknown_fields() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.toml");
        std::fs::write(&f, "partiton = \"x\"\n").unwrap();
        let e = SlurmProfile::load(&f).unwrap_err().to_string();
        assert!(e.contains("p.toml") && e.contains("partiton"), "{e}");
        std::fs::write(&f, "partition = \"x\"\narrays = false\nmax_array = 10\n").unwrap();
        let p = SlurmProfile::load(&f).unwrap();
        assert_eq!(p.partition.as_deref(), Some("x"));
        assert!(!p.arrays);
    }
}
