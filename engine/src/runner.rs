//! Running a pipeline: select the targets (planning), resolve keys in topological order and serve
//! cached instances from the store (`cache`), launch the rest through an executor (local
//! processes or Slurm jobs) within the `-j` and GPU budgets (scheduling), and report progress
//! (`display`).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::error::{EngineError, Result};
use super::group as signals;
use super::plan::Plan;
use super::record::RunRecord;
use super::cache::{lookup, why_not_cached, Lookup, Refs};
use super::display::Ui;
use super::file_hashes::FileHashes;
use super::resolve::Resolver;
use super::spec::{short, InstanceSpec};
use super::store::Store;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub jobs: usize,
    pub until: Vec<String>,
    pub force: Vec<String>,
    pub dry_run: bool,
    pub keep_going: bool,
    /// GPUs on this machine (0: GPU stages run on CPU without a device slot).
    pub gpus: usize,
    pub verbose: bool,
}

/// What a launched instance reports.
pub enum Event {
    Progress {
        key: String,
        pos: u64,
        len: u64,
        message: String,
    },
    /// Its `stage exec` waits for the instance lock (another process is writing the instance).
    Waiting { key: String },
    /// `reused`: the instance was committed by another process; nothing ran.
    Finished {
        key: String,
        ok: bool,
        message: String,
        reused: bool,
    },
}

/// Where instances run: local child processes or cluster jobs. Each runs `stage exec KEY`.
pub trait Executor {
    fn launch(&mut self, spec: &InstanceSpec, gpu_ids: &[usize], force: bool) -> Result<()>;
    /// Wait up to `timeout` for events.
    fn poll(&mut self, timeout: Duration) -> Vec<Event>;
    /// Stop everything launched (SIGTERM, or SIGKILL with `force`: a second Ctrl-C).
    fn cancel_all(&mut self, force: bool);
}

#[derive(Debug, Default, Serialize)]
pub struct RunSummary {
    pub pipeline: String,
    pub ran: Vec<String>,
    pub cached: Vec<String>,
    /// Instances another process (a second run on the store, or a stage of this pipeline with the
    /// same key) committed while this run waited for them: nothing ran here.
    pub reused: Vec<String>,
    pub failed: Vec<String>,
    /// Instances not run because an upstream failed or the run was interrupted.
    pub not_run: Vec<String>,
    /// Dry run: instances that would run, with reasons.
    pub would_run: Vec<(String, Vec<String>)>,
    /// Sum of the counters of the instances that ran in this invocation.
    pub counters: BTreeMap<String, i64>,
    /// The same sums per stage kind: a counter of one name means different things in different
    /// kinds (a rollout's `thinking_unclosed` counts its samples, an eval's its own).
    pub counters_by_kind: BTreeMap<String, BTreeMap<String, i64>>,
    pub interrupted: bool,
    /// The signal that interrupted the run (2 = SIGINT, 15 = SIGTERM); exit code 128 + it.
    pub signal: Option<i32>,
    pub wall_s: f64,
    /// instance name -> key, for every instance resolved in this run.
    pub keys: BTreeMap<String, String>,
}

#[derive(Clone)]
enum State {
    Waiting,
    Queued(Box<InstanceSpec>),
    Running(Box<InstanceSpec>, Vec<usize>),
    Done,
    /// Dry run: would run, outputs unknown.
    Unknown,
    Failed,
    Blocked,
}

pub fn detect_gpus() -> usize {
    if let Ok(n) = std::env::var("RREDCOT_GPUS") {
        return n.parse().unwrap_or(0);
    }
    if let Ok(v) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return v
            .split(',')
            .filter(|s| !s.trim().is_empty() && s.trim() != "-1")
            .count();
    }
    std::fs::read_dir("/dev")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().to_string();
                    n.strip_prefix("nvidia")
                        .map(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_digit()))
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

