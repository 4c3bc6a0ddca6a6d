//! Ownership of one spawned nats-server process: signalling it by pid, noticing when it exits,
//! and reaping it. The pid is only signalled while the child is known to be unreaped, so a
//! recycled pid is never hit.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A running (or exited but remembered) server process.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    child: Child,
    pid: u32,
    exit: Option<ExitStatus>,
}

impl ServerProcess {
    /// Spawns `bin args...` with stdin closed and stdout/stderr appended to `output`.
    ///
    /// With `die_with_thread` (Linux only) the child gets `PR_SET_DEATHSIG=SIGKILL`, so a test
    /// binary that is itself killed (a CI timeout) does not leave brokers holding ports. The
    /// kernel ties this to the spawning *thread*, not the process.
    pub(crate) fn spawn(
        bin: &Path,
        args: &[&std::ffi::OsStr],
        output: &Path,
        die_with_thread: bool,
    ) -> std::io::Result<ServerProcess> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(output)?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        #[cfg(target_os = "linux")]
        if die_with_thread {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: the closure runs between fork and exec and only makes the async-signal-safe
            // prctl(2) call.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
                });
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = die_with_thread;
        let child = cmd.spawn()?;
        let pid = child.id();
        Ok(ServerProcess {
            child,
            pid,
            exit: None,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The exit status if the process has exited (reaping it), without blocking.
    pub(crate) fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exit = Some(status);
            }
        }
        self.exit
    }

    /// Sends `signal`; refuses once the process has exited.
    pub(crate) fn signal(&mut self, signal: Signal) -> Result<(), String> {
        if let Some(status) = self.poll_exit() {
            return Err(format!("pid {} is not running ({status})", self.pid));
        }
        let raw = i32::try_from(self.pid).map_err(|_| format!("pid {} out of range", self.pid))?;
        kill(Pid::from_raw(raw), signal).map_err(|e| format!("kill({}, {signal}): {e}", self.pid))
    }

    /// SIGKILL (if still running) and reap. Blocks only for the moment a killed process takes
    /// to exit; a stopped process is killed too.
    pub(crate) fn kill_and_reap(&mut self) {
        if self.poll_exit().is_some() {
            return;
        }
        let _ = self.signal(Signal::SIGKILL);
        if let Ok(status) = self.child.wait() {
            self.exit = Some(status);
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}
