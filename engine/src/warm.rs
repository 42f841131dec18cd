//! Warm stage processes: one `stage serve` process runs builtin instances one after another.
//!
//! A fresh `stage exec` process per instance pays the program's start-up every time. For the
//! worker that links libtorch that is ~0.8 s of libtorch's static initialisers on CPU before any
//! stage code runs, and on a GPU the CUDA context and the lazily loaded kernels on top; short
//! stages (a quickstart step is ~1 s) spent more time starting than working. The local executor
//! therefore keeps finished processes and hands them the next builtin instance that runs in the
//! same program with the same GPUs.
//!
//! Protocol: the runner writes `exec KEY` or `exec --force KEY` lines to the process's stdin (a
//! socket: writing to a process that has died returns an error instead of raising SIGPIPE in the
//! runner). The process runs each like `stage exec KEY`, with its stderr (file descriptor 2, so
//! libtorch's own messages too) appended to the instance's log, and ends it with a
//! `@@status done CODE` line on stdout, CODE being what `stage exec` would have exited with, or
//! `@@status done CODE last` when it ends after this one. It ends after a failure (a failed stage
//! may leave the process in any state: CUDA out of memory, a half-finished graph capture), when
//! the application's [`Runtime::after_instance`] says so (the ML worker cannot give back GPU memory
//! in a build without its CUDA shim), and after `RREDCOT_WARM_MAX_INSTANCES` instances (default:
//! no limit). The next instance then gets a fresh process.
//!
//! What an instance sees is what a fresh process gives it: builtins seed their own generators and
//! set their own thread counts, the peak RSS in its run record is reset before it starts
//! (`/proc/self/clear_refs`), and freed heap goes back to the OS between instances.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use super::context::STATUS_PREFIX;
use super::error::{EngineError, IoContext, Result};
use super::exec::{exec_instance, ExecOutcome, Runtime};
use super::group::{self as signals, die_with_parent, Group};
use super::runner::Event;
use super::store::Store;

const DONE_WORD: &str = "done ";

/// How an instance's log names the warm process that ran it (`<this> PID, instance N ...`).
pub const SERVED_BY: &str = "warm stage process";

/// One request line.
fn request_line(key: &str, force: bool) -> String {
    if force {
        format!("exec --force {key}\n")
    } else {
        format!("exec {key}\n")
    }
}

/// (key, force) of a request line.
fn parse_request(line: &str) -> Option<(&str, bool)> {
    let rest = line.trim_end().strip_prefix("exec ")?;
    let (force, key) = match rest.strip_prefix("--force ") {
        Some(k) => (true, k),
        None => (false, rest),
    };
    (!key.is_empty() && !key.contains(char::is_whitespace)).then_some((key, force))
}

const LAST_WORD: &str = " last";

/// The exit code in a `@@status done CODE [last]` line, and whether the process ends after it.
fn parse_done(line: &str) -> Option<(i32, bool)> {
    let rest = line.strip_prefix(STATUS_PREFIX)?.strip_prefix(DONE_WORD)?.trim();
    let (code, last) = match rest.strip_suffix(LAST_WORD) {
        Some(c) => (c, true),
        None => (rest, false),
    };
    Some((code.trim().parse().ok()?, last))
}

/// `RREDCOT_WARM_MAX_INSTANCES`: how many instances one warm process runs at most. The runner
/// checks it before starting any (each process reads it from the environment it inherits).
pub fn max_instances() -> std::result::Result<u64, String> {
    match std::env::var("RREDCOT_WARM_MAX_INSTANCES") {
        Err(_) => Ok(u64::MAX),
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("RREDCOT_WARM_MAX_INSTANCES = `{v}`: expected a whole number of instances, at least 1")),
    }
}

// ---------------------------------------------------------------------------------------------
// The process side: `stage serve`.

