//! Process groups that die with their owner, and the run's signal handling.
//!
//! Every stage process (`stage exec` under the runner, the external command under `stage exec`)
//! runs in a process group of its own, so everything it forks can be signalled at once. A small
//! guardian process leads the group and blocks on a pipe whose only write end its owner holds:
//! when the owner exits for any reason (SIGKILL included), the pipe reaches EOF and the guardian
//! SIGKILLs the whole group. The parent-death signal alone reaches only the direct child, not the
//! grandchildren a `sh -c` command forks. Because the guardian is a member, the group id cannot be
//! reused by an unrelated process while a signal may still be sent to it.
//!
//! Signals: the owner records SIGINT/SIGTERM/SIGHUP in [`received`] instead of dying (the runner
//! and a `stage exec` waiting on an external command), or dies by the signal's default action
//! when nothing is [`deferring`] them.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

/// A process group led by a guardian; dropping it (or the owner's death) SIGKILLs the group.
pub struct Group {
    pgid: libc::pid_t,
    /// The write end of the guardian's pipe; closing it releases the guardian.
    wake: Option<OwnedFd>,
}

impl Group {
    /// Fork the guardian of a new, empty group.
    pub fn new() -> std::io::Result<Group> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 fills `fds`; both ends are close-on-exec in this process.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the fds were just created and are owned here.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let rfd = read.as_raw_fd();
        // SAFETY: the child runs only async-signal-safe calls (no allocation, no locks) and never
        // returns from `guardian`.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: in the forked child; see above.
            unsafe { guardian(rfd) }
        }
        drop(read);
        // Also set from this side, so the group exists before any member is spawned into it.
        // SAFETY: setpgid on our own child that has not exec'd.
        unsafe { libc::setpgid(pid, pid) };
        Ok(Group {
            pgid: pid,
            wake: Some(write),
        })
    }

    pub fn id(&self) -> libc::pid_t {
        self.pgid
    }

    /// Spawn `cmd` into this group (call before `spawn`).
    pub fn adopt(&self, cmd: &mut Command) {
        cmd.process_group(self.pgid);
    }

    /// Send `sig` to every process of the group (the guardian ignores all but SIGKILL).
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: the group is led by our own guardian, which is alive until `Drop`.
        unsafe { libc::kill(-self.pgid, sig) };
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // EOF on the pipe: the guardian kills what is left of the group, itself included.
        self.wake.take();
        let mut status = 0;
        // SAFETY: reaping our own child (the guardian).
        unsafe { libc::waitpid(self.pgid, &mut status, 0) };
    }
}

/// The guardian: lead the group, wait for EOF on `rfd`, SIGKILL the group.
///
/// # Safety
/// Only in a freshly forked child: it calls nothing that allocates or takes locks.
unsafe fn guardian(rfd: libc::c_int) -> ! {
    libc::setpgid(0, 0);
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGPIPE,
        libc::SIGTTOU,
        libc::SIGTTIN,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        libc::signal(sig, libc::SIG_IGN);
    }
    // Keep only the pipe (as fd 3): other stages' pipe ends inherited from the owner would delay
    // their EOFs, and the owner's stdout/stderr would keep its readers waiting.
    if rfd != 3 {
        libc::dup2(rfd, 3);
    }
    let devnull = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
    for fd in 0..3 {
        libc::dup2(devnull, fd);
    }
    if libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0 {
        let mut lim: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 16) as libc::c_int
        } else {
            1024
        };
        for fd in 4..max {
            libc::close(fd);
        }
    }
    let mut b = 0u8;
    loop {
        let n = libc::read(3, (&mut b as *mut u8).cast(), 1);
        if n < 0 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
    }
    libc::kill(0, libc::SIGKILL);
    libc::_exit(0)
}

/// Spawned children get SIGKILL if the thread that spawned them dies (belt and braces: the group's
/// guardian also covers grandchildren).
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe and only affects the child being spawned.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

static RECEIVED: AtomicI32 = AtomicI32::new(0);
static COUNT: AtomicU32 = AtomicU32::new(0);
static DEFER: AtomicBool = AtomicBool::new(true);

extern "C" fn on_signal(sig: libc::c_int) {
    RECEIVED.store(sig, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
    if !DEFER.load(Ordering::SeqCst) {
        // SAFETY: signal and raise are async-signal-safe; die as if no handler were installed.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Handle SIGINT, SIGTERM and SIGHUP: recorded while [`deferring`], else the default action.
pub fn install_handlers(defer: bool) {
    DEFER.store(defer, Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing a handler that only touches atomics and async-signal-safe calls.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Whether signals are only recorded (true) or take their default action (false).
pub fn deferring(defer: bool) {
    DEFER.store(defer, Ordering::SeqCst);
}

/// The last termination signal received, if any.
pub fn received() -> Option<libc::c_int> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// How many termination signals were received (a second Ctrl-C escalates to SIGKILL).
pub fn count() -> u32 {
    COUNT.load(Ordering::SeqCst)
}

/// "SIGINT", "SIGTERM", ... for messages.
pub fn signal_name(sig: libc::c_int) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        s => format!("signal {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn alive(pid: i32) -> bool {
        // A zombie (exited, not yet reaped) counts as gone.
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(s) => s
                .rsplit(')')
                .next()
                .map(|r| !r.trim_start().starts_with('Z'))
                .unwrap_or(false),
            Err(_) => false,
        }
    }

    #[test]
    fn dropping_the_group_kills_grandchildren() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let g = Group::new().unwrap();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("sleep 300 & echo $! > {}; wait", pidfile.display()));
        g.adopt(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        let t0 = Instant::now();
        let pid: i32 = loop {
            if let Some(p) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break p;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the command did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(alive(pid));
        drop(g);
        let _ = child.wait();
        let t0 = Instant::now();
        while alive(pid) && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let survived = alive(pid);
        if survived {
            // SAFETY: cleaning up the process this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        assert!(!survived, "the grandchild outlived its group");
    }
}
