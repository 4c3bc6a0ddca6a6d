//! The renewal owner `remint_daemon_creds` against a real broker: with a preflight it proves
//! every candidate before it overwrites the last good credential, so a same-label signer of
//! another account (self-consistent, named for the space, dead to this broker) never clobbers
//! a working credential; offline it refuses that signer by authority continuity (`iss`).

use std::path::Path;
use std::time::Duration;

use crate::support::data_path::mesh_with_signer;
use crate::support::up::run;
use crate::support::BOUND;
use cotal_delivery::base::{
    delivery_creds_key, membership_rw_creds_key, read_creds_file, write_creds_file_atomic,
    Credential, FsStore, SecretStore,
};
use cotal_delivery::provision::{encode_account_with_signing_keys, encode_operator};
use cotal_delivery::provision::{encode_user, UserClaimsSpec};
use cotal_delivery::provision::{remint_daemon_creds, Preflight, RemintOutcome};
use cotal_delivery::provision::{MeshAuthority, MintOptions, Profile};
use cotal_delivery::provision::{OperatorAuth, Workspace, SIGNER_BUNDLE_KEY};
use cotal_delivery::wire::{Space, SpaceNames};
use delivery_harness::rig::broker::Broker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preflight_keeps_the_last_good_credential_from_a_broker_dead_signer() {
    let mesh = mesh_with_signer().await;
    let space = mesh.space().clone();
    let ws = mesh.workspace();
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

// ---- `cotal-delivery remint`, as an operator runs it ----

/// `remint --space demo --root <root> <extra…>`, run to its exit from `root`.
async fn remint(root: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let r = root.to_str().expect("utf-8").to_string();
    let mut args = vec!["remint", "--space", "demo", "--root", &r];
    args.extend_from_slice(extra);
    let (status, transcript) = run(root, &args, &[]).await;
    (status.code(), transcript)
}

/// The one JSON line of a `--json` run.
fn json_of(transcript: &str) -> serde_json::Value {
    let line = transcript
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON in:\n{transcript}"));
    serde_json::from_str(line).expect("JSON")
}

fn creds_at(root: &Path, key: &str) -> Credential {
    let raw = FsStore::new(root).get(key).expect("read").expect("present");
    Credential::parse(&raw).expect("a credential")
}

/// `remint` re-signs both standing credentials of a serving daemon's workspace (same nkeys,
/// new JWTs the broker accepts), the daemon adopts them on `reloadCreds`, and the report says
/// so per file; exit 0. `--json` carries the same per file. Mutations seen failing: the pass
/// not sending `reloadCreds` (no adoption line in the daemon's log, `reload.adopted` false);
/// `run_remint` exiting 0 whatever the pass (the refused case's exit 1 in the next test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remint_renews_both_files_and_the_daemon_adopts_them() {
    let mesh = mesh_with_signer().await;
    let mut d = crate::support::start(mesh.deliver(mesh.space())).await;
    crate::support::health::wait_started(&mesh, mesh.space(), BOUND).await;
    let root = mesh.root();
    let space = mesh.space().clone();
    let before = [
        creds_at(root, &delivery_creds_key(&space)),
        creds_at(root, &membership_rw_creds_key(&space)),
    ];
    let url = mesh.url();
    let (code, out) = remint(root, &["--server", &url, "--creds-lifetime-secs", "3600"]).await;
    assert_eq!(code, Some(0), "{out}");
    d.wait_for_line("reloadCreds adopted the renewed credential", BOUND)
        .await
        .expect("the daemon adopted it");
    for (i, key) in [delivery_creds_key(&space), membership_rw_creds_key(&space)]
        .iter()
        .enumerate()
    {
        let after = creds_at(root, key);
        assert!(after.jwt != before[i].jwt, "{key} re-signed");
        assert_eq!(after.public_key().ok(), before[i].public_key().ok());
        assert_eq!(after.claims().expect("claims").lifetime_secs(), Some(3600));
        mesh.connect(&after, "renewed")
            .await
            .expect("the broker accepts it");
    }
    snapshot!("remint_renewed", out);

    let (code, out) = remint(root, &["--server", &url, "--json"]).await;
    assert_eq!(code, Some(0), "{out}");
    let v = json_of(&out);
    assert_eq!(v["renewed"], true, "{v}");
    assert_eq!(v["reload"]["adopted"], true, "{v}");
    let files: Vec<&str> = v["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            assert_eq!(f["renewed"], true, "{f}");
            f["file"].as_str().expect("file")
        })
        .collect();
    assert_eq!(files, ["delivery.creds", "membership-rw.creds"]);
    d.terminate().expect("stop");
    let _ = d.wait_exit(BOUND).await;
}

