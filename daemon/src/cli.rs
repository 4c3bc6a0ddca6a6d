//! Command-line surface of `cotal-delivery`, and the only place a way out becomes an exit code.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::base;
use crate::host::{DeliverConfig, Ended};
use crate::space::Verdict;
use crate::space::{Closed, StartErrorKind};
use crate::wire::Space;

/// Exit codes a supervisor can act on: the table of `docs/operations.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Stopped by SIGTERM/SIGINT; lease released.
    Signalled = 0,
    /// An unexpected fault during start-up or serving.
    Fault = 1,
    /// Command-line usage error (clap's own exit code).
    Usage = 2,
    /// Refused before dialing: workspace root, credential, flags.
    Config = 3,
    /// The broker did not answer the start-up reachability check (or offered no TLS).
    Unreachable = 4,
    /// `$SYS` observer admission refused.
    Admission = 5,
    /// Another daemon holds (or took) the lease.
    LeaseHeld = 6,
    /// The credential may not write the lease.
    LeaseDenied = 7,
    /// The broker refused a lease write for another reason.
    LeaseRefused = 8,
    /// The broker-gone watchdog expired.
    BrokerGone = 9,
    /// The credential expired without a proved renewal.
    CredentialExpired = 10,
}

impl Exit {
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The one match from a start refusal to its exit code.
    pub fn of_start(kind: StartErrorKind) -> Exit {
        match kind {
            StartErrorKind::Stopped => Exit::Signalled,
            StartErrorKind::Fault => Exit::Fault,
            StartErrorKind::Config
            | StartErrorKind::StoreIdentity
            | StartErrorKind::Account
            | StartErrorKind::OpenMode => Exit::Config,
            StartErrorKind::Unreachable => Exit::Unreachable,
            StartErrorKind::Admission => Exit::Admission,
            StartErrorKind::LeaseHeld => Exit::LeaseHeld,
            StartErrorKind::LeaseDenied => Exit::LeaseDenied,
            StartErrorKind::LeaseRefused => Exit::LeaseRefused,
            StartErrorKind::BrokerGone => Exit::BrokerGone,
            StartErrorKind::CredentialExpired => Exit::CredentialExpired,
        }
    }

    /// The one match from a closure reason to its exit code.
    pub fn of_closed(closed: &Closed) -> Exit {
        match closed {
            Closed::Stopped { .. } => Exit::Signalled,
            Closed::Fault { .. } => Exit::Fault,
            Closed::LeaseTaken { .. } => Exit::LeaseHeld,
            Closed::LeaseDenied { .. } => Exit::LeaseDenied,
            Closed::LeaseRefused { .. } => Exit::LeaseRefused,
            Closed::BrokerGone { .. } => Exit::BrokerGone,
            Closed::CredentialExpired | Closed::CredentialLapsed => Exit::CredentialExpired,
        }
    }

    /// The way a `deliver --spaces` host ended, as its exit code.
    pub fn of_host(ended: &crate::host::HostEnded) -> Exit {
        use crate::host::{HostEnded, HostErrorKind};
        match ended {
            HostEnded::Refused(e) => match e.kind() {
                HostErrorKind::Root | HostErrorKind::Manifest => Exit::Config,
                HostErrorKind::Fault => Exit::Fault,
            },
            HostEnded::Stopped {
                closed_all: true, ..
            } => Exit::Signalled,
            HostEnded::Stopped {
                closed_all: false, ..
            } => Exit::Fault,
        }
    }

    /// The way a `deliver` process ended, as its exit code.
    pub fn of_ended(ended: &Ended) -> Exit {
        match ended {
            Ended::Refused(e) => Exit::of_start(e.kind()),
            Ended::Closed(c) => Exit::of_closed(c),
            Ended::Abandoned(Verdict::CredentialExpired | Verdict::CredentialLapsed) => {
                Exit::CredentialExpired
            }
            Ended::Abandoned(_) => Exit::BrokerGone,
        }
    }
}

/// `--version`: the package version and the build id of the sources (`cotal-delivery build-id`),
/// the pair a run's first log line names too.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (build ",
    env!("COTAL_DELIVERY_BUILD_ID"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "cotal-delivery",
    version = VERSION,
    about = "The Cotal delivery daemon (Plane-3): the durable backstop of an agent mesh on NATS JetStream",
    long_about = "The Cotal delivery daemon (Plane-3): the durable backstop of an agent mesh on NATS JetStream.\n\nOne daemon serves a space, guarded by a single-flight lease in the broker. Exit codes are listed in docs/operations.md."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the delivery daemon for one space (auth mode only; one shard), or with --spaces one
    /// host process serving every space its manifest names, one lane per space.
    #[command(after_help = DELIVER_ENV_HELP)]
    Deliver(DeliverArgs),
    /// Report a space's delivery: broker, lease row, pid record, credential expiry, ctl.delivery.
    #[command(after_help = STATUS_HELP)]
    Status(StatusArgs),
    /// Run a local authenticated mesh: provision the space, start nats-server in operator mode
    /// and the delivery daemon beside it. Foreground by default (Ctrl-C stops both); --detach
    /// leaves both running. On a root whose mesh already runs, relaunches a missing daemon.
    #[command(after_help = UP_HELP)]
    Up(UpArgs),
    /// What the backstop owes a member: INBOX entries not yet handed off and DLV frames not yet
    /// surfaced, per lifecycle and channel, with the oldest one's age. Read-only, with the
    /// space's inspection credential (.cotal/space.<key>/inspect.creds).
    #[command(after_help = INSPECT_HELP)]
    Pending(PendingArgs),
    /// The durable members of a channel: generation, join and leave cursors, earlier intervals,
    /// online or not. Read-only, with the space's inspection credential.
    #[command(after_help = INSPECT_HELP)]
    Members(MembersArgs),
    /// Stop what `up` started at a root: the delivery daemon first (SIGTERM, SIGKILL after the
    /// grace), then nats-server. A daemon `down` stopped stays stopped.
    #[command(after_help = DOWN_HELP)]
    Down(DownArgs),
    /// The renewal owner of a space's standing credentials: re-sign delivery.creds and
    /// membership-rw.creds into the store the daemon reads (each candidate proved against the
    /// broker before it replaces the last good one; --offline only when it keeps the current
    /// account signing key), ask the daemon to adopt them (reloadCreds), and report each file.
    /// With --watch, keep doing it at half of their lifetime until stopped.
    #[command(after_help = REMINT_HELP)]
    Remint(RemintArgs),
    /// Print the hash of the sources this binary was built from (for test harnesses).
    #[command(hide = true)]
    BuildId,
}

