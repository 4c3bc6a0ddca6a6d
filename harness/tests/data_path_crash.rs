//! No loss under crash: N posts to a durable channel with several offline members while the
//! daemon is SIGKILLed and restarted at pseudo-random points (a fixed seed, a bounded number of
//! kills). Every member must surface every post at least once; duplicates are counted and
//! reported. Broker state is read from the test side before the members come back.

mod data_path_support;

use std::collections::HashMap;
use std::time::Duration;

use delivery_harness::agent::{self, surface_until};
use delivery_harness::daemon::Daemon;
use delivery_harness::mesh::Mesh;

use data_path_support::*;

const POSTS: usize = 60;
const MEMBERS: usize = 3;
const SEED: u64 = 0x5eed_c07a1;
/// The lease TTL of this mesh: a SIGKILLed holder's row expires this long after its last renew.
const LEASE_TTL: Duration = Duration::from_secs(2);

/// xorshift64*: a deterministic stream of kill decisions.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Starts a daemon, retrying while a killed predecessor's lease has not expired yet.
async fn start_after_crash(mesh: &Mesh) -> Daemon {
    for _ in 0..20 {
        let mut d = daemon_spec(mesh).spawn().expect("spawn");
        if d.wait_for_line("delivery daemon up", Duration::from_secs(6))
            .await
            .is_ok()
        {
            return d;
        }
        let _ = d.kill();
        let _ = d.wait_exit(Duration::from_secs(5)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("no daemon came up within 20 attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_post_is_lost_while_the_daemon_is_killed_and_restarted() {
    let mesh = Mesh::builder()
        .space("demo")
        .unwrap()
        .lease_ttl(LEASE_TTL)
        .start()
        .await
        .unwrap();
    let insp = mesh.inspector(mesh.space()).await.unwrap();
    let mut daemon = start_daemon(&mesh).await;
    let (alice, _) = agent::spawn(&mesh, &insp, "alice", &["general"])
        .await
        .unwrap();
    let mut members = Vec::new();
    for i in 0..MEMBERS {
        let (a, m) = agent::spawn(&mesh, &insp, &format!("member{i}"), &["general"])
            .await
            .unwrap();
        a.durable_join("general").await.unwrap();
        drop(a); // offline for the whole run
        members.push(m);
    }

    let mut rng = Rng(SEED);
    let mut kills = 0;
    let mut ids = Vec::new();
    for i in 0..POSTS {
        let m = alice.message("general", &format!("post-{i}"), None);
        ids.push(m["id"].as_str().unwrap().to_string());
        alice.post("general", &m).await.unwrap();
        // Roughly one post in eight kills the daemon mid-flight, at most six times.
        if kills < 6 && rng.next().is_multiple_of(8) {
            tokio::time::sleep(Duration::from_millis(rng.next() % 40)).await;
            daemon.kill().unwrap();
            daemon.wait_exit(Duration::from_secs(5)).await.unwrap();
            kills += 1;
            daemon = start_after_crash(&mesh).await;
        }
    }
    assert!(kills >= 3, "the seed produced only {kills} kills");

    // Broker state before anyone reconnects: every member's handoff holds every post.
    for m in &members {
        let (p, u) = (m.principal.clone(), m.lifecycle_uid.clone());
        eventually("all posts handed off", Duration::from_secs(60), || async {
            dlv_count(&insp, &p, &u).await >= POSTS as u64
        })
        .await;
    }

    let mut report = Vec::new();
    for m in &members {
        let a = agent::connect(&mesh, m, "member").await.unwrap();
        let mut delivery = a.bind_delivery().await.unwrap();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let frames = surface_until(&mut delivery, Duration::from_secs(60), |f| {
            let mut distinct: Vec<&str> = f.iter().filter_map(|x| x.msg["id"].as_str()).collect();
            distinct.sort();
            distinct.dedup();
            distinct.len() >= POSTS
        })
        .await;
        // Whatever else is pending for it arrives now (duplicates included).
        let rest = agent::surface_for(&mut delivery, Duration::from_millis(500)).await;
        for f in frames.iter().chain(rest.iter()) {
            *seen
                .entry(f.msg["id"].as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
        let missing: Vec<&String> = ids.iter().filter(|id| !seen.contains_key(*id)).collect();
        assert!(
            missing.is_empty(),
            "{} lost {} posts",
            m.principal,
            missing.len()
        );
        let dups: usize = seen.values().map(|n| n - 1).sum();
        report.push(format!(
            "{}: surfaced {} frames for {POSTS} posts, {dups} duplicates",
            m.principal,
            frames.len() + rest.len()
        ));
    }
    eprintln!(
        "no-loss-under-crash: {POSTS} posts, {MEMBERS} offline members, {kills} SIGKILLs (seed {SEED:#x})\n{}",
        report.join("\n")
    );
    stop_daemon(&mut daemon).await;
}
