//! The main job's demonstration: a durable post reaches an agent that was offline when it was
//! posted. Runs against the mesh `up` started, through the library's agent client, and prints
//! each step together with what the broker holds (checked with an operator connection, not
//! taken from the daemon's word).

use std::time::Duration;

use async_nats::jetstream;

use crate::agent::{Agent, AgentSpec, Backstop};
use crate::provision::{provision_agent, AgentMaterial};
use crate::provision::{MeshAuthority, MintOptions, Profile, ReadChannels, Roles};
use crate::supervise::RunningMesh;
use crate::wire::{Principal, SpaceNames};

/// The channel of the demo; durable by default (no channel config says otherwise).
const CHANNEL: &str = "general";
/// Bound on each wait of the demo.
const STEP_BOUND: Duration = Duration::from_secs(20);

/// Why the demonstration failed: its kind, the line `up` prints (`Display`), and the error
/// behind it (`source()`).
#[derive(Debug)]
pub struct DemoError {
    kind: DemoErrorKind,
    text: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Which step of the demonstration failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoErrorKind {
    /// The signer could not be loaded, or the operator's credential not minted.
    Authority,
    /// The operator or an agent could not connect.
    Connect,
    /// An agent could not be provisioned.
    Provision,
    /// Bob's durable join failed or left the backstop unestablished.
    Join,
    /// Alice's post failed.
    Post,
    /// The post did not reach bob's durable, or bob could not bind or surface it in time.
    Delivery,
}

impl DemoError {
    fn new(kind: DemoErrorKind, text: impl Into<String>) -> DemoError {
        DemoError {
            kind,
            text: text.into(),
            source: None,
        }
    }
    pub fn kind(&self) -> DemoErrorKind {
        self.kind
    }
}

impl std::fmt::Display for DemoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for DemoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A step's failure of `kind`, the line `text(error)`, the error kept as its cause.
fn failed<E: std::error::Error + Send + Sync + 'static>(
    kind: DemoErrorKind,
    text: impl FnOnce(&E) -> String,
) -> impl FnOnce(E) -> DemoError {
    move |e| DemoError {
        kind,
        text: text(&e),
        source: Some(Box::new(e)),
    }
}

/// Demo lines go where `up`'s own lines go (stderr), so the story reads in order.
fn say(line: impl AsRef<str>) {
    eprintln!("{}", line.as_ref());
}

async fn connect(mesh: &RunningMesh, m: &AgentMaterial, name: &str) -> Result<Agent, DemoError> {
    Agent::connect(AgentSpec::of_material(
        mesh.url.clone(),
        mesh.tls_ca.clone(),
        m,
        name,
    ))
    .await
    .map_err(failed(DemoErrorKind::Connect, |e| {
        format!("demo: {name} could not connect: {e}")
    }))
}