const UP_HELP: &str = "Environment:
  COTAL_HOME                     mesh registry home; `up` records the space in $COTAL_HOME/meshes/space.<key>.json [~/.cotal]
  COTAL_DELIVERY_STOP_GRACE_MS   SIGTERM grace before SIGKILL when up stops the daemon [15000]
  COTAL_DELIVERY_SERVING_BOUND_MS  how long up waits for a daemon it started (or restarted) to serve
                                 before the not-bound warning [30000]
  NATS_SERVER_BIN                nats-server binary (when --nats-server is not given)
Files under <root>/.cotal/: nats.pid, nats.log, mesh.json, delivery.<key>.{pid,log,launched,down,stopping}.
Exit codes: 0 stopped cleanly (or launched, with --detach); 1 the daemon did not serve, the broker
exited under up, or start-up failed; 2 bad flags, or a flag that only the up starting a mesh
uses (--port, --demo, --once, --lease-ttl-secs, --tls-cert, --nats-server; --metrics-addr and
--creds-lifetime-secs while the daemon serves) given on a root whose mesh already runs; 3 a malformed --space.";

const DOWN_HELP: &str = "Environment:
  COTAL_DELIVERY_STOP_GRACE_MS   SIGTERM grace before SIGKILL [15000]
Exit codes: 0 stopped (or nothing was running); 1 another stop holds the reservation, or the
daemon outlived SIGKILL (its credential is kept); 2 bad flags; 3 a malformed --space or no
workspace root.";

const STATUS_HELP: &str =
    "Exit codes: 0 healthy (broker reachable, lease ready, pid record alive, credential valid,
