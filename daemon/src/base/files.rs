//! Project-local files of a running daemon: the workspace root it serves, its pid record and its
//! log. These are how an operator (and `status`/`down`) finds a daemon without asking the broker,
//! so each rule here is about never trusting a file more than it deserves: a root nobody set up
//! holds no credentials, a pid record is trusted only when its process still is a delivery daemon,
//! and a loser of the lease never overwrites the holder's record.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use crate::wire::Space;

/// Name of the project folder that marks a workspace root.
pub const COTAL_DIR: &str = ".cotal";

/// Why a file operation was refused. `kind()` is for callers; `Display` is the operator's line.
#[derive(Debug)]
pub struct FilesError {
    kind: FilesErrorKind,
    message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilesErrorKind {
    /// `--root` names a directory without `.cotal/`.
    RootWithoutCotal,
    /// No `.cotal/` in the working directory or any directory above it.
    NoWorkspaceRoot,
    /// `--creds` lies under another workspace than the one this daemon serves.
    CredsRootMismatch,
    /// An I/O error on a named path.
    Io,
    /// `--server` differs from the broker the mesh registry records for the space.
    RegistryServerMismatch,
    /// The registry records the space for another workspace root.
    RegistryRootMismatch,
    /// A registry record that is not a mesh record.
    RegistryUnreadable,
}

impl FilesError {
    fn new(kind: FilesErrorKind, message: String) -> Self {
        FilesError { kind, message }
    }
    pub fn kind(&self) -> FilesErrorKind {
        self.kind
    }
    fn io(what: &str, path: &Path, err: std::io::Error) -> Self {
        FilesError::new(
            FilesErrorKind::Io,
            format!("delivery: could not {what} {}: {err}", path.display()),
        )
    }
}

impl fmt::Display for FilesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FilesError {}

/// Lexically absolute form of `p` (relative paths are taken from `cwd`; `.`/`..` folded).
pub fn absolute(p: &Path, cwd: &Path) -> PathBuf {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The workspace root a daemon serves: `--root` when given (it must hold `.cotal/`), otherwise the
/// nearest directory at or above `cwd` that holds `.cotal/`. Refuses before any credential is read.
pub fn resolve_root(root_flag: Option<&Path>, cwd: &Path) -> Result<PathBuf, FilesError> {
    if let Some(root) = root_flag {
        let root = absolute(root, cwd);
        if root.join(COTAL_DIR).is_dir() {
            return Ok(root);
        }
        return Err(FilesError::new(
            FilesErrorKind::RootWithoutCotal,
            format!(
                "delivery: --root {} holds no .cotal/ - name the directory that contains the workspace's .cotal/",
                root.display()
            ),
        ));
    }
    let start = absolute(cwd, cwd);
    let mut dir = Some(start.as_path());
    while let Some(d) = dir {
        if d.join(COTAL_DIR).is_dir() {
            return Ok(d.to_path_buf());
        }
        dir = d.parent();
    }
    Err(FilesError::new(
        FilesErrorKind::NoWorkspaceRoot,
        format!(
            "delivery: no .cotal/ in {} or any directory above it - run the daemon from inside its workspace, or name the root with --root <dir>",
            start.display()
        ),
    ))
}

/// The workstation a credential path names: the parent of the last `.cotal` component of the
/// path itself. It never walks the filesystem, so a path outside every `.cotal` tree names none.
pub fn workstation_of(creds_path: &Path, cwd: &Path) -> Option<PathBuf> {
    let abs = absolute(creds_path, cwd);
    let comps: Vec<Component> = abs.components().collect();
    let idx = comps.iter().rposition(|c| c.as_os_str() == COTAL_DIR)?;
    Some(comps[..idx].iter().collect())
}

/// Refuses a `--creds` that names one workstation while this daemon serves another root.
pub fn check_creds_root(creds_path: &Path, root: &Path, cwd: &Path) -> Result<(), FilesError> {
    match workstation_of(creds_path, cwd) {
        Some(ws) if ws != root => Err(FilesError::new(
            FilesErrorKind::CredsRootMismatch,
            format!(
                "delivery: --creds names workstation {} while membership-rw resolves under {} (process cwd). Pass both the same workstation root, or inject one SecretStore.",
                ws.display(),
                root.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// `.cotal/delivery.<key>.pid` under `root`.
pub fn pid_path(root: &Path, space: &Space) -> PathBuf {
    root.join(COTAL_DIR)
        .join(format!("delivery.{}.pid", space.key()))
}

/// `.cotal/delivery-host.pid`: the host's own record (lanes write none).
pub const HOST_PID_FILE: &str = "delivery-host.pid";
/// `.cotal/delivery-host.log`: the host's own lines (each lane also writes its space's log).
pub const HOST_LOG_FILE: &str = "delivery-host.log";
/// `.cotal/delivery-host.pid` under `root`.
pub fn host_pid_path(root: &Path) -> PathBuf {
    root.join(COTAL_DIR).join(HOST_PID_FILE)
}

/// `.cotal/delivery-host.log` under `root`.
pub fn host_log_path(root: &Path) -> PathBuf {
    root.join(COTAL_DIR).join(HOST_LOG_FILE)
}

/// `.cotal/delivery.<key>.log` under `root`.
pub fn log_path(root: &Path, space: &Space) -> PathBuf {
    root.join(COTAL_DIR)
        .join(format!("delivery.{}.log", space.key()))
}

/// `.cotal/delivery.<key>.stopping`: the reservation a stop of the space's daemon holds, so two
/// stops (`down`, `up`'s Ctrl-C) never signal the same daemon at once.
pub fn stop_reservation_path(root: &Path, space: &Space) -> PathBuf {
    root.join(COTAL_DIR)
        .join(format!("delivery.{}.stopping", space.key()))
}

/// `.cotal/delivery.<key>.down`: `down` stopped this daemon; a foreground `up` never restarts it
/// while the marker stands (the next `up` clears it).
pub fn down_marker_path(root: &Path, space: &Space) -> PathBuf {
    root.join(COTAL_DIR)
        .join(format!("delivery.{}.down", space.key()))
}

/// `.cotal/delivery.<key>.launched`: the pid of the daemon process `up` last started. A
/// replacement still starting has no pid record yet (it records itself once it holds the lease),
/// so this is how `down` finds it; it is signalled only while its command line proves it.
pub fn launched_path(root: &Path, space: &Space) -> PathBuf {
    root.join(COTAL_DIR)
        .join(format!("delivery.{}.launched", space.key()))
}

/// `.cotal/remint.<key>.pid`: the space's renewal owner (`remint --watch`, or a foreground `up`
/// that runs the owner itself), written once it runs; trusted only while its command line proves
/// it ([`argv_names_renewal_owner`]).
pub fn remint_pid_path(root: &Path, space: &Space) -> PathBuf {
    root.join(COTAL_DIR)
        .join(format!("remint.{}.pid", space.key()))
}

/// `.cotal/remint.<key>.log`: the renewal owner's log (the daemon's conventions).
pub fn remint_log_path(root: &Path, space: &Space) -> PathBuf {
    root.join(COTAL_DIR)
        .join(format!("remint.{}.log", space.key()))
}

/// `.cotal/nats.pid`: the broker `up` started.
pub fn broker_pid_path(root: &Path) -> PathBuf {
    root.join(COTAL_DIR).join("nats.pid")
}

/// `.cotal/mesh.json`: how `up` started the mesh of this root (URL, transport), so a bare `up`
/// relaunches a missing daemon with the same transport and `status`/`down` find the broker.
pub fn mesh_state_path(root: &Path) -> PathBuf {
    root.join(COTAL_DIR).join("mesh.json")
}

/// Environment variable naming the machine registry's home (default `~/.cotal`).
pub const COTAL_HOME_ENV: &str = "COTAL_HOME";

/// The machine registry's home: `COTAL_HOME`, else `$HOME/.cotal`; `None` with neither set.
pub fn cotal_home() -> Option<PathBuf> {
    std::env::var_os(COTAL_HOME_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(COTAL_DIR)))
}

/// `<home>/meshes/space.<key>.json`: the reference's mesh registry file for one space.
pub fn registry_path(home: &Path, space: &Space) -> PathBuf {
    home.join("meshes")
        .join(format!("space.{}.json", space.key()))
}

/// One mesh registry record: where the broker of a space runs and which root it belongs to.
/// The field names are the reference's (`server`, `root`, `tlsRequired`); `tlsCa` is ours and
/// optional, so a record either side wrote reads on the other.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshRecord {
    pub space: String,
    pub server: String,
    pub root: PathBuf,
    #[serde(default)]
    pub tls_required: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
}

impl MeshRecord {
    /// Reads the record at `path`; `Ok(None)` when there is none.
    pub fn read(path: &Path) -> Result<Option<MeshRecord>, FilesError> {
        let text = match fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FilesError::io("read", path, e)),
        };
        serde_json::from_str(&text).map(Some).map_err(|e| {
            FilesError::new(
                FilesErrorKind::RegistryUnreadable,
                format!(
                    "delivery: the meshes entry {} is not a mesh record ({e})",
                    path.display()
                ),
            )
        })
    }
    /// Writes the record atomically, creating `<home>/meshes/`.
    pub fn write(&self, path: &Path) -> Result<(), FilesError> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| FilesError::io("create", dir, e))?;
        }
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        write_atomic(path, text.as_bytes())
    }
}