/// A same-label signer of another account in the store: the broker refuses every candidate,
/// each file is reported not renewed, the last good ones are untouched, and `remint` exits 1
/// (`--json`: `renewed:false`, each file's `refused`). A `--server` the registry contradicts is
/// refused before anything is read, exit 3. Mutation seen failing: `run_remint` exiting 0
/// whatever the pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remint_keeps_the_last_good_credentials_and_exits_1_when_the_broker_refuses() {
    let mesh = mesh_with_signer().await;
    let root = mesh.root();
    let space = mesh.space().clone();
    let mut rogue = MeshAuthority::new();
    rogue.add_space(&space);
    rogue
        .save(&mesh.workspace().auth_dir())
        .expect("rogue signer in the store");
    let before = creds_at(root, &delivery_creds_key(&space));
    let url = mesh.url();
    let (code, out) = remint(root, &["--server", &url]).await;
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(creds_at(root, &delivery_creds_key(&space)), before);
    snapshot!("remint_refused", out);
    let (code, out) = remint(root, &["--server", &url, "--json"]).await;
    assert_eq!(code, Some(1), "{out}");
    let v = json_of(&out);
    assert_eq!(v["renewed"], false, "{v}");
    for f in v["files"].as_array().expect("files") {
        assert!(
            f["refused"]
                .as_str()
                .is_some_and(|e| e.contains("did not accept")),
            "{f}"
        );
    }
    // The registry names this root at the mesh's broker; another --server is refused, exit 3.
    let home = root.join("home");
    let record = cotal_delivery::base::MeshRecord {
        space: space.as_str().into(),
        server: url.clone(),
        root: root.to_path_buf(),
        tls_required: false,
        tls_ca: None,
    };
    record
        .write(&cotal_delivery::base::registry_path(&home, &space))
        .expect("registry record");
    let (code, out) = remint(root, &["--server", "nats://127.0.0.1:1"]).await;
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("does not match registered space"), "{out}");
}

/// A bundle in the reference's pre-split shape (`auth/auth.json`), the system seed stripped:
/// its text, the operator block a broker trusting it is configured with, and the account
/// signing key its owner mints users with.
struct RefBundle {
    text: String,
    auth: OperatorAuth,
    signing: nkeys::KeyPair,
    account: String,
}

fn reference_bundle(space: &Space) -> RefBundle {
    use nkeys::KeyPair;
    let operator = KeyPair::new_operator();
    let account = KeyPair::new_account();
    let signing = KeyPair::new_account();
    let sys = KeyPair::new_account();
    let op_jwt = encode_operator(
        &operator,
        &format!("cotal-{}", space.as_str()),
        &sys.public_key(),
    )
    .expect("operator JWT");
    let acc_jwt = encode_account_with_signing_keys(
        &operator,
        &account.public_key(),
        space.as_str(),
        true,
        &[signing.public_key()],
    )
    .expect("account JWT");
    let sys_jwt = encode_account_with_signing_keys(&operator, &sys.public_key(), "SYS", false, &[])
        .expect("system JWT");
    let bundle = serde_json::json!({
        "space": space.as_str(),
        "operator": {"seed": operator.seed().expect("seed"), "jwt": op_jwt},
        "account": {
            "pub": account.public_key(),
            "seed": account.seed().expect("seed"),
            "jwt": acc_jwt,
            "signingSeed": signing.seed().expect("seed"),
            "signingPub": signing.public_key(),
        },
        "sys": {"pub": sys.public_key(), "jwt": sys_jwt},
    });
    RefBundle {
        text: serde_json::to_string_pretty(&bundle).expect("bundle"),
        auth: OperatorAuth {
            operator_jwt: op_jwt,
            system_account: sys.public_key(),
            preload: vec![(account.public_key(), acc_jwt), (sys.public_key(), sys_jwt)],
        },
        signing,
        account: account.public_key(),
    }
}

