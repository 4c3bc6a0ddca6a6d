//! Shared pieces of the `up*`/`down*` tests: `cotal-delivery` command lines run as an
//! operator types them (each test with its own `COTAL_HOME`), bounded waits on observable
//! conditions.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use cotal_delivery::base;
use cotal_delivery::wire::Space;
use delivery_harness::nats_server_bin;
use delivery_harness::rig::daemon::{Daemon, DaemonSpec};

/// What one `cotal-delivery` command line of these tests may take to print the line
/// waited for or to exit, in s: `up` starts a broker, provisions the space and launches the
/// daemon before it reports serving.
pub const COMMAND_BOUND: Duration = Duration::from_secs(60);

/// Kills (SIGKILL) what a detached mesh left at `root` when a test ends early: the recorded
/// broker, daemon and renewal owner, only while their command lines prove what they are.
pub struct MeshGuard(pub PathBuf);

impl Drop for MeshGuard {
    fn drop(&mut self) {
        kill_mesh(&self.0, &demo());
    }
}

/// [`MeshGuard`] of a mesh `up` started for another space than `demo`.
pub struct MeshGuardOf(pub PathBuf, pub Space);

impl Drop for MeshGuardOf {
    fn drop(&mut self) {
        kill_mesh(&self.0, &self.1);
    }
}

