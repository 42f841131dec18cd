//! Local executor: each instance runs in a child process (this binary or its worker, see
//! `programs`), so a crash, an OOM or Ctrl-C in one stage never corrupts the runner or the store.
//! Builtin instances run in warm `stage serve` processes that take one instance after another
//! (see [`super::warm`]); external commands, and everything with `--fresh-processes`, in a
//! `<program> stage exec KEY` of their own.
//!
//! Each child runs in a process group of its own (see [`super::group`]): cancelling or timing out
//! an instance signals everything it started, and the whole group dies with the runner.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::context::{parse_progress, parse_status, ExecStatus};
use super::error::{EngineError, IoContext, Result};
use super::programs::Programs;
use super::group::{die_with_parent, Group};
use super::runner::{Event, Executor};
use super::spec::{short, InstanceSpec, RunnerSpec};
use super::store::Store;
use super::warm::WarmProcess;

/// How long a timed-out or cancelled instance may take to end after SIGTERM before SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(5);

pub struct LocalExecutor {
    store: Store,
    programs: Programs,
    /// Machine has GPUs: stages without a GPU slot get an empty CUDA_VISIBLE_DEVICES.
    has_gpus: bool,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    running: HashMap<String, Running>,
    /// Run builtins in warm processes (false: a fresh process per instance).
    reuse_processes: bool,
    /// Warm processes waiting for an instance.
    idle: Vec<WarmProcess>,
    /// Warm processes running an instance, by instance key.
    busy: HashMap<String, WarmProcess>,
}

struct Running {
    /// Shared with the thread that waits for the child, so the group id stays reserved until
    /// both are done with it.
    group: Arc<Group>,
    /// `resources.time`: when it expires and how it was written.
    deadline: Option<(Instant, Duration, String)>,
    /// SIGTERM sent (cancel or time limit); SIGKILL follows after [`KILL_GRACE`].
    term_sent: Option<Instant>,
    /// Set when the time limit killed it: replaces the exit status in the report.
    timed_out: Option<String>,
}

impl LocalExecutor {
    pub fn new(store: Store, programs: Programs, has_gpus: bool) -> Self {
        let (tx, rx) = channel();
        LocalExecutor {
            store,
            programs,
            has_gpus,
            tx,
            rx,
            running: HashMap::new(),
            reuse_processes: true,
            idle: Vec::new(),
            busy: HashMap::new(),
        }
    }

    /// Start a fresh process for every instance, builtins included (`--fresh-processes`).
    pub fn fresh_processes(mut self, fresh: bool) -> Self {
        self.reuse_processes = !fresh;
        self
    }

    /// `CUDA_VISIBLE_DEVICES` for an instance with these GPU slots (None: leave it as it is).
    fn cuda_devices(&self, gpu_ids: &[usize]) -> Option<String> {
        if !gpu_ids.is_empty() {
            Some(gpu_ids.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","))
        } else if self.has_gpus {
            Some(String::new())
        } else {
            None
        }
    }

    /// An idle warm process may keep GPU memory cached: none may be left on a GPU that another
    /// process is about to use.
    fn retire_idle_on(&mut self, gpu_ids: &[usize], keep: Option<(&std::path::Path, &Option<String>)>) {
        self.idle.retain(|w| keep.is_some_and(|(p, d)| w.fits(p, d)) || !w.holds_any_of(gpu_ids));
    }

    /// Run `spec` in a warm process of `exe` with these GPUs, started if none is idle. An idle
    /// process that last ran the same stage kind goes first: what a stage keeps in its process
    /// for the next one of its kind (an inference engine kept with `reload`, warmed kernels)
    /// serves it there, and another process need not build it again.
    fn launch_warm(
        &mut self,
        spec: &InstanceSpec,
        exe: &std::path::Path,
        gpu_ids: &[usize],
        force: bool,
        log: Arc<Mutex<std::fs::File>>,
    ) -> std::result::Result<Arc<Group>, String> {
        let devices = self.cuda_devices(gpu_ids);
        self.retire_idle_on(gpu_ids, Some((exe, &devices)));
        let fits = |w: &WarmProcess| w.fits(exe, &devices);
        let same_kind = self.idle.iter().position(|w| fits(w) && w.last_kind.as_deref() == Some(spec.kind.as_str()));
        if let Some(i) = same_kind.or_else(|| self.idle.iter().position(fits)) {
            let mut w = self.idle.remove(i);
            w.last_kind = Some(spec.kind.clone());
            // A process that died while idle is replaced by a fresh one below.
            if w.assign(&spec.key, force, log.clone()).is_ok() {
                let group = w.group.clone();
                self.busy.insert(spec.key.clone(), w);
                return Ok(group);
            }
        }
        let mut w = WarmProcess::start(exe, &self.store.root, devices, gpu_ids, self.tx.clone())
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        w.last_kind = Some(spec.kind.clone());
        w.assign_first(&spec.key, force, log);
        let group = w.group.clone();
        self.busy.insert(spec.key.clone(), w);
        Ok(group)
    }

    /// Enforce time limits and the SIGKILL that follows an unanswered SIGTERM.
    fn watch(&mut self) {
        for (key, r) in self.running.iter_mut() {
            if let (Some((at, limit, text)), None) = (&r.deadline, r.term_sent) {
                if Instant::now() >= *at {
                    r.group.signal(libc::SIGTERM);
                    r.term_sent = Some(Instant::now());
                    r.timed_out = Some(format!(
                        "ran longer than its time limit resources.time = \"{text}\" ({}s) and was killed; nothing was committed (raise resources.time in the stage file or the pipeline's [[stage]] entry)",
                        limit.as_secs()
                    ));
                    tracing::info!(key = %short(key), "time limit reached");
                }
            }
            if r.term_sent
                .map(|t| t.elapsed() > KILL_GRACE)
                .unwrap_or(false)
            {
                r.group.signal(libc::SIGKILL);
            }
        }
    }
}

