//! The `Daemon` actor: the real `cotal-delivery` binary as a child process.
//!
//! Cases and tests judge the daemon by what it did, so this actor only starts it, captures every line
//! it prints (stdout and stderr, in arrival order), waits for a line with a bound, signals it by
//! pid and reaps it. It never reaches into the daemon.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::rig::error::HarnessError;

/// Locates the daemon binary: `COTAL_DELIVERY_BIN`, else `<target dir>/<profile>/cotal-delivery`
/// next to the running test executable, built once with cargo when it is missing or was built
/// from other sources than this harness (its build id differs).
pub fn daemon_bin() -> Result<PathBuf, HarnessError> {
    if let Ok(p) = std::env::var("COTAL_DELIVERY_BIN") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(HarnessError::Usage(format!(
            "COTAL_DELIVERY_BIN={} is not a file",
            p.display()
        )));
    }
    // Once per process: every test of a file shares the answer (and at most one build).
    static FOUND: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| workspace_daemon_bin().map_err(|e| e.to_string()))
        .clone()
        .map_err(HarnessError::Usage)
}

/// `target/<profile>/cotal-delivery`, built from the sources this harness was compiled against:
/// built when missing, rebuilt when its build id (`cotal-delivery build-id`) is another's.
/// Cargo rebuilds that binary only for its own package's targets, so a test of this package
/// would otherwise run a daemon built from older sources, silently.
fn workspace_daemon_bin() -> Result<PathBuf, HarnessError> {
    let exe = std::env::current_exe().map_err(|source| HarnessError::Io {
        what: "current_exe".into(),
        source,
    })?;
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let candidate = dir.join("cotal-delivery");
    if candidate.is_file() && same_build(&candidate, cotal_delivery::BUILD_ID).is_ok() {
        return Ok(candidate);
    }
    let workspace = crate::rig::checkout::root().ok_or_else(|| {
        HarnessError::Usage(
            "this harness runs outside the checkout it was built in (an unpacked kit, a copied binary), so it has no daemon build of its own: name the daemon to qualify with --daemon PATH or --daemon-cmd TEMPLATE (or COTAL_DELIVERY_BIN)".into(),
        )
    })?;
    let status =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "build",
                "-q",
                "-p",
                "cotal-delivery",
                "--bin",
                "cotal-delivery",
            ])
            .current_dir(&workspace)
            .status()
            .map_err(|source| HarnessError::Io {
                what: "cargo build -p cotal-delivery".into(),
                source,
            })?;
    if !status.success() || !candidate.is_file() {
        return Err(HarnessError::Usage(format!(
            "the cotal-delivery binary is not at {} and could not be built; set COTAL_DELIVERY_BIN",
            candidate.display()
        )));
    }
    same_build(&candidate, cotal_delivery::BUILD_ID)?;
    Ok(candidate)
}

/// Refuses `bin` unless `cotal-delivery build-id` prints `expected`, naming both ids.
pub fn same_build(bin: &Path, expected: &str) -> Result<(), HarnessError> {
    let out = std::process::Command::new(bin)
        .arg("build-id")
        .output()
        .map_err(|source| HarnessError::Io {
            what: format!("run {} build-id", bin.display()),
            source,
        })?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && id == expected {
        return Ok(());
    }
    Err(HarnessError::Usage(format!(
        "{} was built from other sources than this program (its build id {:?}, this program's {expected}): build both from one checkout (`cargo build --workspace --bins`)",
        bin.display(),
        if id.is_empty() { "none" } else { id.as_str() }
    )))
}

/// How to start a daemon.
#[derive(Debug, Clone)]
pub struct DaemonSpec {
    bin: Option<PathBuf>,
    args: Vec<OsString>,
    cwd: PathBuf,
    env: Vec<(String, String)>,
}

