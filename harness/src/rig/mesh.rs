//! `Mesh`: a local authenticated mesh as an operator would run it, built with the daemon crate's
//! own provisioning (one code path): an operator-mode broker with one data account per space,
//! each space's streams and buckets, and a workspace root whose `.cotal/` holds the daemon's
//! credentials. Test-side checks go through an `operator`-profile connection straight to the
//! broker, never through the daemon.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::jetstream;
use cotal_delivery::base::Credential;
use cotal_delivery::provision::{
    self, MeshAuthority, MintOptions, Profile, ProvisionOptions, SpaceMaterial, Workspace,
};
use cotal_delivery::wire::LeaseInfo;
use cotal_delivery::wire::{Space, SpaceNames, LEASE_KEY};

use crate::rig::broker::{Broker, BrokerBuilder};
use crate::rig::cluster::Cluster;
use crate::rig::daemon::DaemonSpec;
use crate::rig::error::HarnessError;

/// The broker's words (error 10039) while an account's JetStream is not enabled yet ...
const ACCOUNT_JS_NOT_ENABLED: &str = "JetStream not enabled for account";
/// ... how long provisioning waits for it, and how often it asks again.
const ACCOUNT_JS_BOUND: Duration = Duration::from_secs(15);
const ACCOUNT_JS_POLL: Duration = Duration::from_millis(200);

/// How to build a mesh.
pub struct MeshBuilder {
    spaces: Vec<Space>,
    broker: BrokerBuilder,
    lease_ttl: Duration,
    evictor: bool,
    nodes: usize,
}

impl MeshBuilder {
    /// A loopback JetStream cluster of `n` nodes (shaped by [`MeshBuilder::broker`]) instead of
    /// one broker, with every stream and bucket provisioned at `n` replicas
    /// (`ProvisionOptions::replicas`). `n <= 1` keeps the single broker.
    pub fn cluster(mut self, n: usize) -> Self {
        self.nodes = n.max(1);
        self
    }
    /// Adds a space (validated at the provisioning boundary).
    pub fn space(mut self, name: &str) -> Result<Self, HarnessError> {
        let space = Space::parse(name).map_err(|e| HarnessError::Usage(e.to_string()))?;
        self.spaces.push(space);
        Ok(self)
    }
    /// Shapes the broker (TLS, max_payload, file store cap, ping interval...).
    pub fn broker(mut self, f: impl FnOnce(BrokerBuilder) -> BrokerBuilder) -> Self {
        self.broker = f(self.broker);
        self
    }
    /// The lease bucket's `max_age` (the lease TTL).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }
    /// Whether to provision the `$SYS` connection-evictor credential (default yes).
    pub fn evictor(mut self, on: bool) -> Self {
        self.evictor = on;
        self
    }

    pub async fn start(self) -> Result<Mesh, HarnessError> {
        let mut authority = MeshAuthority::new();
        for s in &self.spaces {
            authority.add_space(s);
        }
        let operator = authority
            .operator_auth()
            .map_err(|e| HarnessError::Usage(e.to_string()))?;
        let template = self.broker.operator(operator);
        let (broker, peers) = if self.nodes > 1 {
            let mut nodes = Cluster::start(self.nodes, template).await?.into_nodes();
            let peers = nodes.split_off(1);
            let first = nodes
                .pop()
                .ok_or_else(|| HarnessError::Cluster("a cluster without nodes".into()))?;
            (first, peers)
        } else {
            (template.start().await?, Vec::new())
        };
        let root = tempfile::Builder::new()
            .prefix("cotal-ws-")
            .tempdir()
            .map_err(|e| HarnessError::io("create workspace root", e))?;
        let workspace = Workspace::new(root.path());
        let options = ProvisionOptions::new()
            .lease_ttl(self.lease_ttl)
            .replicas(self.nodes);
        let ca = broker.ca_pem_path();
        for space in &self.spaces {
            let asked = tokio::time::Instant::now();
            loop {
                let provisioned = provision::provision_space(
                    &authority,
                    &broker.client_url(),
                    ca.as_deref(),
                    space,
                    &options,
                )
                .await;
                match provisioned {
                    Ok(_) => break,
                    // A cluster that just became ready (healthz, a meta leader) may not have
                    // enabled JetStream for the account on the node dialled yet: the broker
                    // says so until it has.
                    Err(e)
                        if e.to_string().contains(ACCOUNT_JS_NOT_ENABLED)
                            && asked.elapsed() < ACCOUNT_JS_BOUND =>
                    {
                        tokio::time::sleep(ACCOUNT_JS_POLL).await;
                    }
                    Err(e) => {
                        return Err(HarnessError::Usage(format!("provision {space}: {e}")));
                    }
                }
            }
            let mut material = SpaceMaterial::mint(&authority, space)
                .map_err(|e| HarnessError::Usage(e.to_string()))?;
            if !self.evictor {
                material.connection_evictor = None;
            }
            workspace
                .write_space_material(space, &material)
                .map_err(|e| HarnessError::Usage(e.to_string()))?;
        }
        Ok(Mesh {
            authority,
            broker,
            peers,
            root,
            workspace,
            spaces: self.spaces,
        })
    }
}