pub fn run_pipeline(plan: &Plan, store: &Store, opts: &RunOptions, exec: &mut dyn Executor) -> Result<RunSummary> {
    let t0 = Instant::now();
    let selection = Selection::of(plan, opts)?;
    let mut run = Scheduler::new(plan, store, opts, selection);
    loop {
        run.resolve_ready()?;
        run.handle_signals(exec);
        if !run.stop_launching {
            run.launch_ready(exec)?;
        }
        if run.running == 0 && (run.queue.is_empty() || run.stop_launching) {
            break;
        }
        for ev in exec.poll(Duration::from_millis(100)) {
            run.on_event(ev);
        }
    }
    run.finish(t0)
}

/// Planning: which nodes this run targets (`--until` and their ancestors) and which are forced.
struct Selection {
    targets: Vec<bool>,
    forced: Vec<bool>,
}

impl Selection {
    fn of(plan: &Plan, opts: &RunOptions) -> Result<Selection> {
        let n = plan.nodes.len();
        let matching = |pattern: &String| {
            let m = plan.matching(pattern);
            if m.is_empty() {
                Err(EngineError::NoSuchStage { name: pattern.clone(), known: plan.stage_names() })
            } else {
                Ok(m)
            }
        };
        let targets = if opts.until.is_empty() {
            vec![true; n]
        } else {
            let mut sel = Vec::new();
            for u in &opts.until {
                sel.extend(matching(u)?);
            }
            plan.with_ancestors(&sel)
        };
        let mut forced = vec![false; n];
        for f in &opts.force {
            for i in matching(f)? {
                forced[i] = true;
            }
        }
        Ok(Selection { targets, forced })
    }
}

/// Scheduling: the state of every node, the launch queue and the CPU/GPU budgets of one run.
struct Scheduler<'a> {
    plan: &'a Plan,
    store: &'a Store,
    opts: &'a RunOptions,
    sel: Selection,
    resolver: Resolver<'a>,
    ups: Vec<Vec<usize>>,
    refs: Refs,
    states: Vec<State>,
    done_recs: Vec<Option<Arc<RunRecord>>>,
    summary: RunSummary,
    ui: Ui,
    queue: VecDeque<usize>,
    cpu_free: usize,
    gpu_free: Vec<usize>,
    running: usize,
    stop_launching: bool,
    signals_seen: u32,
}

