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

/// `.cotal/delivery.<key>.log` under `root`.
pub fn log_path(root: &Path, space: &Space) -> PathBuf {
    root.join(COTAL_DIR)
        .join(format!("delivery.{}.log", space.key()))
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
    pub fn path(&self) -> &Path {
        &self.path
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
    /// The pid is dead, or alive as some other program (a reused number).
    Stale(u32),
    /// The record exists but holds no pid.
    Unreadable,
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
    if !process_alive(pid) {
        return PidLiveness::Stale(pid);
    }
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(raw) => {
            let argv: Vec<String> = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if names_it(&argv) {
                PidLiveness::Alive(pid)
            } else {
                PidLiveness::Stale(pid)
            }
        }
        Err(_) => PidLiveness::Unverified(pid),
    }
}

/// A delivery daemon's argv carries the `deliver` verb and a `--space` flag.
pub fn argv_names_delivery_daemon(argv: &[String]) -> bool {
    argv.iter().skip(1).any(|a| a == "deliver")
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
        assert_eq!(pid_liveness(&path), PidLiveness::Stale(std::process::id()));
        assert_eq!(pid_liveness(&dir.path().join("none")), PidLiveness::Absent);
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