/// A running mesh. Dropping it stops the broker and removes the workspace root.
pub struct Mesh {
    pub authority: MeshAuthority,
    /// The broker, or node 0 of a cluster (the URL the mesh's own clients dial).
    pub broker: Broker,
    /// The other nodes of a cluster (empty on a single broker).
    peers: Vec<Broker>,
    root: tempfile::TempDir,
    workspace: Workspace,
    spaces: Vec<Space>,
}

impl Mesh {
    /// A mesh of the two spaces `alpha` and `beta` (the shape of the multi-space tests).
    pub async fn alpha_beta() -> Result<Mesh, HarnessError> {
        Mesh::builder().space("alpha")?.space("beta")?.start().await
    }

    /// A mesh of the one space `demo` with the default lease TTL (the shape most tests start
    /// from).
    pub async fn demo() -> Result<Mesh, HarnessError> {
        Mesh::demo_builder()?.start().await
    }

    /// The builder of [`Mesh::demo`], for a test that changes one thing (the lease TTL, …).
    pub fn demo_builder() -> Result<MeshBuilder, HarnessError> {
        Mesh::builder().space("demo")
    }

    pub fn builder() -> MeshBuilder {
        MeshBuilder {
            spaces: Vec::new(),
            broker: Broker::builder(),
            lease_ttl: Duration::from_secs(30),
            evictor: true,
            nodes: 1,
        }
    }

    /// The workspace root (holds `.cotal/`).
    pub fn root(&self) -> &Path {
        self.root.path()
    }
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// What `up` leaves for `status` on a workstation: the signer under `.cotal/auth/` (status
    /// checks the broker with a credential minted from it) and the mesh's URL in
    /// `.cotal/mesh.json`, recorded for the first space.
    pub fn leave_for_status(&self) -> Result<(), HarnessError> {
        let ws = self.workspace();
        if !ws.auth_dir().join("broker.json").exists() {
            self.authority
                .save(&ws.auth_dir())
                .map_err(|e| HarnessError::Usage(e.to_string()))?;
        }
        cotal_delivery::base::MeshRecord {
            space: self.space().as_str().to_string(),
            server: self.url(),
            root: self.root().to_path_buf(),
            tls_required: self.tls_ca().is_some(),
            tls_ca: self.tls_ca(),
        }
        .write(&cotal_delivery::base::mesh_state_path(self.root()))
        .map_err(|e| HarnessError::Usage(e.to_string()))
    }

    /// The first space.
    pub fn space(&self) -> &Space {
        &self.spaces[0]
    }
    pub fn url(&self) -> String {
        self.broker.client_url()
    }
    pub fn tls_ca(&self) -> Option<PathBuf> {
        self.broker.ca_pem_path()
    }

    /// `cotal-delivery deliver` for `space`, run from the workspace root against this broker
    /// (with `--tls --tls-ca` on a TLS broker).
    pub fn deliver(&self, space: &Space) -> DaemonSpec {
        let mut spec = DaemonSpec::deliver(space.as_str(), self.root()).server(&self.url());
        if let Some(ca) = self.tls_ca() {
            spec = spec.arg("--tls").arg("--tls-ca").arg(ca);
        }
        spec
    }

    /// `cotal-delivery deliver --spaces --root <root>` against this broker (with `--tls
    /// --tls-ca` on a TLS broker): a multi-space host serving `root`'s manifest.
    pub fn host(&self, root: &Path) -> DaemonSpec {
        self.host_at(root, &self.url())
    }

    /// [`Mesh::host`] dialing `server` (a cluster node's URL); the client discovers the other
    /// nodes from the node's INFO and fails over to them.
    pub fn host_at(&self, root: &Path, server: &str) -> DaemonSpec {
        let root = root.display().to_string();
        let mut spec = DaemonSpec::command(&["deliver", "--spaces", "--root", &root], self.root())
            .server(server);
        if let Some(ca) = self.tls_ca() {
            spec = spec.arg("--tls").arg("--tls-ca").arg(ca);
        }
        spec
    }

    /// Node `i` of the cluster (0 is [`Mesh::broker`]); `None` past the last node.
    pub fn node(&self, i: usize) -> Option<&Broker> {
        if i == 0 {
            Some(&self.broker)
        } else {
            self.peers.get(i - 1)
        }
    }
    pub fn node_mut(&mut self, i: usize) -> Option<&mut Broker> {
        if i == 0 {
            Some(&mut self.broker)
        } else {
            self.peers.get_mut(i - 1)
        }
    }
    /// Nodes of the mesh: 1 on a single broker.
    pub fn node_count(&self) -> usize {
        1 + self.peers.len()
    }