impl<'a> Scheduler<'a> {
    fn new(plan: &'a Plan, store: &'a Store, opts: &'a RunOptions, sel: Selection) -> Scheduler<'a> {
        let n = plan.nodes.len();
        // A dry run writes nothing, remembered hashes included.
        let resolver = Resolver::new(plan, FileHashes::in_store(&store.root, !opts.dry_run));
        let ups = (0..n).map(|i| resolver.upstream(i)).collect();
        let total = sel.targets.iter().filter(|t| **t).count() as u64;
        Scheduler {
            plan,
            store,
            opts,
            sel,
            resolver,
            ups,
            refs: Refs::read(store, &plan.name),
            states: vec![State::Waiting; n],
            done_recs: vec![None; n],
            summary: RunSummary { pipeline: plan.name.clone(), ..Default::default() },
            ui: Ui::new(total),
            queue: VecDeque::new(),
            cpu_free: opts.jobs.max(1),
            gpu_free: (0..opts.gpus).collect(),
            running: 0,
            stop_launching: false,
            signals_seen: 0,
        }
    }

    /// The node running an instance with this key.
    fn running_index(&self, key: &str) -> Option<usize> {
        self.states.iter().position(|s| matches!(s, State::Running(sp, _) if sp.key == key))
    }

    /// Resolve every waiting node whose upstream is settled: blocked, unknown (dry run), cached,
    /// or queued to run.
    fn resolve_ready(&mut self) -> Result<()> {
        let mut progressed = true;
        while progressed {
            progressed = false;
            for &i in &self.plan.order {
                if !self.sel.targets[i] || !matches!(self.states[i], State::Waiting) {
                    continue;
                }
                let name = self.plan.nodes[i].name.clone();
                if self.ups[i].iter().any(|&u| matches!(self.states[u], State::Failed | State::Blocked)) {
                    self.states[i] = State::Blocked;
                    self.summary.not_run.push(name);
                    progressed = true;
                    continue;
                }
                if let Some(&u) = self.ups[i].iter().find(|&&u| matches!(self.states[u], State::Unknown)) {
                    self.states[i] = State::Unknown;
                    self.summary.would_run.push((name, vec![format!("upstream `{}` will run", self.plan.nodes[u].name)]));
                    progressed = true;
                    continue;
                }
                if !self.ups[i].iter().all(|&u| matches!(self.states[u], State::Done)) {
                    continue;
                }
                let spec = self.resolver.spec(i, &self.done_recs)?;
                self.summary.keys.insert(name.clone(), spec.key.clone());
                progressed = true;
                let ui = &self.ui;
                let found = lookup(self.store, &spec, self.sel.forced[i], self.opts.dry_run, &|l| ui.line(l))?;
                let rec = match found {
                    Lookup::Reused(rec) => {
                        self.ui.line(&format!("reused   {name} ({}): committed by another process while this run waited", short(&spec.key)));
                        self.summary.reused.push(name.clone());
                        Some(rec)
                    }
                    Lookup::Cached(rec) => {
                        if self.opts.verbose {
                            self.ui.line(&format!("cached   {name} ({})", short(&spec.key)));
                        }
                        self.summary.cached.push(name.clone());
                        Some(rec)
                    }
                    Lookup::Miss => None,
                };
                if let Some(rec) = rec {
                    self.refs.note(&spec);
                    self.done_recs[i] = Some(Arc::new(rec));
                    self.states[i] = State::Done;
                    self.ui.done(&spec.key);
                } else if self.opts.dry_run {
                    let mut why = why_not_cached(self.store, &self.refs.entries, &spec);
                    if self.sel.forced[i] {
                        why.insert(0, "forced".into());
                    }
                    self.summary.would_run.push((name, why));
                    self.states[i] = State::Unknown;
                } else {
                    if self.opts.verbose || self.refs.entries.contains_key(&spec.instance) {
                        let why = if self.sel.forced[i] { vec!["forced".to_string()] } else { why_not_cached(self.store, &self.refs.entries, &spec) };
                        tracing::info!(stage = %spec.instance, key = %short(&spec.key), "will run: {}", why.join("; "));
                    }
                    self.states[i] = State::Queued(Box::new(spec));
                    self.queue.push_back(i);
                }
            }
        }
        Ok(())
    }

    /// A first Ctrl-C/SIGTERM stops launching and cancels what runs; a second one kills it.
    fn handle_signals(&mut self, exec: &mut dyn Executor) {
        let Some(sig) = signals::received() else { return };
        if !self.summary.interrupted {
            self.stop_launching = true;
            self.summary.interrupted = true;
            self.summary.signal = Some(sig);
            self.ui.line(&format!(
                "interrupted ({}): stopping running stages (finished stages are kept; rerun to resume; a second signal kills them)",
                signals::signal_name(sig)
            ));
            exec.cancel_all(false);
            self.signals_seen = signals::count();
        } else if signals::count() > self.signals_seen {
            self.signals_seen = signals::count();
            exec.cancel_all(true);
        }
    }

    /// Launch what fits the CPU and GPU budgets, in queue order.
    fn launch_ready(&mut self, exec: &mut dyn Executor) -> Result<()> {
        let mut deferred = VecDeque::new();
        while let Some(i) = self.queue.pop_front() {
            let State::Queued(spec) = self.states[i].clone() else {
                continue;
            };
            // Another stage of this pipeline with the same key is running: wait for it and
            // reuse its result instead of launching a second writer.
            if self.running_index(&spec.key).is_some() {
                deferred.push_back(i);
                continue;
            }
            let cpus = self.cpus_of(&spec);
            let gpus = if self.opts.gpus == 0 { 0 } else { spec.resources.gpus as usize };
            if gpus > self.opts.gpus {
                return Err(EngineError::Instance {
                    key: short(&spec.key).into(),
                    stage: spec.instance.clone(),
                    message: format!("needs {gpus} GPUs but this machine has {}", self.opts.gpus),
                });
            }
            if cpus > self.cpu_free || gpus > self.gpu_free.len() {
                deferred.push_back(i);
                continue;
            }
            self.cpu_free -= cpus;
            let ids: Vec<usize> = self.gpu_free.drain(..gpus).collect();
            if spec.git_rev.is_none() {
                let mut s = (*spec).clone();
                s.git_rev = self.resolver.git_rev();
                self.store.write_spec(&s)?;
            } else {
                self.store.write_spec(&spec)?;
            }
            self.ui.line(&format!("run      {} ({})", spec.instance, short(&spec.key)));
            exec.launch(&spec, &ids, self.sel.forced[i])?;
            self.running += 1;
            self.states[i] = State::Running(spec, ids);
        }
        self.queue = deferred;
        Ok(())
    }

    fn cpus_of(&self, spec: &InstanceSpec) -> usize {
        (spec.resources.cpus.max(1) as usize).min(self.opts.jobs.max(1))
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Progress { key, pos, len, message } => {
                if let Some(i) = self.running_index(&key) {
                    self.ui.progress(&key, &self.plan.nodes[i].name, pos, len, &message);
                }
            }
            Event::Waiting { key } => {
                if let Some(i) = self.running_index(&key) {
                    self.ui.line(&format!(
                        "waiting  {} ({}): another process is writing this instance; will reuse its output (or run it, if that process ends without committing)",
                        self.plan.nodes[i].name,
                        short(&key)
                    ));
                }
            }
            Event::Finished { key, ok, message, reused } => self.on_finished(&key, ok, &message, reused),
        }
    }