/// Run the instances named on stdin until EOF or the first failure; returns the exit code.
pub fn serve(store: &Store, rt: &Runtime) -> Result<i32> {
    // As `stage exec`: SIGINT/SIGTERM end the process, except while an external command runs.
    signals::install_handlers(false);
    // Where stderr goes between instances (the runner's pipe).
    // SAFETY: dup of our own open descriptor 2.
    let between = unsafe { libc::dup(2) };
    if between < 0 {
        return Err(io_error("stage serve: dup(2)", std::io::Error::last_os_error()));
    }
    let max = match max_instances() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("error: stage serve: {e}");
            return Ok(2);
        }
    };
    let stdin = std::io::stdin();
    let mut served = 0u64;
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| io_error("stage serve: reading stdin", e))?;
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, force)) = parse_request(&line) else {
            eprintln!("error: stage serve: expected `exec [--force] KEY`, got `{line}`");
            return Ok(2);
        };
        let log_path = store.log_path(key);
        let log = OpenOptions::new().create(true).append(true).open(&log_path).at(&log_path)?;
        redirect_stderr(log.as_raw_fd());
        served += 1;
        // Which process ran it: a log line, so a failure can be traced to its predecessors.
        eprintln!("{SERVED_BY} {}, instance {served} in this process", std::process::id());
        reset_peak_rss();
        let code = run_one(store, key, force, rt);
        let _ = std::io::stderr().flush();
        redirect_stderr(between);
        drop(log);
        release_freed_heap();
        let last = code != 0 || served >= max || !(rt.after_instance)();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{STATUS_PREFIX}{DONE_WORD}{code}{}", if last { LAST_WORD } else { "" });
        let _ = out.flush();
        if last {
            return Ok(code);
        }
    }
    Ok(0)
}

/// One instance, reported on stderr as `stage exec` reports it; its exit code.
fn run_one(store: &Store, key: &str, force: bool, rt: &Runtime) -> i32 {
    match exec_instance(store, key, rt, force) {
        Ok(ExecOutcome::NeedsWorker(w)) => {
            eprintln!("error: instance {key} runs in {}, not in this process (the runner should have started that program)", w.display());
            1
        }
        Ok(outcome) => {
            eprintln!("{}", outcome.summary());
            0
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            e.exit_code()
        }
    }
}

fn io_error(what: &str, error: std::io::Error) -> EngineError {
    EngineError::Io { path: PathBuf::from(what), error }
}

fn redirect_stderr(fd: libc::c_int) {
    // SAFETY: both descriptors are open; dup2 replaces descriptor 2 atomically.
    unsafe { libc::dup2(fd, 2) };
}

/// Start the "peak RSS" of `/proc/self/status` (what run records report) afresh; Linux only, a
/// no-op elsewhere (then a record shows the process's peak so far).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Give freed heap back to the OS, so an idle process holds what it uses, not its last stage's peak.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

// ---------------------------------------------------------------------------------------------
// The runner side.

/// A `stage serve` process of the local executor, idle or running one instance.
pub struct WarmProcess {
    pub group: Arc<Group>,
    requests: UnixStream,
    shared: Arc<Mutex<Shared>>,
    program: PathBuf,
    /// Its `CUDA_VISIBLE_DEVICES` (None: inherited, on a machine without GPUs).
    cuda_devices: Option<String>,
    gpus: Vec<usize>,
    tx: Sender<Event>,
    /// The stage kind of the last instance handed to it.
    pub last_kind: Option<String>,
}

/// What the threads reading the process's output need to know.
#[derive(Default)]
struct Shared {
    current: Option<Assigned>,
    /// It said its last instance was its last: it is ending.
    ending: bool,
    /// The log of the last instance: where the process's own messages between instances go.
    last_log: Option<Arc<Mutex<File>>>,
    /// The process has ended, and how: set together with reporting the instance it was running.
    exit: Option<String>,
}

struct Assigned {
    key: String,
    log: Arc<Mutex<File>>,
    reused: bool,
}