    /// The spaces of this mesh.
    pub fn spaces(&self) -> &[Space] {
        &self.spaces
    }

    /// Mints a credential of `profile` in `space`'s account.
    pub fn mint(
        &self,
        space: &Space,
        profile: &Profile,
        options: MintOptions,
    ) -> Result<Credential, HarnessError> {
        self.authority
            .mint(space, profile, options)
            .map_err(|e| HarnessError::Usage(e.to_string()))
    }

    /// Connects with `credential` (inbox prefix `_INBOX_<nkey>`, the broker's CA when TLS).
    pub async fn connect(
        &self,
        credential: &Credential,
        name: &str,
    ) -> Result<async_nats::Client, HarnessError> {
        cotal_delivery::base::connect_with_credential(
            &self.url(),
            self.tls_ca().as_deref(),
            credential,
            name,
            Duration::from_secs(5),
        )
        .await
        .map_err(|e| HarnessError::Usage(e.to_string()))
    }

    /// Like [`Mesh::connect`], also recording the connection's events (permission violations
    /// arrive as `-ERR` server errors).
    pub async fn connect_watched(
        &self,
        credential: &Credential,
        name: &str,
    ) -> Result<(async_nats::Client, crate::rig::events::ClientEvents), HarnessError> {
        let bound = Duration::from_secs(5);
        let nkey = credential
            .public_key()
            .map_err(|e| HarnessError::Usage(e.to_string()))?;
        let options = cotal_delivery::base::credential_options(
            credential,
            self.tls_ca().as_deref(),
            name,
            &cotal_delivery::wire::inbox_prefix(&nkey),
            bound,
        )
        .map_err(|e| HarnessError::Usage(e.to_string()))?;
        let (options, events) = crate::rig::events::ClientEvents::capture(options);
        let client = cotal_delivery::base::connect_options(options, &self.url(), name, bound)
            .await
            .map_err(|e| HarnessError::Usage(e.to_string()))?;
        Ok((client, events))
    }

    /// The test side's own view of `space`: an unrestricted user of the space account, on the
    /// operator profile's lifetime (5 minutes).
    pub async fn inspector(&self, space: &Space) -> Result<Inspector, HarnessError> {
        self.inspector_with(space, MintOptions::new()).await
    }

    /// [`Mesh::inspector`] with its credential minted with `options`: a run that outlives the
    /// operator profile's 5 minutes (a benchmark) sets a longer expiry, or the broker closes its
    /// connection at the expiry.
    pub async fn inspector_with(
        &self,
        space: &Space,
        options: MintOptions,
    ) -> Result<Inspector, HarnessError> {
        let cred = self.mint(space, &Profile::Operator, options)?;
        let client = self.connect(&cred, "harness-inspector").await?;
        let js = jetstream::context::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .build(client.clone());
        Ok(Inspector {
            client,
            js,
            names: SpaceNames::new(space),
        })
    }
}

impl Mesh {
    /// [`Mesh::inspector_with`] on a connection that reconnects without limit: a view that
    /// outlives broker restarts (a simulation's manager and lease watch). The one-shot
    /// inspector stays gone once its broker went away.
    pub async fn standing_inspector(
        &self,
        space: &Space,
        options: MintOptions,
        name: &str,
    ) -> Result<Inspector, HarnessError> {
        let bound = Duration::from_secs(5);
        let cred = self.mint(space, &Profile::Operator, options)?;
        let nkey = cred
            .public_key()
            .map_err(|e| HarnessError::Usage(e.to_string()))?;
        let options = cotal_delivery::base::standing_credential_options(
            &cred,
            self.tls_ca().as_deref(),
            name,
            &cotal_delivery::wire::inbox_prefix(&nkey),
            bound,
        )
        .map_err(|e| HarnessError::Usage(e.to_string()))?;
        let client = cotal_delivery::base::connect_options(options, &self.url(), name, bound)
            .await
            .map_err(|e| HarnessError::Usage(e.to_string()))?;
        let js = jetstream::context::ContextBuilder::new()
            .timeout(bound)
            .build(client.clone());
        Ok(Inspector {
            client,
            js,
            names: SpaceNames::new(space),
        })
    }
}

/// A lease row as the broker holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub info: LeaseInfo,
    pub revision: u64,
}

/// Test-side reads and writes, straight to the broker.
pub struct Inspector {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub names: SpaceNames,
}

impl Inspector {
    async fn lease_rows(&self) -> Result<cotal_delivery::base::Rows, HarnessError> {
        cotal_delivery::base::Rows::open(
            &self.js,
            &self.names.delivery_bucket(),
            Duration::from_secs(5),
        )
        .await
        .map_err(|e| HarnessError::Usage(format!("open lease bucket: {e}")))
    }

