//! Local executor: each instance is a child process `rredcot stage exec KEY` (or the ML worker),
//! so a crash, an OOM or Ctrl-C in one stage never corrupts the runner or the store.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::context::parse_progress;
use super::error::{EngineError, IoContext, Result};
use super::exec::{die_with_parent, worker_exe};
use super::runner::{Event, Executor};
use super::spec::{InstanceSpec, RunnerSpec};
use super::store::Store;

pub struct LocalExecutor {
    store: Store,
    exe: PathBuf,
    /// Machine has GPUs: stages without a GPU slot get an empty CUDA_VISIBLE_DEVICES.
    has_gpus: bool,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    pids: HashMap<String, u32>,
}

impl LocalExecutor {
    pub fn new(store: Store, exe: PathBuf, has_gpus: bool) -> Self {
        let (tx, rx) = channel();
        LocalExecutor {
            store,
            exe,
            has_gpus,
            tx,
            rx,
            pids: HashMap::new(),
        }
    }
}

impl Executor for LocalExecutor {
    fn launch(&mut self, spec: &InstanceSpec, gpu_ids: &[usize], force: bool) -> Result<()> {
        let exe = match &spec.runner {
            RunnerSpec::Builtin { needs_ml: true, name } => worker_exe().ok_or_else(|| EngineError::Instance {
                key: spec.key.clone(),
                stage: spec.instance.clone(),
                message: format!("builtin `{name}` needs the ML worker `rredcot-worker` next to {} (built by `cargo build --workspace`)", self.exe.display()),
            })?,
            _ => self.exe.clone(),
        };
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
        if !gpu_ids.is_empty() {
            cmd.env(
                "CUDA_VISIBLE_DEVICES",
                gpu_ids
                    .iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            );
        } else if self.has_gpus {
            cmd.env("CUDA_VISIBLE_DEVICES", "");
        }
        die_with_parent(&mut cmd);
        let log_path = self.store.log_path(&spec.key);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .at(&log_path)?;
        let log = Arc::new(Mutex::new(log));
        let mut child = cmd.spawn().map_err(|e| EngineError::Instance {
            key: spec.key.clone(),
            stage: spec.instance.clone(),
            message: format!("cannot start {}: {e}", exe.display()),
        })?;
        self.pids.insert(spec.key.clone(), child.id());
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
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                match parse_progress(&line) {
                    Some((pos, len, message)) => {
                        let _ = tx.send(Event::Progress {
                            key: key.clone(),
                            pos,
                            len,
                            message,
                        });
                    }
                    None => {
                        let _ = writeln!(log.lock().expect("log"), "{line}");
                    }
                }
            }
            let _ = err_thread.join();
            let status = child.wait();
            let (ok, message) = match status {
                Ok(s) if s.success() => (true, String::new()),
                Ok(s) => (false, describe_exit(s)),
                Err(e) => (false, e.to_string()),
            };
            let _ = tx.send(Event::Finished { key, ok, message });
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
        for ev in &out {
            if let Event::Finished { key, .. } = ev {
                self.pids.remove(key);
            }
        }
        out
    }

    fn cancel_all(&mut self) {
        for pid in self.pids.values() {
            // SAFETY: sending a signal to our own child process.
            unsafe {
                libc::kill(*pid as libc::pid_t, libc::SIGTERM);
            }
        }
    }
}

fn describe_exit(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => s.to_string(),
    }
}