ctl.delivery answers); 1 not healthy (the report says which check failed); 2 bad flags; 3 a
malformed --space or no workspace root.
With --spaces: 0 the host's record names a live host; 1 it does not (no record, stale or
foreign, unreadable); 2 bad flags; 3 no workspace root, or the manifest is missing or malformed.
With --json every outcome is one JSON object on stdout, a failure included ({\"error\": {\"kind\",
\"detail\"}, \"exitCode\"}). See docs/host.md for the --json shape.";

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// The space to provision and serve.
    #[arg(long, value_name = "SPACE")]
    pub space: String,
    /// Workspace root; `.cotal/` is created under it (signer, server.conf, credentials, logs).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub root: PathBuf,
    /// Client port of the broker; 0 picks a free one.
    #[arg(long, value_name = "PORT", default_value_t = 4222)]
    pub port: u16,
    /// Serve TLS with this certificate (requires --tls-key and --tls-ca); the daemon is then
    /// always started with TLS demanded.
    #[arg(long, value_name = "PEM", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert.
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// CA that signed --tls-cert, trusted by the daemon.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Lease TTL in seconds (the lease bucket's max_age).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub lease_ttl_secs: u64,
    /// nats-server binary (default: $NATS_SERVER_BIN, else nats-server on PATH).
    #[arg(long, value_name = "PATH")]
    pub nats_server: Option<PathBuf>,
    /// After the daemon serves, show a durable post reaching an agent that was offline when it
    /// was posted (a foreground up that starts the mesh; refused with --detach).
    #[arg(long, conflicts_with = "detach")]
    pub demo: bool,
    /// Stop once the mesh is serving (and the demo ran) instead of waiting for Ctrl-C.
    #[arg(long, conflicts_with = "detach")]
    pub once: bool,
    /// Launch nats-server and the daemon (its stdout/stderr on .cotal/delivery.<key>.log), wait
    /// until it serves, and exit; nothing is restarted. Stop them with `down`.
    #[arg(long)]
    pub detach: bool,
    /// Lifetime of the standing credentials up mints (delivery, membership-rw), in seconds
    /// [default: 24 h]. A foreground up re-signs them at half their lifetime and has the daemon
    /// adopt them (reloadCreds).
    #[arg(long, value_name = "SECS")]
    pub creds_lifetime_secs: Option<u64>,
    /// Start the daemon with `deliver --metrics-addr ADDR` (Prometheus metrics at
    /// http://ADDR/metrics), at start-up, on every restart and on a bare up's relaunch.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
}

const REMINT_HELP: &str =
    "The signer is read through the same store the credentials are written to:
<root>/.cotal/auth/account.<key>.json (or the pre-split bundle auth/auth.json, which is then
migrated into the split files and kept). The preflight dials --server, else the broker the mesh
registry records for the space ($COTAL_HOME/meshes/space.<key>.json), else the root's
.cotal/mesh.json, else nats://127.0.0.1:4222; a --server that differs from the registry is
refused. --watch records itself in <root>/.cotal/remint.<key>.pid and logs to
<root>/.cotal/remint.<key>.log; SIGTERM/SIGINT stop it, SIGHUP makes it re-sign at once.
Exit codes: 0 both files were re-signed and written (--watch: stopped by SIGTERM/SIGINT); 1 a file
was not renewed (the broker did not accept the candidate, --offline continuity refused it, the
store holds no signer or no usable credential: its last good credential is kept), or --watch
found another renewal owner running for the space; 2 bad flags; 3 a malformed --space, no
workspace root, or a --server the registry contradicts. See docs/operations.md.";

#[derive(Debug, clap::Args)]
pub struct RemintArgs {
    /// The space whose standing credentials to re-sign.
    #[arg(long, value_name = "SPACE")]
    pub space: String,
    /// Workspace root holding .cotal/ (signer and credentials). Default: the nearest .cotal/
    /// above the working directory.
    #[arg(long, value_name = "DIR", conflicts_with = "store")]
    pub root: Option<PathBuf>,
    /// An injected directory store instead of a workspace (what `deliver --store DIR` reads):
    /// DIR/auth/account.<key>.json and DIR/space.<key>/*.creds. No registry is consulted.
    #[arg(long, value_name = "DIR", conflicts_with = "watch")]
    pub store: Option<PathBuf>,
    /// Broker URL of the preflight and of reloadCreds (default: see below).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// PEM file of the CA that signed the broker's certificate.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// No broker: write a re-sign only when it is signed by the same account signing key (iss)
    /// as the current credential (a same-label alternate account is refused); no reloadCreds.
    #[arg(long)]
    pub offline: bool,
    /// Lifetime of the re-signed credentials, in seconds [default: the current delivery
    /// credential's own lifetime, else 24 h].
    #[arg(long, value_name = "SECS")]
    pub creds_lifetime_secs: Option<u64>,
    /// Print the report as one JSON object.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Keep running: re-sign at half of the credentials' lifetime, retry a failed pass after a
    /// quarter of what is left (1 to 60 s), until SIGTERM/SIGINT.
    #[arg(long)]
    pub watch: bool,
}

const INSPECT_HELP: &str =
    "Exit codes: 0 the report was printed; 1 the member or channel is unknown to the
broker; 2 bad flags; 3 a malformed space, member or channel, no workspace root, or no inspection
credential; 4 the broker could not be reached, refused the credential, or refused a read. Every
failure is one line on stderr (with --json also one JSON object on stdout: {\"error\": {\"kind\",
\"detail\"}, \"exitCode\"}); nothing is written anywhere.";

/// Where `pending` and `members` look.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The space to inspect.
    #[arg(long, value_name = "SPACE")]
    pub space: String,
    /// Workspace root holding .cotal/space.<key>/inspect.creds (default: nearest .cotal/ above
    /// the working directory).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Broker URL (default: the mesh registry's broker for the space, else
    /// nats://127.0.0.1:4222).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// PEM file of the CA that signed the broker's certificate.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct PendingArgs {
    #[command(flatten)]
    pub at: InspectArgs,
    /// The member, as its principal `<owner>.<actor>` (e.g. local.bob).
    #[arg(value_name = "MEMBER")]
    pub member: String,
}

#[derive(Debug, clap::Args)]
pub struct MembersArgs {
    #[command(flatten)]
    pub at: InspectArgs,
    /// The channel (one name, no wildcards).
    #[arg(value_name = "CHANNEL")]
    pub channel: String,
}

#[derive(Debug, clap::Args)]
pub struct DownArgs {
    /// The space whose daemon to stop.
    #[arg(long, value_name = "SPACE")]
    pub space: String,
    /// Workspace root (default: nearest .cotal/ above the working directory).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
}

/// Timing overrides of `deliver` (the documented defaults; tests shrink windows through these).
const DELIVER_ENV_HELP: &str = "Environment (milliseconds; 0 or garbage keeps the default):
  COTAL_DELIVERY_BROKER_GONE_MS           broker-gone window, less event-loop stall [15000]
  COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS  wall-time backstop, never below the window [4 x window]
  COTAL_DELIVERY_PING_INTERVAL_MS         client ping interval of the resident connection [2500]
  COTAL_DELIVERY_REMINT_RETRY_MS          retry of the credential re-read after a missed remint [60000]
  COTAL_DELIVERY_NAK_DELAY_MS             nak delay of a retried post or entry [2000]
  COTAL_DELIVERY_ACK_WAIT_MS              ack wait of the fanout/reader durables (crash recovery) [5000]
  COTAL_DELIVERY_TIMER_RETRY_MS           first restart backoff of the timer writer, doubling to 300000 [5000]
  COTAL_DELIVERY_TIMER_POLL_MS            how long one timer-writer fetch waits for .schedule requests [1000]
  COTAL_DELIVERY_MEMBERSHIP_INTERVAL_MS   sweep interval of the membership feed [15000]
  COTAL_DELIVERY_STANDBY_RETRY_MS         --spaces: a standby lane's retry of a held lease [5000]
  COTAL_DELIVERY_LANE_BACKOFF_MAX_MS      --spaces: cap of a refused or closed lane's backoff (from 500) [30000]
  COTAL_DELIVERY_SWEEP_SETTLE_MS          $SYS CONNZ page collection ends this long after the last answer [250]
  COTAL_DELIVERY_ANYCAST_SWEEP_MS         interval of the anycast records sweep (also run when serving starts) [600000]
  COTAL_DELIVERY_ANYCAST_ROW_AGE_MS       an anycast row is removed this long after its request left the queue [86400000]
  COTAL_DELIVERY_FAULT_HOLD_AFTER_ANYCAST_ROW  fault injection for tests: 1 = hold 60 s after a take's row, before its DM
  COTAL_DELIVERY_METRICS_SAMPLE_MS        --metrics-addr: sampling period of the lag and state gauges [1000]
  COTAL_DELIVERY_LOG_REPEAT_WINDOW_MS     window over which a repeated line is counted, then summarised once [60000]
  COTAL_DELIVERY_SWEEP_PAGE_LIMIT         (a count) connections per $SYS CONNZ page [1024]
  COTAL_DELIVERY_SWEEP_MAX_PAGES          (a count) CONNZ pages one sweep asks for; more is truncated [64]
  RUST_LOG                                structured diagnostics on stderr (off by default)
The lease TTL is the max_age of the cotal_delivery_<space> bucket, set at provisioning.
Exit codes: docs/operations.md.";

#[derive(Debug, clap::Args)]
pub struct DeliverArgs {
    /// The space to serve (1-64 characters of [A-Za-z0-9_-]).
    #[arg(long, value_name = "SPACE", required_unless_present = "spaces")]
    pub space: Option<String>,
    /// Serve every space named by the host manifest <root>/.cotal/delivery-host.json
    /// ({"version": 1, "spaces": [...]}), one lane per space, each on its own credential,
    /// connections and lease. A malformed manifest refuses the whole start; a lane whose
    /// credential is refused, or whose lease another host holds (standby), is retried on its
    /// own. The host records itself in <root>/.cotal/delivery-host.pid (lanes write none).
    /// Requires --root. See docs/host.md.
    #[arg(long, conflicts_with_all = ["space", "creds", "store"], requires = "root")]
    pub spaces: bool,
    /// Broker URL to dial (nats:// or tls://). Default: the broker the mesh registry records
    /// for the space ($COTAL_HOME/meshes/space.<key>.json), else nats://127.0.0.1:4222. A
    /// --server that differs from the record is refused before any dial.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// Workspace root to serve: the directory that holds .cotal/. Default: the nearest .cotal/
    /// above the working directory; with neither the daemon refuses before reading a credential.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// The scoped `delivery` credential file. Default: <root>/.cotal/space.<hexkey>/delivery.creds.
    /// A file under another workspace than the one served is refused.
    #[arg(long, value_name = "FILE", conflicts_with = "store")]
    pub creds: Option<PathBuf>,
    /// An injected directory store instead of a workspace: DIR holds
    /// space.<hexkey>/delivery.creds (re-read there for renewals), the $SYS pair beside it, and
    /// its own identity DIR/store.id. No .cotal/ is resolved or needed; no pid record or log
    /// file is written (lines go to stderr). Mutually exclusive with --creds.
    #[arg(long, value_name = "DIR", conflicts_with = "root")]
    pub store: Option<PathBuf>,
    /// Require TLS to the broker: refuse a listener that offers no TLS instead of upgrading on
    /// its greeting. A TLS-required mesh always starts the daemon with this flag.
    #[arg(long)]
    pub tls: bool,
    /// PEM file of the CA that signed the broker's certificate (implies nothing about --tls).
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): lags, copies,
    /// handoffs, give-ups, retention discards, lease, connection, credential expiry, rail
    /// verbs; every series labelled `space` (with --spaces, one set per lane on this one
    /// endpoint). Off by default: without it no port is opened. An address that cannot be
    /// bound is refused before dialing (exit 3). Metrics: docs/operations.md.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The space whose daemon to look for.
    #[arg(long, value_name = "SPACE", required_unless_present = "spaces")]
    pub space: Option<String>,
    /// Report the multi-space host (deliver --spaces) of the root instead: its record
    /// <root>/.cotal/delivery-host.pid, and with --json also each space of its manifest (lease
    /// row and whether this host holds it, credential expiry, ctl.delivery). Exit 0 when the
    /// record names a live host, 1 when not, 3 when the root or its manifest cannot be read.
    #[arg(long, conflicts_with = "space")]
    pub spaces: bool,
    /// Workspace root (default: nearest .cotal/ above the working directory).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Parses `args` (the process's own, program name first) and runs the command; returns the exit
/// code. A command line that does not parse exits with clap's usage code (2) after clap's own
/// message on stderr; one that asked for `--json` also gets one JSON object on stdout.
pub fn main_with(args: Vec<std::ffi::OsString>) -> i32 {
    use clap::error::ErrorKind;
    use clap::{CommandFactory, FromArgMatches};
    let json = args.iter().skip(1).any(|a| a == "--json");
    let parsed = Cli::command()
        .try_get_matches_from(args)
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    match parsed {
        Ok((
            Cli {
                command: Command::Up(args),
            },
            m,
        )) => {
            let typed = m
                .subcommand_matches("up")
                .map(typed_flags)
                .unwrap_or_default();
            run_up(args, typed)
        }
        Ok((cli, _)) => run(cli),
        Err(e) => {
            let code = e.exit_code();
            let asked = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand;
            if json && !asked {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or_default();
                let detail = first.strip_prefix("error: ").unwrap_or(first);
                println!("{}", json_failure("usage", detail, code, None));
            }
            let _ = e.print();
            code
        }
    }
}

/// The flags of `matches` typed on the command line (not defaulted), by their long names.
fn typed_flags(matches: &clap::ArgMatches) -> Vec<String> {
    matches
        .ids()
        .filter(|id| {
            matches.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
        })
        .map(|id| format!("--{}", id.as_str().replace('_', "-")))
        .collect()
}

/// The one JSON object a `--json` command prints when it fails before (or instead of) its
/// report: `{"error": {"kind", "detail"}, "exitCode"}`, with `space` when it was read.
fn json_failure(kind: &str, detail: &str, code: i32, space: Option<&str>) -> serde_json::Value {
    let mut v = serde_json::json!({
        "error": {"kind": kind, "detail": detail},
        "exitCode": code,
    });
    if let Some(s) = space {
        v["space"] = s.into();
    }
    v
}

/// Runs a parsed command; returns the process exit code.
pub fn run(cli: Cli) -> i32 {
    match cli.command {
        Command::Deliver(args) => run_deliver(args),
        Command::Status(args) => run_status(args),
        Command::Up(args) => run_up(args, Vec::new()),
        Command::Down(args) => run_down(args),
        Command::Remint(args) => run_remint(args),
        Command::BuildId => {
            println!("{}", crate::BUILD_ID);
            0
        }
        Command::Pending(args) => run_inspect(&args.at, Query::Pending(args.member.clone())),
        Command::Members(args) => run_inspect(&args.at, Query::Members(args.channel.clone())),
    }
}

/// What an inspection asks for.
enum Query {
    Pending(String),
    Members(String),
}

/// `pending` / `members`: one report on stdout, or one line on stderr and the exit code of
/// `INSPECT_HELP`. Read-only: nothing is written.
fn run_inspect(at: &InspectArgs, query: Query) -> i32 {
    use crate::inspect::{members, parse_channel, parse_member, pending, InspectErrorKind};
    let (space, root) = match space_and_root("inspect", &at.space, at.root.as_deref(), at.json) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let cfg = crate::inspect::InspectConfig {
        space,
        root,
        server: at.server.clone(),
        tls_ca: at.tls_ca.clone(),
    };
    let rt = match runtime("inspect") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let json = at.json;
    let result = rt.block_on(async {
        // Tokens are checked before any dial.
        enum Checked {
            Member(crate::wire::Principal),
            Channel(String),
        }
        let checked = match &query {
            Query::Pending(m) => Checked::Member(parse_member(m)?),
            Query::Members(c) => Checked::Channel(parse_channel(c)?),
        };
        let insp = crate::inspect::Inspector::open(&cfg).await?;
        let report = match &checked {
            Checked::Member(m) => pending(&insp, m).await.map(|p| (p.lines(), p.to_json())),
            Checked::Channel(c) => members(&insp, c).await.map(|m| (m.lines(), m.to_json())),
        };
        insp.close().await;
        report
    });
    rt.shutdown_background();
    match result {
        Ok((lines, value)) => {
            if json {
                println!("{value}");
            } else {
                for line in lines {
                    println!("{line}");
                }
            }
            0
        }
        Err(e) => {
            let (kind, code) = match e.kind() {
                InspectErrorKind::Unknown => ("unknown", 1),
                InspectErrorKind::Input => ("input", Exit::Config.code()),
                InspectErrorKind::Broker => ("broker", Exit::Unreachable.code()),
            };
            if json {
                let detail = e.to_string();
                println!("{}", json_failure(kind, &detail, code, Some(&at.space)));
            }
            eprintln!("✗ inspect: {e}");
            code
        }
    }
}

/// The process runtime: two workers (the machine size the daemon is qualified on). A failure
/// to build it is reported under `who` and becomes the fault exit code.
pub fn runtime(who: &str) -> Result<tokio::runtime::Runtime, i32> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("✗ {who}: could not start the runtime ({e})");
            Exit::Fault.code()
        })
}