impl DaemonSpec {
    /// `cotal-delivery deliver --space <space>` run from `cwd`.
    pub fn deliver(space: &str, cwd: impl Into<PathBuf>) -> DaemonSpec {
        DaemonSpec {
            bin: None,
            args: vec!["deliver".into(), "--space".into(), space.into()],
            cwd: cwd.into(),
            env: Vec::new(),
        }
    }
    /// Any `cotal-delivery` command line.
    pub fn command(args: &[&str], cwd: impl Into<PathBuf>) -> DaemonSpec {
        DaemonSpec {
            bin: None,
            args: args.iter().map(OsString::from).collect(),
            cwd: cwd.into(),
            env: Vec::new(),
        }
    }
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = Some(bin.into());
        self
    }
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }
    pub fn server(self, url: &str) -> Self {
        self.arg("--server").arg(url)
    }
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_string(), value.into()));
        self
    }
    /// Each `(key, value)` of `vars`, in order, as [`DaemonSpec::env`] would.
    pub fn envs(mut self, vars: &[(&str, &str)]) -> Self {
        for (k, v) in vars {
            self = self.env(k, *v);
        }
        self
    }

    /// Spawns the daemon with a scrubbed `COTAL_*` environment plus this spec's variables.
    pub fn spawn(&self) -> Result<Daemon, HarnessError> {
        let bin = match &self.bin {
            Some(b) => b.clone(),
            None => daemon_bin()?,
        };
        let mut cmd = Command::new(&bin);
        cmd.args(&self.args)
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("COTAL_") && k != "COTAL_DELIVERY_BIN" {
                cmd.env_remove(k);
            }
        }
        // Diagnostics would interleave with the human lines the cases and tests snapshot; a spec that
        // wants them sets RUST_LOG itself.
        cmd.env_remove("RUST_LOG");
        // The machine's mesh registry is never the real home's: a test that does not name one
        // gets one under its working directory.
        if !self.env.iter().any(|(k, _)| k == "COTAL_HOME") {
            cmd.env("COTAL_HOME", self.cwd.join(".cotal-home"));
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let spawned = std::time::SystemTime::now();
        let mut child = cmd.spawn().map_err(|source| HarnessError::Io {
            what: format!("spawn {}", bin.display()),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tick_tx, tick_rx) = watch::channel(0usize);
        let tick_tx = Arc::new(tick_tx);
        if let Some(out) = child.stdout.take() {
            spawn_reader(out, lines.clone(), tick_tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            spawn_reader(err, lines.clone(), tick_tx.clone());
        }
        Ok(Daemon {
            child,
            spawned,
            pid,
            lines,
            tick: tick_rx,
            exit: None,
        })
    }
}

fn spawn_reader<R>(stream: R, lines: Arc<Mutex<Vec<String>>>, tick: Arc<watch::Sender<usize>>)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            let n = {
                let mut l = lines.lock().unwrap_or_else(|p| p.into_inner());
                l.push(line);
                l.len()
            };
            let _ = tick.send(n);
        }
    });
}

/// A running daemon process and everything it printed.
pub struct Daemon {
    child: Child,
    /// When it was spawned (wall clock, to compare with a broker's stamps on this host).
    spawned: std::time::SystemTime,
    pid: u32,
    lines: Arc<Mutex<Vec<String>>>,
    tick: watch::Receiver<usize>,
    exit: Option<ExitStatus>,
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// When the process was spawned, by the wall clock (a broker on this host stamps by it).
    pub fn spawned_at(&self) -> std::time::SystemTime {
        self.spawned
    }

    /// Every line printed so far, in arrival order.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The transcript so far, one line each.
    pub fn transcript(&self) -> String {
        self.lines().join("\n")
    }