impl WarmProcess {
    /// Start `program stage serve --store ROOT`, reporting to `tx`.
    pub fn start(
        program: &Path,
        store_root: &Path,
        cuda_devices: Option<String>,
        gpus: &[usize],
        tx: Sender<Event>,
    ) -> std::io::Result<WarmProcess> {
        let (requests, theirs) = UnixStream::pair()?;
        let mut cmd = Command::new(program);
        cmd.arg("stage")
            .arg("serve")
            .arg("--store")
            .arg(store_root)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(d) = &cuda_devices {
            cmd.env("CUDA_VISIBLE_DEVICES", d);
        }
        let group = Arc::new(Group::new()?);
        group.adopt(&mut cmd);
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn()?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stderr = child.stderr.take().expect("piped");
        let err_shared = shared.clone();
        let err_thread = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                let log = {
                    let s = err_shared.lock().expect("warm process state");
                    s.current.as_ref().map(|a| a.log.clone()).or_else(|| s.last_log.clone())
                };
                match log {
                    Some(log) => {
                        let _ = writeln!(log.lock().expect("log"), "{line}");
                    }
                    None => tracing::warn!("stage process: {line}"),
                }
            }
        });
        let stdout = child.stdout.take().expect("piped");
        let out_shared = shared.clone();
        let out_group = group.clone();
        let out_tx = tx.clone();
        std::thread::spawn(move || read_reports(stdout, child, err_thread, out_shared, out_group, out_tx));
        Ok(WarmProcess { group, requests, shared, program: program.to_path_buf(), cuda_devices, gpus: gpus.to_vec(), tx, last_kind: None })
    }

    /// Whether it runs `program` with these GPUs.
    pub fn fits(&self, program: &Path, cuda_devices: &Option<String>) -> bool {
        self.program == program && &self.cuda_devices == cuda_devices
    }

    /// Whether it takes another instance (it has not said it is ending).
    pub fn serves_more(&self) -> bool {
        !self.shared.lock().expect("warm process state").ending
    }

    /// Whether it may hold memory on one of `gpus`.
    pub fn holds_any_of(&self, gpus: &[usize]) -> bool {
        self.gpus.iter().any(|g| gpus.contains(g))
    }

    /// Hand an idle process an instance whose output lines go to `log`. An error when the process
    /// is gone: nothing of the instance is reported then, and it can go to a fresh process.
    pub fn assign(&mut self, key: &str, force: bool, log: Arc<Mutex<File>>) -> std::io::Result<()> {
        self.hand(key, force, log, false)
    }

    /// Hand a process just started its first instance. One that ends before taking it (a bad
    /// setting in its environment, a missing library) fails the instance with how it ended and
    /// its messages in the instance's log, as one that ends while running it does.
    pub fn assign_first(&mut self, key: &str, force: bool, log: Arc<Mutex<File>>) {
        let handed = self.hand(key, force, log, true);
        debug_assert!(handed.is_ok(), "a first instance is always reported");
    }

    fn hand(&mut self, key: &str, force: bool, log: Arc<Mutex<File>>, first: bool) -> std::io::Result<()> {
        {
            let mut s = self.shared.lock().expect("warm process state");
            s.last_log = Some(log.clone());
            // Ended before this call: its reader has reported nothing of this instance.
            if let Some(exit) = s.exit.clone() {
                if !first {
                    return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, exit));
                }
                let message = format!("the stage process ended before taking the instance: {exit}");
                let _ = self.tx.send(Event::Finished { key: key.to_string(), ok: false, message, reused: false });
                return Ok(());
            }
            s.current = Some(Assigned { key: key.to_string(), log, reused: false });
        }
        let line = request_line(key, force);
        let sent = send_all(&self.requests, line.as_bytes());
        if sent.is_ok() || first {
            // A first instance that could not be sent is reported by the reader with the exit.
            return Ok(());
        }
        let mut s = self.shared.lock().expect("warm process state");
        if s.current.as_ref().is_some_and(|a| a.key == key) {
            s.current = None;
            return sent;
        }
        // The reader saw the end first and has reported this instance failed (rare: a process
        // that died while idle, just as it was handed an instance).
        Ok(())
    }
}