    fn on_finished(&mut self, key: &str, ok: bool, message: &str, reused: bool) {
        let Some(i) = self.running_index(key) else {
            return;
        };
        let State::Running(spec, ids) = self.states[i].clone() else {
            return;
        };
        self.running -= 1;
        self.cpu_free += self.cpus_of(&spec);
        self.gpu_free.extend(ids);
        self.gpu_free.sort();
        self.ui.done(key);
        let rec = if ok { self.store.record(key) } else { None };
        match rec {
            Some(rec) => {
                if reused {
                    self.ui.line(&format!("reused   {} ({}): committed by another process while this run waited", spec.instance, short(key)));
                    self.summary.reused.push(spec.instance.clone());
                } else {
                    self.ui.line(&format!("done     {} ({}) in {:.2}s", spec.instance, short(key), rec.wall_s));
                    for (k, v) in &rec.counters {
                        *self.summary.counters.entry(k.clone()).or_insert(0) += v;
                        *self.summary.counters_by_kind.entry(spec.kind.clone()).or_default().entry(k.clone()).or_insert(0) += v;
                    }
                    self.summary.ran.push(spec.instance.clone());
                }
                self.refs.note(&spec);
                let rec = Arc::new(rec);
                // Stages of this pipeline with the same key take the same result.
                for j in 0..self.plan.nodes.len() {
                    if j != i && matches!(&self.states[j], State::Queued(s) if s.key == key) {
                        self.ui.line(&format!("reused   {} ({}): same instance as {}", self.plan.nodes[j].name, short(key), spec.instance));
                        self.summary.reused.push(self.plan.nodes[j].name.clone());
                        self.done_recs[j] = Some(rec.clone());
                        self.states[j] = State::Done;
                        self.queue.retain(|&q| q != j);
                        self.ui.done(key);
                    }
                }
                self.done_recs[i] = Some(rec);
                self.states[i] = State::Done;
            }
            None if self.summary.interrupted => {
                self.drop_partial_outputs(key);
                self.ui.line(&format!("stopped  {} ({}): interrupted; nothing committed", spec.instance, short(key)));
                self.states[i] = State::Failed;
                self.summary.not_run.push(spec.instance.clone());
            }
            None => {
                self.drop_partial_outputs(key);
                let tail = log_tail(&self.store.log_path(key), 20);
                let disk = disk_full_note(&self.store.root, DISK_FULL_BYTES);
                self.ui.line(&format!(
                    "FAILED   {} ({}): {message}{disk}\n  log: {}\n{tail}",
                    spec.instance,
                    short(key),
                    self.store.log_path(key).display()
                ));
                self.states[i] = State::Failed;
                self.summary.failed.push(spec.instance.clone());
                if !self.opts.keep_going {
                    self.stop_launching = true;
                }
            }
        }
    }