fn kill_mesh(root: &Path, space: &Space) {
    use cotal_delivery::base::PidLiveness;
    let daemons = [
        base::pid_path(root, space),
        base::launched_path(root, space),
    ];
    for path in daemons {
        if let Some(pid) = base::read_pid(&path) {
            if let PidLiveness::Alive(p) =
                base::process_liveness(pid, base::argv_names_delivery_daemon)
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    // The renewal owner a detached up leaves (never a foreground up's record).
    if let Some(pid) = base::read_pid(&base::remint_pid_path(root, space)) {
        if let PidLiveness::Alive(p) = base::process_liveness(pid, base::argv_names_remint_watch) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    if let Some(pid) = base::read_pid(&base::broker_pid_path(root)) {
        if let PidLiveness::Alive(p) = base::process_liveness(pid, base::argv_names_nats_server) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

pub fn demo() -> Space {
    Space::parse("demo").expect("space")
}

/// `cotal-delivery <args…>` run from `root`, with `COTAL_HOME=<root>/home` and `env`.
pub fn spawn(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Daemon {
    let bin = nats_server_bin().expect("nats-server");
    let mut spec = DaemonSpec::command(args, root)
        .env("NATS_SERVER_BIN", bin.display().to_string())
        .env("COTAL_HOME", root.join("home").display().to_string());
    for (k, v) in env {
        spec = spec.env(k, *v);
    }
    spec.spawn().expect("spawn cotal-delivery")
}

/// `cotal-delivery up --space demo --root <root> --port 0 <extra…>`.
pub fn spawn_up(root: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
    let root_arg = root.to_str().expect("utf-8 path");
    let mut args = vec!["up", "--space", "demo", "--root", root_arg, "--port", "0"];
    args.extend_from_slice(extra);
    spawn(root, &args, env)
}

/// `up --detach <extra…>` (see [`spawn_up`]), waited (bounded) until it returns, which it must
/// with 0; with the pid the daemon recorded.
pub async fn detached_up(root: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Daemon, u32) {
    let mut args = vec!["--detach"];
    args.extend_from_slice(extra);
    let mut up = spawn_up(root, &args, env);
    let st = up
        .wait_exit(COMMAND_BOUND)
        .await
        .expect("detached up returns");
    assert_eq!(st.code(), Some(0), "{}", up.transcript());
    let pid = base::read_pid(&pid_path(root)).expect("the daemon recorded itself");
    (up, pid)
}

/// `up` in the foreground (see [`spawn_up`]), waited (bounded) until it reports the daemon
/// serving; with the pid the daemon recorded.
pub async fn serving_up(root: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Daemon, u32) {
    let mut up = spawn_up(root, extra, env);
    up.wait_for_line("delivery daemon serving space demo", COMMAND_BOUND)
        .await
        .expect("serving");
    let pid = base::read_pid(&pid_path(root)).expect("the daemon recorded itself");
    (up, pid)
}

/// The state letter of `pid` in `/proc/<pid>/stat` (`T` stopped, `Z` zombie, …).
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S …`: the state follows the last `)`.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Freezes (SIGSTOP) the replacement `up` launches after `first` died, as soon as the launch
/// record names it; one that exited before it could be frozen (refused by the lease its
/// predecessor left) is passed over for the next launch. Returns the frozen pid, proved stopped.
pub async fn freeze_the_replacement(root: &Path, first: u32) -> u32 {
    let launched = base::launched_path(root, &demo());
    let mut passed = vec![first];
    let deadline = Instant::now() + COMMAND_BOUND;
    loop {
        assert!(
            Instant::now() < deadline,
            "no replacement frozen within {COMMAND_BOUND:?}"
        );
        if let Some(pid) = base::read_pid(&launched).filter(|p| !passed.contains(p)) {
            let frozen = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGSTOP,
            )
            .is_ok();
            if frozen {
                // SIGSTOP is delivered asynchronously: wait (bounded) for the stopped state.
                let until = Instant::now() + Duration::from_secs(2);
                while Instant::now() < until {
                    match proc_state(pid) {
                        Some('T') => return pid,
                        Some('Z') | None => break,
                        _ => tokio::time::sleep(Duration::from_millis(5)).await,
                    }
                }
            }
            passed.push(pid);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs a command to its exit (bounded); returns the status and the transcript.
pub async fn run(root: &Path, args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
    let mut p = spawn(root, args, env);
    let status = p.wait_exit(COMMAND_BOUND).await.expect("exits");
    (status, p.transcript())
}

/// `down --space demo --root <root>`.
pub async fn down(root: &Path, env: &[(&str, &str)]) -> (ExitStatus, String) {
    let r = root.to_str().expect("utf-8").to_string();
    run(root, &["down", "--space", "demo", "--root", &r], env).await
}

/// `status --space demo --root <root> [--json]`.
pub async fn status(root: &Path, json: bool) -> (ExitStatus, String) {
    let r = root.to_str().expect("utf-8").to_string();
    let mut args = vec!["status", "--space", "demo", "--root", &r];
    if json {
        args.push("--json");
    }
    run(root, &args, &[]).await
}

/// `status --json` parsed.
pub async fn status_json(root: &Path) -> (i32, serde_json::Value) {
    let (st, out) = status(root, true).await;
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON in:\n{out}"));
    (
        st.code().unwrap_or(-1),
        serde_json::from_str(line).expect("status JSON"),
    )
}

/// Waits (bounded) until `cond` holds.
pub async fn until(what: &str, bound: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn pid_path(root: &Path) -> PathBuf {
    base::pid_path(root, &demo())
}

pub fn creds_path(root: &Path) -> PathBuf {
    cotal_delivery::provision::Workspace::new(root).delivery_creds_path(&demo())
}

pub fn broker_pid(root: &Path) -> u32 {
    base::read_pid(&base::broker_pid_path(root)).expect("nats.pid")
}

/// Alive and not a zombie.
pub fn alive(pid: u32) -> bool {
    base::process_alive(pid) && !base::is_zombie(pid)
}

pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("signal");
}

/// How many lines contain `needle`.
pub fn count(transcript: &str, needle: &str) -> usize {
    transcript.lines().filter(|l| l.contains(needle)).count()
}

/// The pid a run's frame line of the daemon log names (`pid <n>` / `(pid <n>)`): the last one.
pub fn frame_pid(line: &str) -> u32 {
    let at = line.rfind("pid ").expect("a pid") + 4;
    line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .expect("a numeric pid")
}

/// `up --space demo --root <root> <args…>` (no `--port`: as an operator types a bare `up`), run
/// to its exit; with the exit code and the transcript.
pub async fn up_at(root: &Path, args: &[&str]) -> (Option<i32>, String) {
    let r = root.to_str().expect("utf-8");
    let mut all = vec!["up", "--space", "demo", "--root", r];
    all.extend_from_slice(args);
    let (st, t) = run(root, &all, &[]).await;
    (st.code(), t)
}