/// The broker a daemon typed by hand dials, and the banner that says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dial {
    pub server: String,
    pub tls: bool,
    pub tls_ca: Option<PathBuf>,
    /// The line printed before the dial; `None` when `--server` was given and no record exists
    /// (the launcher's own command line already says where it dials).
    pub banner: Option<String>,
}

/// The local mesh default: the broker a command dials with no `--server` and no registry record.
pub const DEFAULT_SERVER: &str = "nats://127.0.0.1:4222";

/// Chooses the broker of a workstation daemon from the registry record of its space: the
/// recorded broker (and its transport) when there is a record for this root; a refusal naming
/// both when `--server` differs from it or the record belongs to another root; otherwise
/// `--server`, else `default_server`. Decided before any dial.
pub fn resolve_dial(
    space: &Space,
    flag_server: Option<&str>,
    flag_tls: bool,
    flag_tls_ca: Option<&Path>,
    root: &Path,
    record: Option<&MeshRecord>,
    default_server: &str,
) -> Result<Dial, FilesError> {
    let tls_note = |tls: bool| if tls { " with TLS required" } else { "" };
    let Some(rec) = record else {
        let server = flag_server.unwrap_or(default_server).to_string();
        let banner = flag_server.is_none().then(|| {
            format!(
                "• delivery: no meshes entry for \"{space}\" - dialing {server} (the local default){}",
                tls_note(flag_tls)
            )
        });
        return Ok(Dial {
            server,
            tls: flag_tls,
            tls_ca: flag_tls_ca.map(Path::to_path_buf),
            banner,
        });
    };
    if let Some(flag) = flag_server {
        if flag != rec.server {
            return Err(FilesError::new(
                FilesErrorKind::RegistryServerMismatch,
                format!(
                    "delivery: --server {flag} does not match registered space \"{space}\" at {} - deliver refuses to use a different broker than the meshes entry",
                    rec.server
                ),
            ));
        }
    }
    if rec.root != root {
        return Err(FilesError::new(
            FilesErrorKind::RegistryRootMismatch,
            format!(
                "delivery: space \"{space}\" is registered for root {} but this daemon serves root {} - the recorded broker belongs to another workspace; run the daemon from that root, or re-register the space from this one with `cotal-delivery up --space {space} --root {}`",
                rec.root.display(),
                root.display(),
                root.display()
            ),
        ));
    }
    // A TLS-required mesh demands TLS of every daemon launch, whatever the flags say.
    let tls = flag_tls || rec.tls_required;
    Ok(Dial {
        server: rec.server.clone(),
        tls,
        tls_ca: flag_tls_ca
            .map(Path::to_path_buf)
            .or_else(|| rec.tls_ca.clone()),
        banner: Some(format!(
            "• delivery: space \"{space}\" is registered at {} (meshes entry) - dialing it{}",
            rec.server,
            tls_note(tls)
        )),
    })
}