    /// A stage process killed mid-write (a signal, a crash, an interruption) leaves its partial
    /// outputs, a checkpoint's gigabytes perhaps; unless another run has taken the instance up
    /// meanwhile, they go now rather than at the next run's start.
    fn drop_partial_outputs(&self, key: &str) {
        if let Ok(Some(_lock)) = self.store.try_lock(key) {
            self.store.remove_tmp_of(key);
        }
    }

    /// Count what never ran, save the refs, close the display.
    fn finish(mut self, t0: Instant) -> Result<RunSummary> {
        for (i, s) in self.states.iter().enumerate() {
            if self.sel.targets[i] && matches!(s, State::Waiting | State::Queued(_)) {
                self.summary.not_run.push(self.plan.nodes[i].name.clone());
            }
        }
        if !self.opts.dry_run {
            self.refs.save(self.store, &self.plan.name)?;
        }
        self.ui.finish();
        self.summary.wall_s = t0.elapsed().as_secs_f64();
        Ok(self.summary)
    }
}

/// Below this much free space on the store's filesystem, a failure is blamed on it.
const DISK_FULL_BYTES: u64 = 16 << 20;

/// What to add to a failure when the store's disk is (nearly) full: a stage whose stderr is its
/// log on that disk cannot even say what failed (Rust's `eprintln!` panics, exit code 101, empty
/// log).
fn disk_full_note(root: &std::path::Path, below: u64) -> String {
    match free_bytes(root) {
        Some(free) if free < below => format!(
            " (the store's disk at {} has {} KiB free: a full disk is the likely cause; free space and rerun)",
            root.display(),
            free >> 10
        ),
        _ => String::new(),
    }
}

/// Bytes an unprivileged process may still write on the filesystem holding `path`.
fn free_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// The last `n` lines of a log file, indented; without progress lines, and without the frames of
/// a C++ backtrace (libtorch's errors end in tens of `frame #N:` lines that would push the
/// error itself out of the tail; the log keeps them).
pub fn log_tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let cpp_frame = |l: &str| {
        l.strip_prefix("frame #")
            .and_then(|rest| rest.split_once(": "))
            .is_some_and(|(i, _)| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            !l.starts_with(super::context::PROGRESS_PREFIX)
                && !l.starts_with(super::context::STATUS_PREFIX)
                && !cpp_frame(l)
        })
        .collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("  | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every instance key a set of plans currently references (for `artifact gc`).
pub fn referenced_keys(plan: &Plan, store: &Store) -> Result<HashSet<String>> {
    let mut resolver = Resolver::new(plan, FileHashes::in_store(&store.root, false));
    let mut done: Vec<Option<Arc<RunRecord>>> = vec![None; plan.nodes.len()];
    let mut keys = HashSet::new();
    for &i in &plan.order {
        if resolver.upstream(i).iter().any(|&u| done[u].is_none()) {
            continue;
        }
        let spec = resolver.spec(i, &done)?;
        keys.insert(spec.key.clone());
        done[i] = store.record(&spec.key).map(Arc::new);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_on_a_full_disk_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).expect("statvfs of a temp dir");
        assert!(free > 0);
        // Below the threshold (here: any free space at all), the note names the disk and its space.
        let note = disk_full_note(dir.path(), u64::MAX);
        assert!(note.contains(&format!("{} has ", dir.path().display())) && note.contains(" KiB free"), "{note}");
        assert!(note.contains("a full disk is the likely cause"), "{note}");
        assert_eq!(disk_full_note(dir.path(), 0), "");
    }
}