fn current_dir() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

fn run_deliver(args: DeliverArgs) -> i32 {
    if args.spaces {
        return run_host(args);
    }
    let space = match Space::parse(args.space.as_deref().unwrap_or_default()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("✗ delivery: --space: {e}");
            return Exit::Config.code();
        }
    };
    // Under `up` stderr is the space's log: from here on every line written there is stamped.
    let stamped = crate::host::stamp_stderr(
        &space,
        args.root.as_deref().filter(|_| args.store.is_none()),
        &current_dir(),
    );
    let code = deliver_one(space, args);
    drop(stamped);
    code
}

/// `deliver --space`: the registry's dial, the daemon, its exit code (its run's last line).
fn deliver_one(space: Space, args: DeliverArgs) -> i32 {
    let mut cfg = DeliverConfig::new(space, current_dir());
    // The mesh registry decides the broker of a workstation daemon, before any dial.
    let dial = match registry_dial(&cfg.space, &args, &cfg.cwd) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("✗ {e}");
            return Exit::Config.code();
        }
    };
    cfg.server = dial.server;
    cfg.banner = dial.banner;
    cfg.tls = dial.tls;
    cfg.tls_ca = dial.tls_ca;
    cfg.root = args.root;
    cfg.creds = args.creds;
    cfg.store = args.store;
    cfg.tuning = crate::base::Tuning::from_env();
    let registry = crate::base::MetricsRegistry::new();
    cfg.metrics = registry.for_space(&cfg.space.to_string());
    match runtime("delivery") {
        Ok(rt) => {
            let code = rt.block_on(async {
                let _endpoint = metrics_endpoint(args.metrics_addr.as_deref(), registry).await?;
                let run = crate::host::deliver_space(cfg).await;
                let code = Exit::of_ended(&run.ended).code();
                run.close(code);
                Ok::<_, i32>(code)
            });
            // A task still blocked on the broker must not hold the exit.
            rt.shutdown_background();
            code.unwrap_or_else(|c| c)
        }
        Err(code) => code,
    }
}