/// Writes `contents` to `path` through a temp file in the same directory and a rename, so a crash
/// leaves either the old file or the new one, never a torn one.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), FilesError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(FilesError::io("write", path, e));
    }
    Ok(())
}

/// The daemon's pid record. Written only once the lease is held; removed on clean exit, and only
/// while it still names this process.
#[derive(Debug)]
pub struct PidRecord {
    path: PathBuf,
    pid: u32,
}

impl PidRecord {
    /// Records `pid` at `path` (atomically).
    pub fn write(path: PathBuf, pid: u32) -> Result<PidRecord, FilesError> {
        write_atomic(&path, format!("{pid}\n").as_bytes())?;
        Ok(PidRecord { path, pid })
    }
    /// Removes the record if it still names this process; a record another daemon wrote since is
    /// left alone.
    pub fn remove(&self) {
        if read_pid(&self.path) == Some(self.pid) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The pid a record names, if it holds a decimal pid.
pub fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What a pid record proves about the daemon it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PidLiveness {
    /// No record.
    Absent,
    /// The pid is alive and its command line names a delivery daemon.
    Alive(u32),
    /// The pid is alive but its command line could not be read: trusted, since the check only
    /// ever downgrades on proof.
    Unverified(u32),
    /// The pid is dead (the record outlived its daemon).
    Stale(u32),
    /// The pid is alive as some other program (a reused number): never signalled.
    Foreign(u32),
    /// The record exists but holds no pid.
    Unreadable,
}

impl PidLiveness {
    /// The one-word verdict `status` prints (`alive`, `stale`, `foreign`, `absent`, …).
    pub fn verdict(&self) -> &'static str {
        match self {
            PidLiveness::Absent => "absent",
            PidLiveness::Alive(_) => "alive",
            PidLiveness::Unverified(_) => "alive-unverified",
            PidLiveness::Stale(_) => "stale",
            PidLiveness::Foreign(_) => "foreign",
            PidLiveness::Unreadable => "unreadable",
        }
    }
    /// The pid the record proves is a live delivery daemon (the only one a stop may signal).
    pub fn daemon_pid(&self) -> Option<u32> {
        match self {
            PidLiveness::Alive(p) | PidLiveness::Unverified(p) => Some(*p),
            _ => None,
        }
    }
    /// The pid named by the record, whatever it proves.
    pub fn recorded_pid(&self) -> Option<u32> {
        match self {
            PidLiveness::Alive(p)
            | PidLiveness::Unverified(p)
            | PidLiveness::Stale(p)
            | PidLiveness::Foreign(p) => Some(*p),
            PidLiveness::Absent | PidLiveness::Unreadable => None,
        }
    }
}

/// Reads and verifies the record at `path`.
pub fn pid_liveness(path: &Path) -> PidLiveness {
    pid_liveness_of(path, argv_names_delivery_daemon)
}

/// Reads and verifies the record at `path`, trusting a live pid only when `names_it` accepts
/// its command line (a record of another kind of process, such as the multi-space host's).
pub fn pid_liveness_of(path: &Path, names_it: fn(&[String]) -> bool) -> PidLiveness {
    if !path.exists() {
        return PidLiveness::Absent;
    }
    let Some(pid) = read_pid(path) else {
        return PidLiveness::Unreadable;
    };
    process_liveness(pid, names_it)
}

/// What a pid is now, judged by `is_ours` on its command line: alive as ours, alive as another
/// program, dead (a zombie counts as dead: it can no longer act), or unverifiable.
pub fn process_liveness(pid: u32, is_ours: fn(&[String]) -> bool) -> PidLiveness {
    if !process_alive(pid) || is_zombie(pid) {
        return PidLiveness::Stale(pid);
    }
    match process_argv(pid) {
        Some(argv) if argv.is_empty() => PidLiveness::Stale(pid),
        Some(argv) if is_ours(&argv) => PidLiveness::Alive(pid),
        Some(_) => PidLiveness::Foreign(pid),
        None => PidLiveness::Unverified(pid),
    }
}

/// The command line of a live process (`None` when `/proc` cannot be read).
pub fn process_argv(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Whether `pid` has exited and waits to be reaped (state `Z` in `/proc/<pid>/stat`).
pub fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself hold spaces.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}

/// A broker's argv: the program is a `nats-server`.
pub fn argv_names_nats_server(argv: &[String]) -> bool {
    argv.first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n.to_string_lossy().starts_with("nats-server"))
}