/// Frames waiting in `member`'s handoff durable, read from the broker.
async fn pending_frames(js: &jetstream::Context, names: &SpaceNames, m: &AgentMaterial) -> u64 {
    let durable = SpaceNames::dlv_durable(&m.principal, &m.lifecycle_uid);
    match js
        .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(
            &durable,
            names.dlv_stream(),
        )
        .await
    {
        Ok(mut c) => c.info().await.map(|i| i.num_pending).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Bob joins `general` durably and goes offline; alice posts; bob comes back and surfaces it.
pub async fn offline_member_receives(mesh: &RunningMesh) -> Result<(), DemoError> {
    use DemoErrorKind as K;
    let authority = MeshAuthority::load(&mesh.workspace.auth_dir())
        .map_err(failed(K::Authority, |e| {
            format!("demo: could not load the signer: {e}")
        }))?;
    let operator = authority
        .mint(&mesh.space, &Profile::Operator, MintOptions::new())
        .map_err(failed(K::Authority, |e| format!("demo: {e}")))?;
    let client = crate::base::connect_with_credential(
        &mesh.url,
        mesh.tls_ca.as_deref(),
        &operator,
        "cotal-demo-operator",
        crate::base::BROKER_BOUND,
    )
    .await
    .map_err(failed(K::Connect, |e| format!("demo: {e}")))?;
    let js = jetstream::new(client.clone());
    let names = SpaceNames::new(&mesh.space);
    let read =
        ReadChannels::new([CHANNEL]).map_err(failed(K::Provision, |e| format!("demo: {e}")))?;
    let mut material = Vec::new();
    for actor in ["alice", "bob"] {
        let principal = Principal::new("local", actor)
            .map_err(failed(K::Provision, |e| format!("demo: {e}")))?;
        let m = provision_agent(
            &authority,
            &js,
            &mesh.space,
            &principal,
            read.clone(),
            Roles::none(),
            MintOptions::new(),
        )
        .await
        .map_err(failed(K::Provision, |e| {
            format!("demo: provisioning {actor} failed: {e}")
        }))?;
        material.push(m);
    }
    let (alice_m, bob_m) = (&material[0], &material[1]);
    say(format!(
        "• demo: agents alice and bob provisioned in space {} (read ACL: {CHANNEL})",
        mesh.space
    ));

    let bob = connect(mesh, bob_m, "bob").await?;
    let joined = bob
        .durable_join(CHANNEL)
        .await
        .map_err(failed(K::Join, |e| format!("demo: bob's join failed: {e}")))?;
    match &joined.backstop {
        Backstop::Durable { generation } => say(format!(
            "• demo: bob joined {CHANNEL} durably (generation {generation}; the daemon wrote the membership row)"
        )),
        Backstop::Unestablished { reason } => {
            return Err(DemoError::new(
                K::Join,
                format!(
                    "demo: bob joined {CHANNEL} live with the durable backstop unestablished ({reason})"
                ),
            ))
        }
    }
    drop(joined);
    drop(bob);
    say("• demo: bob goes offline");

    let alice = connect(mesh, alice_m, "alice").await?;
    let text = "hello bob - this was posted while you were offline";
    let msg = alice.message(CHANNEL, text, None);
    let seq = alice
        .post(CHANNEL, &msg)
        .await
        .map_err(failed(K::Post, |e| {
            format!("demo: alice's post failed: {e}")
        }))?;
    say(format!(
        "• demo: alice posts on {CHANNEL} (CHAT sequence {seq}) while bob is offline"
    ));

    let deadline = tokio::time::Instant::now() + STEP_BOUND;
    loop {
        let n = pending_frames(&js, &names, bob_m).await;
        if n >= 1 {
            say(format!(
                "• demo: the daemon fanned the post into bob's backstop and handed it to {} ({n} pending, checked on the broker)",
                SpaceNames::dlv_durable(&bob_m.principal, &bob_m.lifecycle_uid)
            ));
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(DemoError::new(
                K::Delivery,
                format!(
                    "demo: no frame reached bob's durable within {} s",
                    STEP_BOUND.as_secs()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let bob = connect(mesh, bob_m, "bob").await?;
    let mut delivery = bob.bind_delivery().await.map_err(failed(K::Delivery, |e| {
        format!("demo: bob could not bind his durable: {e}")
    }))?;
    say("• demo: bob comes back online and binds his durable");
    let frame = delivery
        .surface(STEP_BOUND, |f| {
            let from = f.msg["from"]["name"].as_str().unwrap_or("?");
            let body = f.msg["parts"][0]["text"].as_str().unwrap_or("");
            say(format!(
                "✓ demo: bob surfaced [{}] {from}: {body}",
                f.channel
            ));
        })
        .await
        .map_err(failed(K::Delivery, |e| format!("demo: {e}")))?;
    if frame.is_none() {
        return Err(DemoError::new(
            K::Delivery,
            format!(
                "demo: bob surfaced nothing within {} s",
                STEP_BOUND.as_secs()
            ),
        ));
    }
    let left = pending_frames(&js, &names, bob_m).await;
    say(format!(
        "✓ demo: delivered at least once to a member who was offline when it was posted ({left} left pending)"
    ));
    let _ = client.drain().await;
    Ok(())
}