/// `send` with MSG_NOSIGNAL: a dead reader gives EPIPE, not a SIGPIPE that would end the runner.
fn send_all(sock: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: sends from a live buffer on our own socket.
        let n = unsafe { libc::send(sock.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// The stdout thread of a warm process: progress and status of the current instance, its end,
/// and, when the process ends, the failure of the instance it was running.
fn read_reports(
    stdout: std::process::ChildStdout,
    mut child: Child,
    err_thread: std::thread::JoinHandle<()>,
    shared: Arc<Mutex<Shared>>,
    group: Arc<Group>,
    tx: Sender<Event>,
) {
    for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
        let mut s = shared.lock().expect("warm process state");
        if let Some((code, last)) = parse_done(&line) {
            // Set before the instance's end is reported, so the executor never hands it another.
            s.ending |= last;
            if let Some(a) = s.current.take() {
                let message = if code == 0 { String::new() } else { format!("exit code {code}") };
                let _ = tx.send(Event::Finished { key: a.key, ok: code == 0, message, reused: a.reused });
            }
            continue;
        }
        let Some(a) = s.current.as_mut() else {
            if let Some(log) = &s.last_log {
                let _ = writeln!(log.lock().expect("log"), "{line}");
            }
            continue;
        };
        super::local::forward_line(&line, &a.key, &mut a.reused, &a.log, &tx);
    }
    let _ = err_thread.join();
    let status = child.wait();
    drop(group);
    let (exit, clean) = match status {
        Ok(s) => (super::local::describe_exit(s), s.success()),
        Err(e) => (e.to_string(), false),
    };
    let mut s = shared.lock().expect("warm process state");
    s.exit = Some(exit.clone());
    if let Some(a) = s.current.take() {
        let message = if clean { "the stage process ended before finishing the instance".to_string() } else { exit };
        let _ = tx.send(Event::Finished { key: a.key, ok: false, message, reused: false });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::parse_status;

    #[test]
    fn requests_and_ends_read_back() {
        assert_eq!(parse_request(&request_line("abc123", false)), Some(("abc123", false)));
        assert_eq!(parse_request(&request_line("abc123", true)), Some(("abc123", true)));
        assert_eq!(parse_request("exec "), None);
        assert_eq!(parse_request("exec a b"), None);
        assert_eq!(parse_request("run abc"), None);
        assert_eq!(parse_done(&format!("{STATUS_PREFIX}{DONE_WORD}0")), Some((0, false)));
        assert_eq!(parse_done(&format!("{STATUS_PREFIX}{DONE_WORD}137{LAST_WORD}")), Some((137, true)));
        assert_eq!(parse_done(&format!("{STATUS_PREFIX}{DONE_WORD}x")), None);
        assert_eq!(parse_done(&format!("{STATUS_PREFIX}reused")), None);
        // A done line is not a status the cold path would misread.
        assert_eq!(parse_status(&format!("{STATUS_PREFIX}{DONE_WORD}0")), None);
    }

    /// A `program` that says why on stderr and exits 3 after `delay` without reading a request.
    fn dying_program(dir: &Path, delay: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(format!("dies-after-{delay}"));
        std::fs::write(&path, format!("#!/bin/sh\nsleep {delay}\necho 'cannot serve: bad setting' >&2\nexit 3\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn log_in(dir: &Path, name: &str) -> (PathBuf, Arc<Mutex<File>>) {
        let path = dir.join(name);
        (path.clone(), Arc::new(Mutex::new(File::create(&path).unwrap())))
    }

    fn exited(w: &WarmProcess) -> bool {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(20) {
            if w.shared.lock().unwrap().exit.is_some() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn a_process_that_ends_before_its_first_instance_fails_that_instance_with_how_it_ended() {
        let dir = tempfile::tempdir().unwrap();
        let timeout = std::time::Duration::from_secs(20);
        // Ended before the instance is handed over, and while it is (the request is sent into
        // the socket's buffer, never read): both report the instance failed, once, with the exit.
        for delay in ["0", "0.3"] {
            let (tx, rx) = std::sync::mpsc::channel();
            let mut w = WarmProcess::start(&dying_program(dir.path(), delay), dir.path(), None, &[], tx).unwrap();
            if delay == "0" {
                assert!(exited(&w), "the program ended");
            }
            let (log_path, log) = log_in(dir.path(), &format!("{delay}.log"));
            w.assign_first("k1", false, log);
            match rx.recv_timeout(timeout).unwrap() {
                Event::Finished { key, ok, message, .. } => {
                    assert_eq!((key.as_str(), ok), ("k1", false));
                    assert!(message.contains("exit code 3"), "{message}");
                }
                _ => panic!("expected the instance's end"),
            }
            assert!(rx.recv_timeout(std::time::Duration::from_millis(300)).is_err(), "reported once");
            if delay != "0" {
                // Its last words went to the instance's log.
                assert!(exited(&w));
                let text = std::fs::read_to_string(&log_path).unwrap();
                assert!(text.contains("cannot serve: bad setting"), "{text}");
            }
        }
    }

    #[test]
    fn an_idle_process_that_has_ended_refuses_an_instance_and_reports_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut w = WarmProcess::start(&dying_program(dir.path(), "0"), dir.path(), None, &[], tx).unwrap();
        assert!(exited(&w));
        let (_, log) = log_in(dir.path(), "k2.log");
        let err = w.assign("k2", false, log).unwrap_err();
        assert!(err.to_string().contains("exit code 3"), "{err}");
        assert!(rx.recv_timeout(std::time::Duration::from_millis(300)).is_err(), "nothing reported: the instance goes to a fresh process");
    }
}