/// A delivery daemon's argv carries the `deliver` verb and a `--space` flag.
pub fn argv_names_delivery_daemon(argv: &[String]) -> bool {
    argv_names_verb(argv, "deliver")
}

/// A renewal owner's argv: `remint --watch` ([`argv_names_remint_watch`]) or a foreground `up`,
/// each with a `--space` flag.
pub fn argv_names_renewal_owner(argv: &[String]) -> bool {
    argv_names_remint_watch(argv) || argv_names_verb(argv, "up")
}

/// A `remint --watch` process (the only renewal owner a stop signals: a foreground `up` ends on
/// its own when its broker stops).
pub fn argv_names_remint_watch(argv: &[String]) -> bool {
    argv_names_verb(argv, "remint") && argv.iter().any(|a| a == "--watch")
}

fn argv_names_verb(argv: &[String], verb: &str) -> bool {
    argv.iter().skip(1).any(|a| a == verb)
        && argv
            .iter()
            .any(|a| a == "--space" || a.starts_with("--space="))
}

/// Whether a process with this pid exists (signal 0).
pub fn process_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    }
}

/// Opens the space's log for appending, creating it if needed. Returns `None` when stderr already
/// is that file (a detached launcher redirected it), so lines are not written twice.
pub fn open_log(path: &Path) -> Result<Option<File>, FilesError> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| FilesError::io("open", path, e))?;
    if stderr_is(&file) {
        return Ok(None);
    }
    Ok(Some(file))
}

