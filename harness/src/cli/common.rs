//! What every subcommand shares: the daemon under test from its flags, paths as the caller typed
//! them, the refusal line (exit 2), the exit that cleans up, the runtime, atomic report writes
//! and the catalogue (found where `kit::catalogue::locate` says; a carried one is unpacked into
//! a temporary directory that [`exit`] removes).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clap::Args;
use delivery_harness::kit::catalogue::{self, Catalogue, Origin};
use delivery_harness::kit::{DaemonCmd, DaemonUnderTest, KitProfile};

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The daemon binary to qualify (a `cotal-delivery` of this distribution; default: the
    /// build of the checkout this harness runs from; an unpacked kit has none). A relative path is taken from the directory you type it in; a
    /// bare name that is no file there is looked up on PATH.
    #[arg(long, value_name = "PATH", conflicts_with = "daemon_cmd")]
    pub daemon: Option<PathBuf>,
    /// Another implementation, started through a command template with the placeholders
    /// {space} {server} {root} {creds} {tls_ca}; words inside `[ … ]` are dropped when one of
    /// their placeholders has no value. Runs the contract profile; cases a template cannot
    /// express are skipped, with the reason. Example: 'node daemon.js --space {space} --server {server}
    /// --root {root} [ --tls-ca {tls_ca} ]'.
    #[arg(long, value_name = "TEMPLATE")]
    pub daemon_cmd: Option<String>,
    /// With --daemon-cmd: the same implementation's standby host, started through a command
    /// template with the placeholders {root} (required: the host's own root, holding its
    /// version-1 manifest and scoped credentials) {server} {tls_ca} {space}. Without it the
    /// standby cases are skipped. Example: 'node host.js --root {root} --server {server} [
    /// --tls-ca {tls_ca} ]'.
    #[arg(long, value_name = "TEMPLATE", requires = "daemon_cmd")]
    pub host_cmd: Option<String>,
    /// The nats-server binary (default: NATS_SERVER_BIN, then .tools/ beside the harness or
    /// above it or the current directory, then PATH); 2.15.1 or newer, checked before the
    /// first case.
    #[arg(long, value_name = "PATH")]
    pub nats_server: Option<PathBuf>,
    /// The profile the cases are judged under: `contract` (what the seeds require of any
    /// Cotal delivery daemon: the broker, the process, the lines the seeds quote) or
    /// `distribution` (the contract and this distribution's own exit codes, lines, transcripts
    /// and commands). Default: `distribution` for --daemon and this checkout's build,
    /// `contract` for --daemon-cmd (which refuses `distribution`).
    #[arg(long, value_name = "PROFILE", value_parser = ["contract", "distribution"])]
    pub profile: Option<String>,
    /// Run the scaled form of the cases that run at the shipped defaults (their [scaled]
    /// windows): what `ci/test` does. Without it they run at the shipped 15 s window, 30 s
    /// lease TTL, 5 s standby retry. Under the contract profile a case whose scaled form
    /// shortens a knob no seed names runs at the seeds' timing all the same.
    #[arg(long)]
    pub scaled: bool,
}

/// The temporary directory a carried catalogue was unpacked into, for [`exit`] to remove.
static UNPACKED: Mutex<Option<tempfile::TempDir>> = Mutex::new(None);

/// Ends the process with `code`, removing what the run unpacked.
pub fn exit(code: i32) -> ! {
    if let Ok(mut held) = UNPACKED.lock() {
        drop(held.take());
    }
    std::process::exit(code);
}

/// A run that could not start: the line naming why, and exit 2.
pub fn refuse(line: &str) -> ! {
    eprintln!("harness: {line}");
    exit(2);
}

/// `path` as the caller meant it: relative to the directory the command is typed in; a bare
/// name that is no file there stays a PATH lookup.
pub fn from_caller(path: PathBuf, cwd: &Path) -> PathBuf {
    let bare = path.components().count() == 1 && !cwd.join(&path).exists();
    if path.is_absolute() || bare {
        path
    } else {
        cwd.join(path)
    }
}

/// The program a name runs: itself when it has a directory part, else the first on PATH.
fn locate(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return Some(program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not an executable file", path.display()));
    }
    Ok(())
}

/// The first line a program prints for `--version`.
pub fn version_of(program: &Path) -> String {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            text.lines().next().unwrap_or_default().trim().to_string()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "(no --version)".into())
}