    /// The live lease row, leader-served.
    pub async fn lease(&self) -> Result<Option<LeaseRow>, HarnessError> {
        use cotal_delivery::base::Read;
        let rows = self.lease_rows().await?;
        match rows.read(LEASE_KEY).await {
            Ok(Read::Present(row)) => {
                let info: LeaseInfo = serde_json::from_slice(&row.value).map_err(|e| {
                    HarnessError::Usage(format!("lease row is not a LeaseInfo: {e}"))
                })?;
                Ok(Some(LeaseRow {
                    info,
                    revision: row.revision,
                }))
            }
            Ok(Read::Absent { .. }) => Ok(None),
            Err(e) => Err(HarnessError::Usage(format!("read lease: {e}"))),
        }
    }

    /// The revision of the lease key's last write, a row or a marker (a release, a purge, an
    /// expiry); `None` when the key was never written.
    pub async fn lease_revision(&self) -> Result<Option<u64>, HarnessError> {
        use cotal_delivery::base::Read;
        let rows = self.lease_rows().await?;
        match rows.read(LEASE_KEY).await {
            Ok(Read::Present(row)) => Ok(Some(row.revision)),
            Ok(Read::Absent { marker_revision }) => Ok(marker_revision),
            Err(e) => Err(HarnessError::Usage(format!("read lease: {e}"))),
        }
    }

    /// Deletes the lease row (an operator clearing it), whatever holds it.
    pub async fn delete_lease(&self) -> Result<(), HarnessError> {
        let rows = self.lease_rows().await?;
        let Some(row) = self.lease().await? else {
            return Ok(());
        };
        rows.delete_expecting(LEASE_KEY, row.revision)
            .await
            .map(|_| ())
            .map_err(|e| HarnessError::Usage(format!("delete lease: {e}")))
    }

    /// Writes `info` over the current row (compare-and-set at its revision); returns the new revision.
    pub async fn put_lease(&self, info: &LeaseInfo) -> Result<u64, HarnessError> {
        let rows = self.lease_rows().await?;
        let expected = self.lease().await?.map(|r| r.revision).unwrap_or(0);
        let body = serde_json::to_vec(info).unwrap_or_default();
        rows.put_expecting(LEASE_KEY, body.into(), expected)
            .await
            .map_err(|e| HarnessError::Usage(format!("put lease: {e}")))
    }

    /// A request round trip with the broker: everything this connection sent before (a SUB
    /// in particular) has been processed when it returns. `flush()` alone only writes the socket.
    pub async fn sync(&self) -> Result<(), HarnessError> {
        self.js
            .query_account()
            .await
            .map(|_| ())
            .map_err(|e| HarnessError::Usage(format!("round trip: {e}")))
    }

    pub fn names(&self) -> &SpaceNames {
        &self.names
    }

    /// The lease bucket's stream info, as the broker's leader answers it.
    async fn lease_stream_info(&self) -> Result<jetstream::stream::Info, HarnessError> {
        let mut stream = self
            .js
            .get_stream(SpaceNames::kv_stream(&self.names.delivery_bucket()))
            .await
            .map_err(|e| HarnessError::Usage(format!("lease stream: {e}")))?;
        let info = stream
            .info()
            .await
            .map_err(|e| HarnessError::Usage(format!("lease stream info: {e}")))?;
        Ok(info.clone())
    }

    /// The lease bucket's stream config, as the broker holds it.
    pub async fn lease_bucket_config(&self) -> Result<jetstream::stream::Config, HarnessError> {
        Ok(self.lease_stream_info().await?.config)
    }

    /// The lease bucket's stream state, as the broker's leader holds it.
    pub async fn lease_bucket_state(&self) -> Result<jetstream::stream::State, HarnessError> {
        Ok(self.lease_stream_info().await?.state)
    }

    /// Replaces the lease bucket with the one provisioning made before it left expiry markers:
    /// the same config without `allow_msg_ttl` and `subject_delete_marker_ttl` (the broker
    /// cannot turn per-message TTLs off in place). Its rows are gone.
    pub async fn lease_bucket_without_markers(&self) -> Result<(), HarnessError> {
        let mut config = self.lease_bucket_config().await?;
        self.js
            .delete_stream(&config.name)
            .await
            .map_err(|e| HarnessError::Usage(format!("delete the lease stream: {e}")))?;
        config.allow_message_ttl = false;
        config.subject_delete_marker_ttl = None;
        config.metadata.clear();
        self.js
            .create_stream(config)
            .await
            .map_err(|e| HarnessError::Usage(format!("create the old lease stream: {e}")))?;
        Ok(())
    }
}