/// Whether this process's stderr is the file at `path` (a launcher redirected it there).
pub fn stderr_is_path(path: &Path) -> bool {
    File::open(path).is_ok_and(|f| stderr_is(&f))
}

fn stderr_is(file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(ours) = file.metadata() else {
        return false;
    };
    match fs::metadata("/proc/self/fd/2") {
        Ok(err) => err.dev() == ours.dev() && err.ino() == ours.ino(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_flag_without_cotal_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = resolve_root(Some(dir.path()), dir.path()).unwrap_err();
        assert_eq!(e.kind(), FilesErrorKind::RootWithoutCotal);
        assert!(e.to_string().contains(&dir.path().display().to_string()));
    }

    #[test]
    fn nearest_cotal_above_cwd_is_the_root() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join(".cotal")).unwrap();
        let deep = dir.path().join("a/b");
        fs::create_dir_all(&deep).unwrap();
        assert_eq!(resolve_root(None, &deep).unwrap(), dir.path());
    }

    #[test]
    fn no_root_anywhere_names_the_directory_searched_from() {
        let dir = tempfile::tempdir().unwrap();
        let e = resolve_root(None, dir.path()).unwrap_err();
        assert_eq!(e.kind(), FilesErrorKind::NoWorkspaceRoot);
        assert!(e.to_string().contains(&dir.path().display().to_string()));
    }

    #[test]
    fn creds_under_another_workstation_is_refused_naming_both() {
        let cwd = Path::new("/w/a");
        let e = check_creds_root(Path::new("/w/b/.cotal/space.64/delivery.creds"), cwd, cwd)
            .unwrap_err();
        assert_eq!(e.kind(), FilesErrorKind::CredsRootMismatch);
        assert!(e.to_string().contains("/w/b") && e.to_string().contains("/w/a"));
        assert!(check_creds_root(Path::new("/elsewhere/d.creds"), cwd, cwd).is_ok());
        assert!(check_creds_root(Path::new(".cotal/x.creds"), cwd, cwd).is_ok());
    }

    #[test]
    fn pid_record_is_removed_only_while_it_names_us() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.pid");
        let rec = PidRecord::write(path.clone(), 4242).unwrap();
        fs::write(&path, "777\n").unwrap();
        rec.remove();
        assert_eq!(read_pid(&path), Some(777));
        let rec = PidRecord::write(path.clone(), 4242).unwrap();
        rec.remove();
        assert!(!path.exists());
    }

    #[test]
    fn liveness_reports_our_own_test_process_as_stale() {
        // This test binary is alive but is not a delivery daemon: a reused pid.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.pid");
        fs::write(&path, format!("{}\n", std::process::id())).unwrap();
        assert_eq!(
            pid_liveness(&path),
            PidLiveness::Foreign(std::process::id())
        );
        assert_eq!(pid_liveness(&dir.path().join("none")), PidLiveness::Absent);
    }

    fn record(server: &str, root: &str, tls: bool) -> MeshRecord {
        MeshRecord {
            space: "demo".into(),
            server: server.into(),
            root: PathBuf::from(root),
            tls_required: tls,
            tls_ca: None,
        }
    }

    /// Mutation seen failing: comparing `--server` against the record removed (dialed instead).
    #[test]
    fn registry_mismatching_server_is_refused_naming_both() {
        let s = Space::parse("demo").unwrap();
        let rec = record("nats://127.0.0.1:5000", "/w", false);
        let e = resolve_dial(
            &s,
            Some("nats://127.0.0.1:6000"),
            false,
            None,
            Path::new("/w"),
            Some(&rec),
            "nats://127.0.0.1:4222",
        )
        .unwrap_err();
        assert_eq!(e.kind(), FilesErrorKind::RegistryServerMismatch);
        assert_eq!(e.to_string(), "delivery: --server nats://127.0.0.1:6000 does not match registered space \"demo\" at nats://127.0.0.1:5000 - deliver refuses to use a different broker than the meshes entry");
        let e = resolve_dial(&s, None, false, None, Path::new("/x"), Some(&rec), "d").unwrap_err();
        assert_eq!(e.kind(), FilesErrorKind::RegistryRootMismatch);
        assert!(e.to_string().contains("/w") && e.to_string().contains("/x"));
    }

    /// Mutation seen failing: `rec.tls_required` dropped from the TLS decision (`tls = flag_tls`:
    /// the recorded TLS mesh is dialed without TLS).
    #[test]
    fn registry_record_is_dialed_with_its_transport_and_no_record_uses_the_default() {
        let s = Space::parse("demo").unwrap();
        let rec = record("tls://127.0.0.1:5000", "/w", true);
        let d = resolve_dial(&s, None, false, None, Path::new("/w"), Some(&rec), "d").unwrap();
        assert_eq!(d.server, "tls://127.0.0.1:5000");
        assert!(d.tls);
        assert_eq!(d.banner.as_deref(), Some("• delivery: space \"demo\" is registered at tls://127.0.0.1:5000 (meshes entry) - dialing it with TLS required"));
        let d = resolve_dial(
            &s,
            None,
            false,
            None,
            Path::new("/w"),
            None,
            "nats://127.0.0.1:4222",
        )
        .unwrap();
        assert_eq!(d.server, "nats://127.0.0.1:4222");
        assert_eq!(d.banner.as_deref(), Some("• delivery: no meshes entry for \"demo\" - dialing nats://127.0.0.1:4222 (the local default)"));
        let d = resolve_dial(
            &s,
            Some("nats://h:1"),
            false,
            None,
            Path::new("/w"),
            None,
            "x",
        )
        .unwrap();
        assert_eq!((d.server.as_str(), d.banner), ("nats://h:1", None));
    }

    /// Mutation seen failing: `rename_all = "camelCase"` dropped from `MeshRecord` (the file
    /// says `tls_required`, not the reference's `tlsRequired`).
    #[test]
    fn registry_record_round_trips_in_the_reference_field_names() {
        let dir = tempfile::tempdir().unwrap();
        let s = Space::parse("demo").unwrap();
        let path = registry_path(dir.path(), &s);
        assert!(path.ends_with("meshes/space.64656d6f.json"));
        assert_eq!(MeshRecord::read(&path).unwrap(), None);
        let rec = record("nats://127.0.0.1:1", "/w", true);
        rec.write(&path).unwrap();
        let raw: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(raw["tlsRequired"], true);
        assert_eq!(raw["server"], "nats://127.0.0.1:1");
        assert_eq!(MeshRecord::read(&path).unwrap(), Some(rec));
    }

    #[test]
    fn argv_check_needs_deliver_and_space() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(argv_names_delivery_daemon(&a(&[
            "cotal-delivery",
            "deliver",
            "--space",
            "x"
        ])));
        assert!(!argv_names_delivery_daemon(&a(&["sleep", "100"])));
        assert!(!argv_names_delivery_daemon(&a(&["deliver", "--space"])));
    }
}