/// The daemon under test from the flags, checked; exits 2 when it cannot run.
pub fn daemon_under_test(args: &DaemonArgs, cwd: &Path) -> (DaemonUnderTest, String, String) {
    if let Some(bin) = &args.nats_server {
        let bin = from_caller(bin.clone(), cwd);
        if let Err(e) = executable(&bin) {
            refuse(&format!("--nats-server: {e}"));
        }
        // Read by every broker the harness starts (before any thread of the runtime exists).
        std::env::set_var(delivery_harness::rig::server_bin::NATS_SERVER_BIN_ENV, &bin);
    }
    if let Err(e) = delivery_harness::nats_server_bin() {
        refuse(&format!("no usable {e}; or pass --nats-server PATH"));
    }
    match (&args.daemon, &args.daemon_cmd) {
        (_, Some(t)) => {
            let mut cmd = DaemonCmd::parse(t).unwrap_or_else(|e| refuse(&e));
            let mut under_test = format!("--daemon-cmd {t}");
            let mut programs = vec![("--daemon-cmd", t)];
            if let Some(h) = &args.host_cmd {
                cmd = cmd.with_host(DaemonCmd::parse_host(h).unwrap_or_else(|e| refuse(&e)));
                under_test.push_str(&format!(" --host-cmd {h}"));
                programs.push(("--host-cmd", h));
            }
            for (flag, text) in programs {
                let program = PathBuf::from(text.split_whitespace().next().unwrap_or_default());
                if locate(&program).filter(|p| p.is_file()).is_none() {
                    refuse(&format!(
                        "{flag}: {} is not a file or on PATH",
                        program.display()
                    ));
                }
            }
            (
                DaemonUnderTest::Cmd(cmd),
                under_test,
                "(a command template)".into(),
            )
        }
        (Some(bin), None) => {
            let typed = bin.clone();
            let bin = from_caller(bin.clone(), cwd);
            let found = locate(&bin).filter(|p| p.exists()).unwrap_or_else(|| {
                refuse(&format!(
                    "--daemon {}: no such file ({}), and not on PATH",
                    typed.display(),
                    bin.display()
                ))
            });
            if let Err(e) = executable(&found) {
                refuse(&format!("--daemon: {e}"));
            }
            let v = version_of(&found);
            (
                DaemonUnderTest::Bin(found.clone()),
                found.display().to_string(),
                v,
            )
        }
        (None, None) => {
            let bin = delivery_harness::rig::daemon::daemon_bin()
                .unwrap_or_else(|e| refuse(&format!("no --daemon or --daemon-cmd: {e}")));
            let v = version_of(&bin);
            (DaemonUnderTest::Workspace, bin.display().to_string(), v)
        }
    }
}

/// The profile of a run: `--profile`, else the daemon's default (`contract` for a command
/// template, which refuses `distribution`: its lines and exit codes are not this distribution's).
pub fn profile_of(args: &DaemonArgs, daemon: &DaemonUnderTest) -> KitProfile {
    let asked = args
        .profile
        .as_deref()
        .map(|p| KitProfile::parse(p).unwrap_or_else(|e| refuse(&e)));
    match (daemon, asked) {
        (DaemonUnderTest::Cmd(_), Some(KitProfile::Distribution)) => refuse(
            "--daemon-cmd runs the contract profile: the distribution profile judges this distribution's own exit codes, lines and commands, which another implementation does not promise",
        ),
        (DaemonUnderTest::Cmd(_), _) => KitProfile::Contract,
        (_, Some(p)) => p,
        (_, None) => KitProfile::Distribution,
    }
}

pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| refuse(&format!("could not start the runtime: {e}")))
}

/// A run's catalogue, where it was found, and its digest.
pub struct Loaded {
    pub cat: Catalogue,
    pub origin: Origin,
    pub digest: String,
}

impl Loaded {
    /// `<origin> (<path>), <n> cases, <digest>` (the path only when it outlives the run).
    pub fn describe(&self) -> String {
        let place = match self.origin {
            Origin::Carried => String::new(),
            _ => format!(" ({})", self.cat.root.display()),
        };
        format!(
            "{}{place}, {} cases, {}",
            self.origin,
            self.cat.cases.len(),
            self.digest
        )
    }
}

pub fn load_catalogue(dir: Option<PathBuf>, cwd: &Path) -> Loaded {
    let mut found =
        catalogue::locate(dir.map(|d| from_caller(d, cwd))).unwrap_or_else(|e| refuse(&e));
    if let Some(tmp) = found.unpacked.take() {
        if let Ok(mut held) = UNPACKED.lock() {
            *held = Some(tmp);
        }
    }
    let cat = Catalogue::load(&found.root).unwrap_or_else(|errors| {
        for e in &errors {
            eprintln!("harness: {e}");
        }
        refuse(&format!("{} case file(s) refused", errors.len()));
    });
    Loaded {
        cat,
        origin: found.origin,
        digest: found.digest,
    }
}
