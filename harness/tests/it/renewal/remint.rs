//! The renewal owner `remint_daemon_creds` against a real broker: with a preflight it proves
//! every candidate before it overwrites the last good credential, so a same-label signer of
//! another account (self-consistent, named for the space, dead to this broker) never clobbers
//! a working credential; offline it refuses that signer by authority continuity (`iss`).

use std::time::Duration;

use cotal_delivery::creds::{read_creds_file, write_creds_file_atomic};
use cotal_delivery::provision::{remint_daemon_creds, Preflight, RemintOutcome};
use cotal_delivery::provision::{MeshAuthority, MintOptions, Profile};
use delivery_harness::mesh::Mesh;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preflight_keeps_the_last_good_credential_from_a_broker_dead_signer() {
    let mesh = Mesh::demo().await.expect("mesh");
    let space = mesh.space().clone();
    let ws = mesh.workspace();
    mesh.authority.save(&ws.auth_dir()).expect("save signer");
    let preflight = Preflight::new(mesh.url(), mesh.tls_ca());
    let path = ws.delivery_creds_path(&space);
    // The credential in place: a short-lived re-sign of the provisioned one, so the renewal
    // (standing lifetime) is a different JWT even within the same second.
    let provisioned = read_creds_file(&path).expect("delivery creds");
    let before = mesh
        .mint(
            &space,
            &Profile::Delivery,
            MintOptions::new()
                .renewal_of(&provisioned)
                .expires_in(Duration::from_secs(120)),
        )
        .expect("short re-sign");
    write_creds_file_atomic(&path, &before).expect("install it");

    // The real signer: proved against the broker, written, same nkey.
    let report = remint_daemon_creds(mesh.root(), &space, None, Some(&preflight)).await;
    assert!(report.all_written(), "{report:?}");
    let renewed = read_creds_file(&path).expect("renewed");
    assert_ne!(renewed.jwt, before.jwt, "a new JWT");
    assert_eq!(
        renewed.public_key().ok(),
        before.public_key().ok(),
        "the same nkey"
    );
    mesh.connect(&renewed, "renewed")
        .await
        .expect("the broker accepts it");

    // A same-label signer of another account: refused by the preflight, nothing overwritten.
    let mut rogue = MeshAuthority::new();
    rogue.add_space(&space);
    rogue
        .save(&ws.auth_dir())
        .expect("rogue signer in the store");
    let report = remint_daemon_creds(mesh.root(), &space, None, Some(&preflight)).await;
    assert!(!report.all_written());
    for (key, outcome) in &report.files {
        assert!(
            matches!(outcome, RemintOutcome::Refused(_)),
            "{key}: {outcome:?}"
        );
    }
    let kept = read_creds_file(&path).expect("kept");
    assert_eq!(kept, renewed, "the last good credential is untouched");
    mesh.connect(&kept, "kept")
        .await
        .expect("and still accepted by the broker");

    // Offline (no preflight): the candidate's iss breaks continuity, refused as well.
    let report = remint_daemon_creds(mesh.root(), &space, None, None).await;
    assert!(report
        .files
        .iter()
        .all(|(_, o)| matches!(o, RemintOutcome::Refused(_))));
    assert_eq!(read_creds_file(&path).expect("kept"), renewed);
}