/// `deliver --spaces`: the multi-space host. A refused start is a config exit; a signalled
/// host exits 0 once every lane closed.
fn run_host(args: DeliverArgs) -> i32 {
    let registry = crate::base::MetricsRegistry::new();
    let cfg = crate::host::HostConfig {
        root: args.root.unwrap_or_else(|| PathBuf::from(".")),
        cwd: current_dir(),
        lanes: crate::host::LaneInputs {
            root: PathBuf::new(),
            server: args
                .server
                .unwrap_or_else(|| crate::base::DEFAULT_SERVER.to_string()),
            tls: args.tls,
            tls_ca: args.tls_ca,
            tuning: crate::base::Tuning::from_env(),
            metrics: registry.clone(),
        },
    };
    match runtime("delivery host") {
        Ok(rt) => {
            let code = rt.block_on(async {
                let _endpoint = metrics_endpoint(args.metrics_addr.as_deref(), registry).await?;
                let run = crate::host::deliver_spaces(cfg).await;
                let code = Exit::of_host(&run.ended).code();
                run.close(code);
                Ok::<_, i32>(code)
            });
            rt.shutdown_background();
            code.unwrap_or_else(|c| c)
        }
        Err(code) => code,
    }
}

/// Binds `--metrics-addr` when given (kept open while the returned endpoint lives); a bad or
/// unbindable address is refused with one line and the config exit code, before any dial.
async fn metrics_endpoint(
    addr: Option<&str>,
    registry: crate::base::MetricsRegistry,
) -> Result<Option<crate::base::Endpoint>, i32> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let bound = match crate::base::parse_addr(addr) {
        Ok(a) => crate::base::serve(a, registry).await,
        Err(e) => Err(e),
    };
    match bound {
        Ok(ep) => {
            eprintln!("• delivery: metrics at http://{}/metrics", ep.addr);
            Ok(Some(ep))
        }
        Err(e) => {
            eprintln!("✗ delivery: {e}");
            Err(Exit::Config.code())
        }
    }
}