    /// Waits until a printed line contains `needle`; returns it.
    pub async fn wait_for_line(
        &mut self,
        needle: &str,
        bound: Duration,
    ) -> Result<String, HarnessError> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| l.contains(needle)) {
                return Ok(l);
            }
            // A closed feed (the process exited, its pipes are drained) ends the wait too.
            let more = matches!(
                tokio::time::timeout_at(deadline, self.tick.changed()).await,
                Ok(Ok(()))
            );
            if !more && !self.lines().iter().any(|l| l.contains(needle)) {
                return Err(HarnessError::Timeout {
                    what: format!("a daemon line containing {needle:?}"),
                    bound_ms: bound.as_millis(),
                    last: Some(format!("transcript:\n{}", self.transcript())),
                });
            }
        }
    }

    /// Whether any printed line contains `needle`.
    pub fn has_line(&self, needle: &str) -> bool {
        self.lines().iter().any(|l| l.contains(needle))
    }

    fn signal(&mut self, sig: Signal) -> Result<(), HarnessError> {
        if self.exit.is_some() || self.child.try_wait().ok().flatten().is_some() {
            return Err(self.signal_error(sig, "it has already exited".into()));
        }
        let raw = i32::try_from(self.pid)
            .map_err(|_| self.signal_error(sig, "pid out of range".into()))?;
        kill(Pid::from_raw(raw), sig).map_err(|e| self.signal_error(sig, e.to_string()))
    }
    fn signal_error(&self, sig: Signal, message: String) -> HarnessError {
        HarnessError::Signal {
            name: format!("daemon pid {}", self.pid),
            signal: sig.to_string(),
            message,
        }
    }
    pub fn terminate(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGTERM)
    }
    pub fn interrupt(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGINT)
    }
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGKILL)
    }
    pub fn freeze(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGSTOP)
    }
    pub fn thaw(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGCONT)
    }

    /// Waits (bounded) for the process to exit; returns its status. Output read so far stays
    /// available; trailing lines are drained for a short moment after the exit.
    pub async fn wait_exit(&mut self, bound: Duration) -> Result<ExitStatus, HarnessError> {
        if let Some(s) = self.exit {
            return Ok(s);
        }
        match tokio::time::timeout(bound, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.exit = Some(status);
                // Let the pipe readers hand over what the process wrote before it exited.
                let settle = tokio::time::Instant::now() + Duration::from_millis(200);
                while let Ok(Ok(())) = tokio::time::timeout_at(settle, self.tick.changed()).await {}
                Ok(status)
            }
            Ok(Err(source)) => Err(HarnessError::Io {
                what: format!("wait for daemon pid {}", self.pid),
                source,
            }),
            Err(_) => Err(HarnessError::Timeout {
                what: format!("daemon pid {} to exit", self.pid),
                bound_ms: bound.as_millis(),
                last: Some(format!("transcript:\n{}", self.transcript())),
            }),
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.exit.is_none() && matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.is_running() {
            if let Ok(raw) = i32::try_from(self.pid) {
                let _ = kill(Pid::from_raw(raw), Signal::SIGCONT);
                let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
            }
        }
    }
}

/// Whether `line` comes from one of the space daemon's side components (the checkpoint timer
/// writer, the membership feed). They run beside start-up and shutdown, so where their lines
/// fall among the main job's depends on scheduling: main-job transcripts leave them out, and
/// the components' own tests judge them.
pub fn is_component_line(line: &str) -> bool {
    // A multi-space host's lane line carries its `lane <space>: ` prefix first.
    let line = match line.strip_prefix("lane ").and_then(|l| l.split_once(": ")) {
        Some((space, rest)) if !space.contains(' ') => rest,
        _ => line,
    };
    let body = line.trim_start_matches(['✓', '✗', '!', '•', ' ']);
    body.starts_with("timer writer")
        || body.starts_with("membership feed")
        || body.starts_with("membership:")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon binary built from other sources is refused, naming the rebuild; the workspace's
    /// own binary (located, and rebuilt if stale, by `daemon_bin`) passes.
    /// Mutation seen failing: `same_build` accepting any id (the impostor passes).
    #[test]
    fn a_binary_built_from_other_sources_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let impostor = dir.path().join("cotal-delivery");
        std::fs::write(&impostor, "#!/bin/sh\necho 0123456789abcdef\n").expect("script");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&impostor, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let e = same_build(&impostor, cotal_delivery::BUILD_ID).expect_err("refused");
        let text = e.to_string();
        assert!(text.contains("build id \"0123456789abcdef\""), "{text}");
        assert!(text.contains(cotal_delivery::BUILD_ID), "{text}");
        assert!(text.contains("cargo build --workspace --bins"), "{text}");
        let real = daemon_bin().expect("the workspace's daemon binary");
        same_build(&real, cotal_delivery::BUILD_ID).expect("built from these sources");
    }

    /// A lane's side-component lines are side-component lines too; its own lines are not.
    /// Mutation seen failing: the `lane <space>: ` prefix not stripped (the lane's feed line
    /// counts as the main job's).
    #[test]
    fn a_lanes_component_lines_are_told_by_their_body() {
        assert!(is_component_line("✓ membership feed up (broker-sourced)"));
        assert!(is_component_line(
            "lane demo: ✓ membership feed up (broker-sourced)"
        ));
        assert!(is_component_line("lane alpha: ! timer writer down"));
        assert!(!is_component_line(
            "lane demo: ✓ delivery daemon up (space demo)"
        ));
        assert!(!is_component_line(
            "• delivery host: 1 lane(s) from x: demo"
        ));
    }
}