impl Executor for LocalExecutor {
    fn launch(&mut self, spec: &InstanceSpec, gpu_ids: &[usize], force: bool) -> Result<()> {
        let fail = |message: String| EngineError::Instance {
            key: short(&spec.key).to_string(),
            stage: spec.instance.clone(),
            message,
        };
        let exe = self.programs.for_runner(&spec.runner).map_err(&fail)?;
        let limit = spec.resources.time_limit().map_err(&fail)?;
        let log_path = self.store.log_path(&spec.key);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .at(&log_path)?;
        let log = Arc::new(Mutex::new(log));
        let deadline = limit.map(|d| (Instant::now() + d, d, spec.resources.time.clone().unwrap_or_default()));
        if self.reuse_processes && matches!(spec.runner, RunnerSpec::Builtin { .. }) {
            let group = self.launch_warm(spec, &exe, gpu_ids, force, log).map_err(&fail)?;
            self.running.insert(spec.key.clone(), Running { group, deadline, term_sent: None, timed_out: None });
            return Ok(());
        }
        self.retire_idle_on(gpu_ids, None);
        let mut cmd = Command::new(&exe);
        cmd.arg("stage")
            .arg("exec")
            .arg("--store")
            .arg(&self.store.root);
        if force {
            cmd.arg("--force");
        }
        cmd.arg(&spec.key)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(devices) = self.cuda_devices(gpu_ids) {
            cmd.env("CUDA_VISIBLE_DEVICES", devices);
        }
        let group = Arc::new(
            Group::new().map_err(|e| fail(format!("cannot create a process group: {e}")))?,
        );
        group.adopt(&mut cmd);
        die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(|e| fail(format!("cannot start {}: {e}", exe.display())))?;
        self.running.insert(
            spec.key.clone(),
            Running {
                group: group.clone(),
                deadline,
                term_sent: None,
                timed_out: None,
            },
        );
        let stderr = child.stderr.take().expect("piped");
        let err_log = log.clone();
        let err_thread = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                let _ = writeln!(err_log.lock().expect("log"), "{line}");
            }
        });
        let stdout = child.stdout.take().expect("piped");
        let tx = self.tx.clone();
        let key = spec.key.clone();
        std::thread::spawn(move || {
            let mut reused = false;
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                forward_line(&line, &key, &mut reused, &log, &tx);
            }
            let _ = err_thread.join();
            let status = child.wait();
            let (ok, message) = match status {
                Ok(s) if s.success() => (true, String::new()),
                // The `stage exec` process's status; an external command's own is in the log.
                Ok(s) => (false, format!("stage process: {}", describe_exit(s))),
                Err(e) => (false, e.to_string()),
            };
            drop(group);
            let _ = tx.send(Event::Finished {
                key,
                ok,
                message,
                reused,
            });
        });
        Ok(())
    }

    fn poll(&mut self, timeout: Duration) -> Vec<Event> {
        let mut out = Vec::new();
        if let Ok(ev) = self.rx.recv_timeout(timeout) {
            out.push(ev);
            while let Ok(ev) = self.rx.try_recv() {
                out.push(ev);
            }
        }
        for ev in &mut out {
            if let Event::Finished {
                key, ok, message, ..
            } = ev
            {
                if let Some(r) = self.running.remove(key.as_str()) {
                    if let Some(why) = r.timed_out {
                        *ok = false;
                        *message = why;
                    }
                }
                // A warm process that finished its instance waits for the next; one that failed
                // or said it ends has exited (or was killed) and is let go.
                if let Some(w) = self.busy.remove(key.as_str()) {
                    if *ok && w.serves_more() {
                        self.idle.push(w);
                    }
                }
            }
        }
        self.watch();
        out
    }

    fn cancel_all(&mut self, force: bool) {
        for r in self.running.values_mut() {
            if force {
                r.group.signal(libc::SIGKILL);
            } else if r.term_sent.is_none() {
                r.group.signal(libc::SIGTERM);
                r.term_sent = Some(Instant::now());
            }
        }
    }
}

/// One stdout line of the process running instance `key`: progress and waiting go to the runner,
/// `reused` is noted, anything else goes to the instance's log.
pub(crate) fn forward_line(line: &str, key: &str, reused: &mut bool, log: &Mutex<std::fs::File>, tx: &Sender<Event>) {
    if let Some((pos, len, message)) = parse_progress(line) {
        let _ = tx.send(Event::Progress { key: key.to_string(), pos, len, message });
    } else if let Some(st) = parse_status(line) {
        match st {
            ExecStatus::Waiting => {
                let _ = tx.send(Event::Waiting { key: key.to_string() });
            }
            ExecStatus::Reused => *reused = true,
        }
    } else {
        let _ = writeln!(log.lock().expect("log"), "{line}");
    }
}

pub(crate) fn describe_exit(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => s.to_string(),
    }
}