/// The broker a `deliver` typed by hand dials (`base::resolve_dial`), with the banner the run
/// writes once its log is open.
/// A root that cannot be resolved is left for the daemon to refuse with its own line.
fn registry_dial(
    space: &Space,
    args: &DeliverArgs,
    cwd: &std::path::Path,
) -> Result<base::Dial, base::FilesError> {
    let record = match (
        base::resolve_root(args.root.as_deref(), cwd),
        base::cotal_home(),
    ) {
        // A daemon with an injected store never consults the registry.
        _ if args.store.is_some() => (cwd.to_path_buf(), None),
        (Ok(root), Some(home)) => {
            base::MeshRecord::read(&base::registry_path(&home, space)).map(|r| (root, r))?
        }
        _ => (cwd.to_path_buf(), None),
    };
    let dial = base::resolve_dial(
        space,
        args.server.as_deref(),
        args.tls,
        args.tls_ca.as_deref(),
        &record.0,
        record.1.as_ref(),
        crate::base::DEFAULT_SERVER,
    )?;
    Ok(dial)
}

/// A space and workspace root from flags, or the exit code of the refusal (its line on stderr;
/// with `json` also its JSON object on stdout).
fn space_and_root(
    who: &str,
    space: &str,
    root: Option<&std::path::Path>,
    json: bool,
) -> Result<(Space, PathBuf), i32> {
    let refuse = |kind: &str, detail: String| {
        let code = Exit::Config.code();
        if json {
            println!("{}", json_failure(kind, &detail, code, Some(space)));
        }
        eprintln!("✗ {who}: {detail}");
        code
    };
    let parsed = Space::parse(space).map_err(|e| refuse("space", format!("--space: {e}")))?;
    let root =
        base::resolve_root(root, &current_dir()).map_err(|e| refuse("root", e.to_string()))?;
    Ok((parsed, root))
}

fn run_status(args: StatusArgs) -> i32 {
    if args.spaces {
        return run_host_status(args.root, args.json);
    }
    let space = args.space.as_deref().unwrap_or_default();
    let (space, root) = match space_and_root("status", space, args.root.as_deref(), args.json) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let rt = match runtime("status") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let report = rt.block_on(crate::supervise::status(&root, &space));
    if args.json {
        println!("{}", report.to_json());
    } else {
        for line in report.lines() {
            println!("{line}");
        }
    }
    if report.healthy() {
        0
    } else {
        1
    }
}

fn run_down(args: DownArgs) -> i32 {
    let (space, root) = match space_and_root("down", &args.space, args.root.as_deref(), false) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let rt = match runtime("down") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let journal = crate::base::Journal::stderr_only();
    let grace = crate::base::Tuning::from_env().stop_grace;
    match rt.block_on(crate::supervise::down(&root, &space, grace, &journal)) {
        Ok(()) => 0,
        Err(e) => {
            journal.line(e.to_string());
            1
        }
    }
}