/// A workspace root as the reference's pre-split layout leaves it: only `auth/auth.json` and
/// the two standing credentials `minted_by`'s owner signed (with its signing key, here, not
/// through the code under test).
fn pre_split_root(bundle: &RefBundle, minted_by: &RefBundle) -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("root");
    let space = Space::parse("demo").expect("space");
    let store = FsStore::new(root.path());
    for (key, profile) in [
        (delivery_creds_key(&space), Profile::Delivery),
        (membership_rw_creds_key(&space), Profile::MembershipRw),
    ] {
        let user = nkeys::KeyPair::new_user();
        let spec = UserClaimsSpec::new(profile.name())
            .permissions(profile.permissions(&SpaceNames::new(&space), &user.public_key()))
            .expires_in(Some(Duration::from_secs(600)))
            .issuer_account(minted_by.account.clone());
        let jwt = encode_user(&minted_by.signing, &user.public_key(), &spec).expect("JWT");
        let cred = Credential::new(jwt, user.seed().expect("seed")).expect("credential");
        store.put(&key, &cred.to_creds_text()).expect("put");
    }
    store.put(SIGNER_BUNDLE_KEY, &bundle.text).expect("put");
    root
}

/// The offline repair, with no broker anywhere: the pre-split bundle is read (the split files
/// are absent), the re-sign is continuous (the bundle's signing key is the current `iss`), the
/// split account file is written and the bundle kept byte for byte; exit 0. A same-label
/// alternate bundle is refused for both files, nothing written, exit 1. Mutations seen
/// failing: the bundle not read (`SpaceSigner::read` returning `Ok(None)` without it: both
/// files skipped `no-auth`, exit 1); the offline `iss` comparison removed (the alternate
/// re-signs both, exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remint_offline_migrates_the_bundle_and_refuses_an_alternate_account() {
    let space = Space::parse("demo").expect("space");
    let good = reference_bundle(&space);
    let root = pre_split_root(&good, &good);
    let before = creds_at(root.path(), &delivery_creds_key(&space));
    // Another lifetime than the current one: a new JWT even within the same second.
    let (code, out) = remint(root.path(), &["--offline", "--creds-lifetime-secs", "900"]).await;
    assert_eq!(code, Some(0), "{out}");
    let after = creds_at(root.path(), &delivery_creds_key(&space));
    assert!(after.jwt != before.jwt, "re-signed");
    assert_eq!(
        after.claims().expect("claims").iss,
        before.claims().expect("claims").iss
    );
    let ws = Workspace::new(root.path());
    assert!(ws
        .auth_dir()
        .join(format!("account.{}.json", space.key()))
        .exists());
    assert_eq!(
        std::fs::read_to_string(ws.auth_dir().join("auth.json")).expect("bundle kept"),
        good.text
    );
    snapshot!("remint_offline_migrated", out);

    let alternate = reference_bundle(&space);
    let other = pre_split_root(&alternate, &good);
    let before = creds_at(other.path(), &delivery_creds_key(&space));
    let (code, out) = remint(other.path(), &["--offline", "--json"]).await;
    assert_eq!(code, Some(1), "{out}");
    let v = json_of(&out);
    for f in v["files"].as_array().expect("files") {
        assert!(
            f["refused"]
                .as_str()
                .is_some_and(|e| e.contains("offline re-sign refused")),
            "{f}"
        );
    }
    assert_eq!(creds_at(other.path(), &delivery_creds_key(&space)), before);
}

/// With a preflight, the migrated signer's candidates are proved against a broker that trusts
/// the bundle's own chain (its operator, its account JWT with the signing key): both files
/// renewed, and the broker accepts them. Mutation seen failing: the re-sign signed by the
/// account key without `issuer_account` when the signing key issued the current one
/// (`key_for` returning the account key: still accepted by the broker, but the `iss` changes;
/// the `iss` assertion fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remint_with_a_preflight_renews_from_a_migrated_bundle() {
    let space = Space::parse("demo").expect("space");
    let bundle = reference_bundle(&space);
    let broker = Broker::builder()
        .operator(bundle.auth.clone())
        .start()
        .await
        .expect("broker");
    let root = pre_split_root(&bundle, &bundle);
    let before = creds_at(root.path(), &delivery_creds_key(&space));
    let url = broker.client_url();
    let (code, out) = remint(root.path(), &["--server", &url]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("migrated the signer bundle"), "{out}");
    let after = creds_at(root.path(), &delivery_creds_key(&space));
    assert_eq!(
        after.claims().expect("claims").iss,
        before.claims().expect("claims").iss
    );
    let client = cotal_delivery::base::connect_with_credential(
        &url,
        None,
        &after,
        "renewed",
        Duration::from_secs(5),
    )
    .await
    .expect("the bundle's broker accepts the renewal");
    let _ = client.drain().await;
}
