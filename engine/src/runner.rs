//! Running a pipeline: resolve keys in topological order, serve cached instances from the store,
//! launch the rest through an executor (local processes or Slurm jobs) within the `-j` and GPU
//! budgets, and report progress.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::error::{EngineError, Result};
use super::group as signals;
use super::plan::Plan;
use super::record::RunRecord;
use super::resolve::{why_not_cached, Resolver};
use super::spec::{short, InstanceSpec};
use super::store::{RefEntry, Store};

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

struct Ui {
    mp: MultiProgress,
    overall: ProgressBar,
    bars: BTreeMap<String, ProgressBar>,
}

impl Ui {
    fn new(total: u64) -> Ui {
        let mp = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let overall = mp.add(ProgressBar::new(total));
        overall.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} stages {msg}")
                .expect("template"),
        );
        Ui {
            mp,
            overall,
            bars: BTreeMap::new(),
        }
    }

    fn line(&self, s: &str) {
        if self.mp.is_hidden() {
            eprintln!("{s}");
        } else {
            let _ = self.mp.println(s);
        }
    }

    fn progress(&mut self, key: &str, label: &str, pos: u64, len: u64, msg: &str) {
        let bar = self.bars.entry(key.to_string()).or_insert_with(|| {
            let b = self.mp.add(ProgressBar::new(len));
            b.set_style(
                ProgressStyle::with_template("  {prefix:24} {bar:24} {pos}/{len} {msg}")
                    .expect("template"),
            );
            b.set_prefix(label.to_string());
            b
        });
        bar.set_length(len);
        bar.set_position(pos);
        bar.set_message(msg.to_string());
    }

    fn done(&mut self, key: &str) {
        if let Some(b) = self.bars.remove(key) {
            b.finish_and_clear();
            self.mp.remove(&b);
        }
        self.overall.inc(1);
    }
}