/// `remint`: one pass (0 every file renewed, 1 not), or `--watch` until a signal (0; 1 refused
/// at start); 3 for what is refused before anything is read or dialed.
fn run_remint(args: RemintArgs) -> i32 {
    // A refusal before any file is tried: the one failure object every `--json` command
    // prints, and `renewed: false` as a pass's report says it.
    let refuse = |json: bool, kind: &str, space: &str, e: &str| {
        let code = Exit::Config.code();
        if json {
            let mut v = json_failure(kind, e, code, Some(space));
            v["renewed"] = false.into();
            println!("{v}");
        }
        eprintln!("✗ remint: {e}");
        code
    };
    let space = match Space::parse(&args.space) {
        Ok(s) => s,
        Err(e) => return refuse(args.json, "space", &args.space, &format!("--space: {e}")),
    };
    let target = match &args.store {
        Some(dir) => crate::base::RemintTarget::Dir(base::absolute(dir, &current_dir())),
        None => match base::resolve_root(args.root.as_deref(), &current_dir()) {
            Ok(root) => crate::base::RemintTarget::Workspace(root),
            Err(e) => return refuse(args.json, "root", &args.space, &e.to_string()),
        },
    };
    let cfg = crate::supervise::RemintConfig {
        space,
        target,
        server: args.server,
        tls_ca: args.tls_ca,
        lifetime: args
            .creds_lifetime_secs
            .map(|s| std::time::Duration::from_secs(s.max(1))),
        offline: args.offline,
    };
    // Under `up` stderr is the owner's log: from here on every line written there is stamped.
    let stamped = args
        .watch
        .then(|| crate::supervise::stamp_remint_stderr(&cfg))
        .flatten();
    let rt = match runtime("remint") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    if args.watch {
        let run = rt.block_on(crate::supervise::remint_watch(&cfg));
        let code = match &run.ended {
            crate::supervise::WatchEnded::Stopped(_) => 0,
            crate::supervise::WatchEnded::Refused(_) => 1,
        };
        run.close(code);
        rt.shutdown_background();
        drop(stamped);
        return code;
    }
    let pass = rt.block_on(crate::supervise::remint_once(&cfg));
    if let Some(e) = pass.refused_before() {
        return refuse(args.json, "broker", cfg.space.as_str(), &e);
    }
    if args.json {
        println!("{}", crate::supervise::pass_json(&cfg, &pass));
    } else {
        for line in crate::supervise::pass_lines(&cfg, &pass) {
            println!("{line}");
        }
    }
    if pass.renewed() {
        0
    } else {
        1
    }
}

/// `status --spaces`: 0 the host's record names a live host, 1 it does not, 3 no root or no
/// readable manifest (docs/host.md).
fn run_host_status(root: Option<PathBuf>, as_json: bool) -> i32 {
    let rt = match runtime("status") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let cwd = current_dir();
    match rt.block_on(crate::host::host_status(root.as_deref(), &cwd)) {
        Ok(report) => {
            if as_json {
                println!("{}", report.to_json());
            } else {
                for line in report.lines() {
                    println!("{line}");
                }
            }
            if report.running() {
                0
            } else {
                1
            }
        }
        Err(e) => {
            let code = Exit::Config.code();
            if as_json {
                let mut v = e.to_json();
                v["exitCode"] = code.into();
                println!("{v}");
            }
            eprintln!("✗ status: {e}");
            code
        }
    }
}

/// `up`'s flags that only the `up` which starts the mesh uses: typed on a root whose mesh already
/// runs they would do nothing, so `up` refuses them there (`--port` only when it names another
/// port than the running broker's, `--metrics-addr` and `--creds-lifetime-secs` only when the
/// daemon already serves).
const START_ONLY: &[&str] = &[
    "--port",
    "--demo",
    "--once",
    "--lease-ttl-secs",
    "--tls-cert",
    "--tls-key",
    "--nats-server",
];

