//! SIGHUP on a running daemon (a terminal hang-up, `systemctl reload`): not a stop. It makes the
//! daemon re-read its credential out of turn, with the 75 % re-read's proof against the broker
//! before anything is adopted; SIGTERM still stops it as before.

use std::time::Duration;

use crate::support::BOUND;
use cotal_delivery::base::{read_creds_file, write_creds_file_atomic};
use cotal_delivery::provision::{MeshAuthority, MintOptions, Profile};
use delivery_harness::rig::mesh::Mesh;
use delivery_harness::ConnState;
use nix::sys::signal::Signal;

use crate::support::health::{own_lines, wait_started};

/// The JWT the broker holds for the daemon's resident connection.
async fn jwt_at_broker(mesh: &Mesh) -> Option<String> {
    let open = mesh.broker.connz_named(ConnState::Open, "cotal:delivery");
    open.await.ok()?.into_iter().next()?.jwt
}

fn hup(pid: u32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGHUP).expect("HUP");
}

/// Three SIGHUPs: with the store unchanged (nothing adopted, said so), with a rogue re-sign in
/// the store (refused by the broker's proof: the connection keeps its JWT), with the owner's
/// real re-sign (adopted: the broker then holds the new JWT for the same connection name). The
/// daemon serves throughout and holds its lease; SIGTERM then stops it with its line, exit 0.
/// Mutations seen failing: SIGHUP not handled in `host::signal::install` (its default action
/// ends the daemon at the first one: no line, killed by SIGHUP); the SIGHUP arm removed from the
/// serve loop (the signal is swallowed: no line at all); the preflight skipped in `reread` (the
/// rogue is refused only by the local continuity check, not by the broker).
#[tokio::test]
async fn sighup_rereads_the_credential_proved_against_the_broker_and_does_not_stop_the_daemon() {
    let mesh = Mesh::demo().await.expect("mesh");
    let space = mesh.space().clone();
    let mut d = crate::support::start(mesh.deliver(&space)).await;
    wait_started(&mesh, &space, BOUND).await;
    let path = mesh.workspace().delivery_creds_path(&space);
    let live = read_creds_file(&path).expect("creds");
    let before = jwt_at_broker(&mesh).await.expect("the daemon's connection");

    let t0 = std::time::Instant::now();
    hup(d.pid());
    d.wait_for_line("received SIGHUP", BOUND)
        .await
        .expect("unchanged store");
    assert!(
        d.has_line("holds the credential in use"),
        "{}",
        d.transcript()
    );

    // A re-sign by another signer of the same label: the broker refuses it.
    let mut rogue = MeshAuthority::new();
    rogue.add_space(&space);
    let forged = rogue
        .mint(
            &space,
            &Profile::Delivery,
            MintOptions::new().renewal_of(&live),
        )
        .expect("forge");
    write_creds_file_atomic(&path, &forged).expect("write");
    hup(d.pid());
    let refused = d
        .wait_for_line("the live credential is unchanged", BOUND)
        .await
        .expect("refused");
    assert!(
        refused.contains("the broker did not accept the candidate credential"),
        "refused by the broker's proof, not by a local check: {refused}"
    );
    assert_eq!(jwt_at_broker(&mesh).await.as_deref(), Some(before.as_str()));

    // The owner's re-sign (same nkey, a later expiry): adopted, proved on the broker.
    let good = mesh
        .mint(
            &space,
            &Profile::Delivery,
            MintOptions::new()
                .renewal_of(&live)
                .expires_in(Duration::from_secs(25 * 3600)),
        )
        .expect("mint");
    write_creds_file_atomic(&path, &good).expect("write");
    hup(d.pid());
    d.wait_for_line("received SIGHUP: adopted the renewed credential", BOUND)
        .await
        .expect("adopted");
    let deadline = tokio::time::Instant::now() + BOUND;
    while jwt_at_broker(&mesh).await.as_deref() != Some(good.jwt.as_str()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broker never held the adopted JWT: {}",
            d.transcript()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "MEASURED three SIGHUPs answered in {} ms",
        t0.elapsed().as_millis()
    );
    assert!(d.is_running(), "{}", d.transcript());
    let insp = mesh.inspector(&space).await.expect("inspector");
    assert!(
        insp.lease().await.expect("lease").is_some(),
        "still holds its lease"
    );

    d.terminate().expect("SIGTERM");
    let st = d.wait_exit(BOUND).await.expect("exits");
    assert_eq!(st.code(), Some(0), "{}", d.transcript());
    assert!(
        d.has_line("received SIGTERM, exiting"),
        "{}",
        d.transcript()
    );
    let lines = own_lines(&d.transcript())
        .lines()
        .filter(|l| !l.contains("broker connection"))
        .collect::<Vec<_>>()
        .join("\n");
    snapshot!("renewal_sighup", lines);
}
