//! A renewal that comes after the credential expired: found by `harness simulate` (seed 2,
//! docs/simulation.md "Bugs found"), proved here on the kit's world and verbs.

use std::time::{Duration, Instant};

use delivery_harness::kit::shape::{MeshSpec, Shape};
use delivery_harness::kit::steps::creds::{AdoptionExpect, CredStep as Creds};
use delivery_harness::kit::steps::process::{CredsChoice, CwdChoice, ProcessStep as Process};
use delivery_harness::kit::steps::verb::Ctx;
use delivery_harness::kit::steps::Step;
use delivery_harness::kit::under_test::RunOptions;
use delivery_harness::kit::world::World;

/// The lease TTL of this test: each renew of a daemon whose connection is down waits it out.
const TTL_MS: u64 = 6_000;
/// How long after the expiry line the renewal owner writes: well past one renew's bounds, well
/// before the backstop.
const LATE: Duration = Duration::from_millis(7_000);
/// The broker-gone window this test gives the daemon, plus a margin: how long it must keep
/// running after the adoption.
const WINDOW_AND_MARGIN: Duration = Duration::from_millis(8_000 + 2_000);
/// Bound on each waiting step.
const STEP_BOUND: Duration = Duration::from_secs(25);

async fn step(w: &mut World, step: Step) {
    let now = Instant::now();
    let ctx = Ctx {
        started: now,
        deadline: now + STEP_BOUND,
    };
    if let Err(f) = step.run(w, ctx).await {
        let lines = w
            .daemons
            .get("d")
            .map(|d| d.transcript())
            .unwrap_or_default();
        panic!("{f}\n{lines}");
    }
}

fn wait_line(contains: &str) -> Step {
    Step::Process(Process::WaitLine {
        daemon: "d".into(),
        contains: contains.into(),
    })
}

/// A renewal the owner writes into the store 7 s after the credential expired (17 s before the
/// backstop) is proved and adopted by the daemon's own re-read, although every renew of its
/// lease meanwhile waits out its bounds (the TTL, then the key's re-read): the re-read is not
/// starved by the renew tick, the daemon does not exit "credential expired without renewal",
/// and once adopted it reconnects onto the renewal and keeps serving past a whole window.
/// Mutations seen failing: the serve loop's re-read branch below the renew tick in its biased
/// select (the code `harness simulate --seed 2` found: exit 10 at the backstop); the branch
/// above it but `sleep_until_ms` sleeping zero for a re-read already due (a zero sleep is not
/// ready at its first poll, the missed renew tick is: exit 10); the health clock left where the
/// expiry started it at the adoption (exit 9, broker-gone, in the adoption's millisecond).
#[tokio::test]
async fn a_renewal_written_after_the_expiry_is_adopted_while_each_renew_waits_out_its_bounds() {
    let spec = MeshSpec {
        lease_ttl_ms: delivery_harness::kit::expr::Duration::Ms(TTL_MS),
        ..MeshSpec::default()
    };
    let env: Vec<(String, String)> = [
        ("COTAL_DELIVERY_BROKER_GONE_MS", "8000"),
        ("COTAL_DELIVERY_BROKER_GONE_BACKSTOP_MS", "24000"),
        ("COTAL_DELIVERY_PING_INTERVAL_MS", "1000"),
        ("COTAL_DELIVERY_REMINT_RETRY_MS", "1000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut w = World::start(
        &spec,
        &Shape::parse("operator").expect("shape"),
        env,
        Default::default(),
        &RunOptions::default(),
    )
    .await
    .expect("world");
    step(
        &mut w,
        Step::Process(Process::Start {
            daemon: "d".into(),
            via: None,
            host: None,
            node: 0,
            env: Default::default(),
            args: Vec::new(),
            creds: CredsChoice::Workspace,
            cwd: CwdChoice::Root,
            demand_tls: false,
            no_server: false,
        }),
    )
    .await;
    step(&mut w, wait_line("delivery daemon up")).await;
    // The renewal owner re-signs a 5 s credential and the daemon adopts it at once.
    step(
        &mut w,
        Step::Creds(Creds::Remint {
            lifetime: 5_000,
            rogue: false,
        }),
    )
    .await;
    step(
        &mut w,
        Step::Creds(Creds::ReloadCreds {
            expect: AdoptionExpect::Ok,
            error: None,
            release: None,
        }),
    )
    .await;
    step(
        &mut w,
        wait_line("! delivery: credential expired, awaiting proved renewal"),
    )
    .await;
    // The owner is late on purpose: this is the test, not a wait for readiness.
    tokio::time::sleep(LATE).await;
    step(
        &mut w,
        Step::Creds(Creds::Remint {
            lifetime: 3_600_000,
            rogue: false,
        }),
    )
    .await;
    step(
        &mut w,
        wait_line("✓ delivery: adopted the renewed credential from"),
    )
    .await;
    // Reconnected onto the renewal, and still serving a whole window after the adoption.
    step(
        &mut w,
        Step::Creds(Creds::ExpectBrokerJwt {
            is: delivery_harness::kit::steps::creds::BrokerJwt::Latest,
        }),
    )
    .await;
    let d = w.daemon("d").expect("daemon d");
    assert!(
        d.wait_exit(WINDOW_AND_MARGIN).await.is_err(),
        "the daemon exited after adopting the renewal:\n{}",
        d.transcript()
    );
    assert!(
        !d.has_line("credential expired without renewal"),
        "{}",
        d.transcript()
    );
    d.terminate().expect("SIGTERM");
    let status = d.wait_exit(STEP_BOUND).await.expect("exit");
    assert_eq!(status.code(), Some(0), "{}", d.transcript());
}