pub fn run_pipeline(
    plan: &Plan,
    store: &Store,
    opts: &RunOptions,
    exec: &mut dyn Executor,
) -> Result<RunSummary> {
    let t0 = Instant::now();
    let n = plan.nodes.len();
    let mut targets = vec![true; n];
    if !opts.until.is_empty() {
        let mut sel = Vec::new();
        for u in &opts.until {
            let m = plan.matching(u);
            if m.is_empty() {
                return Err(EngineError::NoSuchStage(u.clone()));
            }
            sel.extend(m);
        }
        targets = plan.with_ancestors(&sel);
    }
    let mut forced = vec![false; n];
    for f in &opts.force {
        let m = plan.matching(f);
        if m.is_empty() {
            return Err(EngineError::NoSuchStage(f.clone()));
        }
        for i in m {
            forced[i] = true;
        }
    }

    let mut resolver = Resolver::new(plan);
    let ups: Vec<Vec<usize>> = (0..n).map(|i| resolver.upstream(i)).collect();
    let mut refs = store.read_refs(&plan.name);
    let mut refs_dirty = false;
    let mut states: Vec<State> = vec![State::Waiting; n];
    let mut done_recs: Vec<Option<Arc<RunRecord>>> = vec![None; n];
    let mut summary = RunSummary {
        pipeline: plan.name.clone(),
        ..Default::default()
    };
    let total = targets.iter().filter(|t| **t).count() as u64;
    let mut ui = Ui::new(total);
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut cpu_free = opts.jobs.max(1);
    let mut gpu_free: Vec<usize> = (0..opts.gpus).collect();
    let mut running = 0usize;
    let mut stop_launching = false;
    let mut signals_seen = 0;
    let index_of_key = |states: &Vec<State>, key: &str| {
        states
            .iter()
            .position(|s| matches!(s, State::Running(sp, _) if sp.key == key))
    };

    loop {
        // Resolve every waiting node whose upstream is settled.
        let mut progressed = true;
        while progressed {
            progressed = false;
            for &i in &plan.order {
                if !targets[i] || !matches!(states[i], State::Waiting) {
                    continue;
                }
                if ups[i]
                    .iter()
                    .any(|&u| matches!(states[u], State::Failed | State::Blocked))
                {
                    states[i] = State::Blocked;
                    summary.not_run.push(plan.nodes[i].name.clone());
                    progressed = true;
                    continue;
                }
                if let Some(&u) = ups[i]
                    .iter()
                    .find(|&&u| matches!(states[u], State::Unknown))
                {
                    states[i] = State::Unknown;
                    summary.would_run.push((
                        plan.nodes[i].name.clone(),
                        vec![format!("upstream `{}` will run", plan.nodes[u].name)],
                    ));
                    progressed = true;
                    continue;
                }
                if !ups[i].iter().all(|&u| matches!(states[u], State::Done)) {
                    continue;
                }
                let spec = resolver.spec(i, &done_recs)?;
                summary
                    .keys
                    .insert(plan.nodes[i].name.clone(), spec.key.clone());
                progressed = true;
                let name = &plan.nodes[i].name;
                let mut reused = false;
                let cached = match store.checked_record(&spec.key) {
                    _ if forced[i] => None,
                    Ok(rec) => rec,
                    Err(_) if opts.dry_run => None,
                    Err(_) => {
                        // Re-checked under the lock: another run may have replaced it by now.
                        let on_wait = || {
                            ui.line(&format!(
                                "waiting  {name} ({}): another process holds its lock",
                                short(&spec.key)
                            ))
                        };
                        match store.quarantine_if_corrupt(&spec.key, false, on_wait)? {
                            Some((why, dest)) => {
                                ui.line(&format!(
                                    "corrupt  {name} ({}): {why}; moved to {} and recomputing",
                                    short(&spec.key),
                                    dest.display()
                                ));
                                None
                            }
                            None => {
                                reused = true;
                                store.checked_record(&spec.key).ok().flatten()
                            }
                        }
                    }
                };
                if let Some(rec) = cached {
                    if reused {
                        ui.line(&format!("reused   {name} ({}): committed by another process while this run waited", short(&spec.key)));
                        summary.reused.push(name.clone());
                    } else {
                        if opts.verbose {
                            ui.line(&format!("cached   {name} ({})", short(&spec.key)));
                        }
                        summary.cached.push(name.clone());
                    }
                    note_ref(&mut refs, &mut refs_dirty, &spec);
                    let rec = Arc::new(rec);
                    done_recs[i] = Some(rec);
                    states[i] = State::Done;
                    ui.done(&spec.key);
                } else if opts.dry_run {
                    let mut why = why_not_cached(store, &refs, &spec);
                    if forced[i] {
                        why.insert(0, "forced".into());
                    }
                    summary.would_run.push((plan.nodes[i].name.clone(), why));
                    states[i] = State::Unknown;
                } else {
                    if opts.verbose || refs.contains_key(&spec.instance) {
                        let why = if forced[i] {
                            vec!["forced".to_string()]
                        } else {
                            why_not_cached(store, &refs, &spec)
                        };
                        tracing::info!(stage = %spec.instance, key = %short(&spec.key), "will run: {}", why.join("; "));
                    }
                    states[i] = State::Queued(Box::new(spec));
                    queue.push_back(i);
                }
            }
        }

        if let Some(sig) = signals::received() {
            if !summary.interrupted {
                stop_launching = true;
                summary.interrupted = true;
                summary.signal = Some(sig);
                ui.line(&format!(
                    "interrupted ({}): stopping running stages (finished stages are kept; rerun to resume; a second Ctrl-C kills them)",
                    signals::signal_name(sig)
                ));
                exec.cancel_all(false);
                signals_seen = signals::count();
            } else if signals::count() > signals_seen {
                signals_seen = signals::count();
                exec.cancel_all(true);
            }
        }

        // Launch what fits the CPU and GPU budgets, in queue order.
        if !stop_launching {
            let mut deferred = VecDeque::new();
            while let Some(i) = queue.pop_front() {
                let State::Queued(spec) = states[i].clone() else {
                    continue;
                };
                // Another stage of this pipeline with the same key is running: wait for it and
                // reuse its result instead of launching a second writer.
                if index_of_key(&states, &spec.key).is_some() {
                    deferred.push_back(i);
                    continue;
                }
                let cpus = (spec.resources.cpus.max(1) as usize).min(opts.jobs.max(1));
                let gpus = if opts.gpus == 0 {
                    0
                } else {
                    spec.resources.gpus as usize
                };
                if gpus > opts.gpus {
                    return Err(EngineError::Instance {
                        key: short(&spec.key).into(),
                        stage: spec.instance.clone(),
                        message: format!("needs {gpus} GPUs but this machine has {}", opts.gpus),
                    });
                }
                if cpus > cpu_free || gpus > gpu_free.len() {
                    deferred.push_back(i);
                    continue;
                }
                cpu_free -= cpus;
                let ids: Vec<usize> = gpu_free.drain(..gpus).collect();
                if spec.git_rev.is_none() {
                    let mut s = (*spec).clone();
                    s.git_rev = resolver.git_rev();
                    store.write_spec(&s)?;
                } else {
                    store.write_spec(&spec)?;
                }
                ui.line(&format!(
                    "run      {} ({})",
                    spec.instance,
                    short(&spec.key)
                ));
                exec.launch(&spec, &ids, forced[i])?;
                running += 1;
                states[i] = State::Running(spec, ids);
            }
            queue = deferred;
        }

        if running == 0 && (queue.is_empty() || stop_launching) {
            break;
        }

        for ev in exec.poll(Duration::from_millis(100)) {
            match ev {
                Event::Progress {
                    key,
                    pos,
                    len,
                    message,
                } => {
                    if let Some(i) = index_of_key(&states, &key) {
                        ui.progress(&key, &plan.nodes[i].name, pos, len, &message);
                    }
                }
                Event::Waiting { key } => {
                    if let Some(i) = index_of_key(&states, &key) {
                        ui.line(&format!("waiting  {} ({}): another process is writing this instance; will reuse it", plan.nodes[i].name, short(&key)));
                    }
                }
                Event::Finished {
                    key,
                    ok,
                    message,
                    reused,
                } => {
                    let Some(i) = index_of_key(&states, &key) else {
                        continue;
                    };
                    let State::Running(spec, ids) = states[i].clone() else {
                        continue;
                    };
                    running -= 1;
                    cpu_free += (spec.resources.cpus.max(1) as usize).min(opts.jobs.max(1));
                    gpu_free.extend(ids);
                    gpu_free.sort();
                    ui.done(&key);
                    let rec = if ok { store.record(&key) } else { None };
                    match rec {
                        Some(rec) => {
                            if reused {
                                ui.line(&format!("reused   {} ({}): committed by another process while this run waited", spec.instance, short(&key)));
                                summary.reused.push(spec.instance.clone());
                            } else {
                                ui.line(&format!(
                                    "done     {} ({}) in {:.2}s",
                                    spec.instance,
                                    short(&key),
                                    rec.wall_s
                                ));
                                for (k, v) in &rec.counters {
                                    *summary.counters.entry(k.clone()).or_insert(0) += v;
                                }
                                summary.ran.push(spec.instance.clone());
                            }
                            note_ref(&mut refs, &mut refs_dirty, &spec);
                            let rec = Arc::new(rec);
                            // Stages of this pipeline with the same key take the same result.
                            for j in 0..n {
                                if j != i && matches!(&states[j], State::Queued(s) if s.key == key)
                                {
                                    ui.line(&format!(
                                        "reused   {} ({}): same instance as {}",
                                        plan.nodes[j].name,
                                        short(&key),
                                        spec.instance
                                    ));
                                    summary.reused.push(plan.nodes[j].name.clone());
                                    done_recs[j] = Some(rec.clone());
                                    states[j] = State::Done;
                                    queue.retain(|&q| q != j);
                                    ui.done(&key);
                                }
                            }
                            done_recs[i] = Some(rec);
                            states[i] = State::Done;
                        }
                        None if summary.interrupted => {
                            ui.line(&format!(
                                "stopped  {} ({}): interrupted; nothing committed",
                                spec.instance,
                                short(&key)
                            ));
                            states[i] = State::Failed;
                            summary.not_run.push(spec.instance.clone());
                        }
                        None => {
                            let tail = log_tail(&store.log_path(&key), 20);
                            ui.line(&format!(
                                "FAILED   {} ({}): {message}\n  log: {}\n{tail}",
                                spec.instance,
                                short(&key),
                                store.log_path(&key).display()
                            ));
                            states[i] = State::Failed;
                            summary.failed.push(spec.instance.clone());
                            if !opts.keep_going {
                                stop_launching = true;
                            }
                        }
                    }
                }
            }
        }
    }

    for (i, s) in states.iter().enumerate() {
        if targets[i] && matches!(s, State::Waiting | State::Queued(_)) {
            summary.not_run.push(plan.nodes[i].name.clone());
        }
    }
    if refs_dirty && !opts.dry_run {
        store.write_refs(&plan.name, &refs)?;
    }
    ui.overall.finish_and_clear();
    summary.wall_s = t0.elapsed().as_secs_f64();
    Ok(summary)
}

fn note_ref(refs: &mut BTreeMap<String, RefEntry>, dirty: &mut bool, spec: &InstanceSpec) {
    if refs
        .get(&spec.instance)
        .map(|r| r.key != spec.key)
        .unwrap_or(true)
    {
        refs.insert(
            spec.instance.clone(),
            RefEntry {
                key: spec.key.clone(),
                material: spec.key_material(),
            },
        );
        *dirty = true;
    }
}

/// The last `n` lines of a log file, indented.
pub fn log_tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            !l.starts_with(super::context::PROGRESS_PREFIX)
                && !l.starts_with(super::context::STATUS_PREFIX)
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
    let mut resolver = Resolver::new(plan);
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