/// `up`; `typed` are the flags given on the command line (to refuse those a running mesh
/// ignores).
fn run_up(args: UpArgs, typed: Vec<String>) -> i32 {
    let space = match Space::parse(&args.space) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("✗ up: --space: {e}");
            return Exit::Config.code();
        }
    };
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert_file), Some(key_file)) => Some(crate::provision::TlsFiles {
            cert_file,
            key_file,
        }),
        _ => None,
    };
    let tuning = crate::base::Tuning::from_env();
    let cfg = crate::supervise::UpConfig {
        space,
        root: args.root,
        port: args.port,
        tls,
        tls_ca: args.tls_ca,
        nats_server: crate::supervise::nats_server_path(args.nats_server),
        lease_ttl: std::time::Duration::from_secs(args.lease_ttl_secs.max(1)),
        once: args.once,
        detach: args.detach,
        creds_lifetime: args
            .creds_lifetime_secs
            .map(|s| std::time::Duration::from_secs(s.max(1))),
        stop_grace: tuning.stop_grace,
        serving_bound: tuning.serving_bound,
        metrics_addr: args.metrics_addr,
        start_only: typed
            .into_iter()
            .filter(|f| START_ONLY.contains(&f.as_str()))
            .collect(),
    };
    let runtime = match runtime("up") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let demo = args.demo;
    let result = runtime.block_on(crate::supervise::up(cfg, move |mesh| async move {
        if demo {
            crate::supervise::offline_member_receives(&mesh).await
        } else {
            Ok(())
        }
    }));
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            match e.kind() {
                crate::supervise::UpErrorKind::Usage => Exit::Usage.code(),
                _ => 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::StartError;
    use crate::space::{ReleaseError, ReleaseErrorKind, Released};

    /// The exit-code table of `docs/operations.md`, row by row: `(code, meaning)`.
    fn documented_codes() -> Vec<(i32, String)> {
        let doc = include_str!("../../docs/operations.md");
        let table = doc
            .split("## Exit codes")
            .nth(1)
            .expect("docs/operations.md has an Exit codes section");
        table
            .lines()
            .skip_while(|l| !l.starts_with("| code"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (
                    cells[1].parse().expect("a numeric code"),
                    cells[2].to_string(),
                )
            })
            .collect()
    }

    /// Every closure reason and start refusal maps to the code the operations table documents
    /// for it, and every documented code is reached by some reason. Mutation seen caught:
    /// mapping `Closed::LeaseTaken` to `Exit::LeaseRefused` (8 instead of 6) fails the
    /// `another daemon holds the lease` row.
    #[test]
    fn every_closure_reason_maps_to_its_documented_exit_code() {
        let table = documented_codes();
        let meaning = |code: i32| {
            table
                .iter()
                .find(|(c, _)| *c == code)
                .map(|(_, m)| m.clone())
                .unwrap_or_else(|| panic!("code {code} is not in docs/operations.md"))
        };
        let released = Ok(Released::Released);
        let unproved = Err(ReleaseError::new(ReleaseErrorKind::Unconfirmed, "x"));
        // (reason, words its documented row must contain)
        let closures: Vec<(Closed, &str)> = vec![
            (
                Closed::Stopped {
                    by: "SIGTERM",
                    release: released,
                },
                "SIGTERM",
            ),
            (
                Closed::Stopped {
                    by: "SIGINT",
                    release: unproved,
                },
                "SIGINT",
            ),
            (Closed::Fault { detail: "x".into() }, "unexpected fault"),
            (
                Closed::LeaseTaken {
                    by: "local.U".into(),
                },
                "another daemon holds the lease",
            ),
            (
                Closed::LeaseDenied { detail: "x".into() },
                "may not write the lease",
            ),
            (
                Closed::LeaseRefused { detail: "x".into() },
                "refused a lease write",
            ),
            (
                Closed::BrokerGone {
                    verdict: Verdict::BrokerGone,
                },
                "broker-gone watchdog",
            ),
            (
                Closed::BrokerGone {
                    verdict: Verdict::Backstop,
                },
                "broker-gone watchdog",
            ),
            (
                Closed::CredentialExpired,
                "expired without a proved renewal",
            ),
            (Closed::CredentialLapsed, "expired without a proved renewal"),
        ];
        let mut reached = std::collections::BTreeSet::new();
        for (closed, words) in closures {
            let code = Exit::of_ended(&Ended::Closed(closed.clone())).code();
            assert!(
                meaning(code).contains(words),
                "{closed:?} → {code}: {}",
                meaning(code)
            );
            reached.insert(code);
        }
        let starts = [
            (StartErrorKind::Stopped, "SIGTERM"),
            (StartErrorKind::Fault, "unexpected fault"),
            (StartErrorKind::Config, "refused before dialing"),
            (StartErrorKind::StoreIdentity, "refused before dialing"),
            (StartErrorKind::Account, "refused before dialing"),
            (StartErrorKind::OpenMode, "requires no authentication"),
            (StartErrorKind::Unreachable, "reachability"),
            (StartErrorKind::Admission, "admission refused"),
            (StartErrorKind::LeaseHeld, "another daemon holds the lease"),
            (StartErrorKind::LeaseDenied, "may not write the lease"),
            (StartErrorKind::LeaseRefused, "refused a lease write"),
            (StartErrorKind::BrokerGone, "broker-gone watchdog"),
            (
                StartErrorKind::CredentialExpired,
                "expired without a proved renewal",
            ),
        ];
        for (kind, words) in starts {
            let code = Exit::of_ended(&Ended::Refused(StartError::new(kind, "x"))).code();
            assert!(
                meaning(code).contains(words),
                "{kind:?} → {code}: {}",
                meaning(code)
            );
            reached.insert(code);
        }
        for (verdict, code) in [
            (Verdict::BrokerGone, 9),
            (Verdict::Backstop, 9),
            (Verdict::CredentialExpired, 10),
            (Verdict::CredentialLapsed, 10),
        ] {
            assert_eq!(Exit::of_ended(&Ended::Abandoned(verdict)).code(), code);
        }
        reached.insert(Exit::Usage.code());
        let documented: std::collections::BTreeSet<i32> = table.iter().map(|(c, _)| *c).collect();
        assert_eq!(
            reached, documented,
            "every documented code is some reason's"
        );
    }

    /// `deliver --help` names every variable the daemon's `Tuning` reads, and `up --help` the
    /// supervisor's. Mutation seen failing: the membership-interval line removed from
    /// `DELIVER_ENV_HELP`.
    #[test]
    fn the_help_names_every_tuning_variable() {
        use crate::base::{ENV_SERVING_BOUND_MS, ENV_STOP_GRACE_MS, VARIABLES};
        for name in VARIABLES {
            let help = if [ENV_STOP_GRACE_MS, ENV_SERVING_BOUND_MS].contains(&name) {
                UP_HELP
            } else {
                DELIVER_ENV_HELP
            };
            assert!(help.contains(&format!("  {name} ")), "{name} in the help");
        }
    }
}
