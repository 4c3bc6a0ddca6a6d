//! Proof that each broker shape the harness offers is real, checked from the client side against
//! a running nats-server: TLS is required and only the generated CA is trusted, max_payload is
//! enforced by the server, a 3-node cluster survives a node kill, the file store survives a
//! crash and restart, a frozen broker is seen as gone, and the proxy's faults bite and heal.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use async_nats::{ConnectOptions, Event};
use bytes::Bytes;
use delivery_harness::{wait_until, Broker, ClientEvents, Cluster, TcpProxy};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const IO_BOUND: Duration = Duration::from_secs(5);

/// Reads the server's first protocol line (`INFO {...}`) from a raw socket.
async fn read_info(
    stream: &mut BufReader<TcpStream>,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let mut line = String::new();
    tokio::time::timeout(IO_BOUND, stream.read_line(&mut line)).await??;
    let json = line
        .strip_prefix("INFO ")
        .ok_or_else(|| format!("first line is not INFO: {line:?}"))?;
    Ok(serde_json::from_str(json.trim())?)
}

/// Everything the server sends until it closes the socket (bounded).
async fn read_until_closed(
    stream: &mut BufReader<TcpStream>,
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut all = Vec::new();
    let closed = tokio::time::timeout(IO_BOUND, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    closed.map_err(|_| "the server did not close the connection")?;
    Ok(all)
}

#[tokio::test]
async fn a_broker_that_cannot_listen_fails_fast_with_its_log() -> TestResult {
    let first = Broker::builder()
        .name("first")
        .jetstream(false)
        .start()
        .await?;
    let started = std::time::Instant::now();
    let err = Broker::builder()
        .name("second")
        .jetstream(false)
        .port(first.port())
        .start()
        .await
        .err()
        .ok_or("two brokers listened on one port")?;
    assert_eq!(err.kind(), delivery_harness::ErrorKind::Spawn);
    let text = err.to_string();
    assert!(text.contains("address already in use"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the failure was not noticed early"
    );
    Ok(())
}

#[tokio::test]
async fn tls_broker_refuses_plaintext_and_trusts_only_its_ca() -> TestResult {
    let broker = Broker::builder()
        .name("tls")
        .jetstream(false)
        .tls()
        .start()
        .await?;
    let port = broker.port();
    assert_eq!(broker.client_url(), format!("tls://127.0.0.1:{port}"));

    // A plaintext client: the INFO line demands TLS, and plaintext CONNECT+PING gets no PONG.
    let mut raw = BufReader::new(TcpStream::connect(("127.0.0.1", port)).await?);
    let info = read_info(&mut raw).await?;
    assert_eq!(
        info["tls_required"],
        serde_json::Value::Bool(true),
        "{info}"
    );
    raw.get_mut()
        .write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")
        .await?;
    let answer = read_until_closed(&mut raw).await?;
    assert!(
        !String::from_utf8_lossy(&answer).contains("PONG"),
        "plaintext client was served: {answer:?}"
    );

    // An async-nats client that does not trust the CA fails, on tls:// and on nats:// alike.
    for url in [
        format!("tls://127.0.0.1:{port}"),
        format!("nats://127.0.0.1:{port}"),
    ] {
        let refused = ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(url.as_str())
            .await;
        let err = refused
            .err()
            .ok_or_else(|| format!("{url}: connected without the CA"))?;
        assert!(err.to_string().contains("certificate"), "{url}: {err}");
    }

    // Trusting the CA works by IP and by name (the leaf has both SANs), with a real round trip.
    for url in [
        format!("tls://127.0.0.1:{port}"),
        format!("tls://localhost:{port}"),
    ] {
        let client = broker.connect_options().connect(url.as_str()).await?;
        assert!(client.server_info().tls_required, "{url}");
        let mut sub = client.subscribe("tls.check").await?;
        client
            .publish("tls.check", Bytes::from_static(b"hi"))
            .await?;
        let msg = tokio::time::timeout(IO_BOUND, sub.next())
            .await?
            .ok_or("subscription ended")?;
        assert_eq!(msg.payload, Bytes::from_static(b"hi"), "{url}");
    }
    Ok(())
}

#[tokio::test]
async fn max_payload_broker_refuses_an_oversized_publish() -> TestResult {
    let broker = Broker::builder()
        .name("maxpayload")
        .jetstream(false)
        .max_payload_bytes(4096)
        .start()
        .await?;
    assert_eq!(broker.varz().await?["max_payload"], 4096);

    // The client learns the limit from the first INFO (no retry_on_initial_connect, so
    // server_info is populated when connect returns) and refuses before sending.
    let client = async_nats::connect(broker.client_url()).await?;
    assert_eq!(client.server_info().max_payload, 4096);
    let err = client
        .publish("big", Bytes::from(vec![b'x'; 4097]))
        .await
        .err()
        .ok_or("an oversized publish was accepted")?;
    assert_eq!(
        err.kind(),
        async_nats::client::PublishErrorKind::MaxPayloadExceeded
    );
    client
        .publish("fits", Bytes::from(vec![b'x'; 4096]))
        .await?;
    client.flush().await?;

    // The server enforces it too: a raw oversized PUB gets its max-payload error and the close.
    let mut raw = BufReader::new(TcpStream::connect(("127.0.0.1", broker.port())).await?);
    assert_eq!(read_info(&mut raw).await?["max_payload"], 4096);
    let mut frame = b"CONNECT {\"verbose\":false}\r\nPUB big 5000\r\n".to_vec();
    frame.extend_from_slice(&[b'x'; 5000]);
    frame.extend_from_slice(b"\r\nPING\r\n");
    raw.get_mut().write_all(&frame).await?;
    let answer = String::from_utf8_lossy(&read_until_closed(&mut raw).await?).to_string();
    assert!(
        answer.contains("-ERR 'Maximum Payload Violation'"),
        "{answer:?}"
    );
    assert!(!answer.contains("PONG"), "{answer:?}");
    Ok(())
}

#[tokio::test]
async fn three_node_cluster_keeps_an_r3_bucket_after_a_node_kill() -> TestResult {
    let mut cluster = Cluster::start(3, Broker::builder().name("c3")).await?;
    let urls = cluster.client_urls();
    assert_eq!(urls.len(), 3);
    let client = cluster.connect_options().connect(urls).await?;
    let mut js = jetstream::new(client);
    js.set_timeout(Duration::from_secs(2));

    let config = kv::Config {
        bucket: "r3".into(),
        num_replicas: 3,
        history: 1,
        ..Default::default()
    };
    let kv = wait_until(
        Duration::from_secs(20),
        Duration::from_millis(100),
        "R3 bucket creation",
        || {
            let js = js.clone();
            let config = config.clone();
            async move { js.create_key_value(config).await }
        },
    )
    .await?;
    kv.put("k", Bytes::from_static(b"v1")).await?;

    // Kill the node leading the bucket's stream: the worst case for availability.
    let mut stream = js.get_stream("KV_r3").await?;
    let info = stream.info().await?;
    assert_eq!(info.config.num_replicas, 3);
    let leader = info
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .ok_or("stream has no leader")?;
    let victim = cluster
        .index_of(&leader)
        .ok_or("leader is not a cluster node")?;
    cluster.kill_node(victim).await?;

    let started = std::time::Instant::now();
    wait_until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "a put after the leader kill",
        || {
            let kv = kv.clone();
            async move { kv.put("k", Bytes::from_static(b"v2")).await }
        },
    )
    .await?;
    let value = wait_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "a get after the leader kill",
        || {
            let kv = kv.clone();
            async move { kv.get("k").await }
        },
    )
    .await?;
    assert_eq!(value, Some(Bytes::from_static(b"v2")));
    eprintln!(
        "R3 bucket writable again {} ms after the leader kill",
        started.elapsed().as_millis()
    );

    let new_leader = wait_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "a new stream leader",
        || {
            let js = js.clone();
            async move {
                let mut s = js.get_stream("KV_r3").await.ok()?;
                s.info().await.ok()?.cluster.as_ref()?.leader.clone()
            }
        },
    )
    .await?;
    assert_ne!(new_leader, leader);

    // The killed node comes back on its ports and store and the cluster is whole again.
    cluster.restart_node(victim).await?;
    assert!(cluster.meta_leader(victim).await?.is_some());
    Ok(())
}

#[tokio::test]
async fn restarted_broker_keeps_its_file_store_on_the_same_port() -> TestResult {
    let mut broker = Broker::builder().name("restart").start().await?;
    let port = broker.port();
    let monitoring_port = broker.monitoring_port();
    {
        let js = jetstream::new(async_nats::connect(broker.client_url()).await?);
        js.create_stream(stream::Config {
            name: "KEEP".into(),
            subjects: vec!["keep.>".into()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
        js.publish("keep.a", Bytes::from_static(b"survives"))
            .await?
            .await?;
    }

    let old_pid = broker.pid();
    broker.kill()?;
    let status = broker.wait_exit(IO_BOUND).await?;
    assert!(
        !status.success(),
        "SIGKILL should not look like a clean exit: {status}"
    );
    // nats-server leaves its ports file behind after SIGKILL; restart must not be fooled by it.
    let stale = broker
        .dir()
        .join("ports")
        .join(format!("nats-server_{old_pid}.ports"));
    assert!(
        stale.exists(),
        "expected a stale ports file at {}",
        stale.display()
    );

    broker.restart().await?;
    assert_ne!(broker.pid(), old_pid);
    assert_eq!(broker.port(), port);
    assert_eq!(broker.monitoring_port(), monitoring_port);
    assert!(!stale.exists());

    let js = jetstream::new(async_nats::connect(broker.client_url()).await?);
    let stream = js.get_stream("KEEP").await?;
    let msg = stream.get_raw_message(1).await?;
    assert_eq!(msg.payload, Bytes::from_static(b"survives"));
    assert_eq!(broker.jsz().await?["messages"], 1);
    assert!(broker.store_dir().join("jetstream").is_dir());
    Ok(())
}

#[tokio::test]
async fn frozen_broker_is_seen_as_disconnected_and_thaws() -> TestResult {
    let mut broker = Broker::builder()
        .name("freeze")
        .jetstream(false)
        .start()
        .await?;
    let (options, mut events) = ClientEvents::capture(
        broker
            .connect_options()
            .ping_interval(Duration::from_millis(200))
            .connection_timeout(Duration::from_secs(1)),
    );
    let client = options.connect(broker.client_url()).await?;
    client.flush().await?;

    broker.freeze()?;
    let frozen_at = std::time::Instant::now();
    events
        .wait_for(
            Duration::from_secs(10),
            "a disconnect while the broker is frozen",
            |e| matches!(e, Event::Disconnected),
        )
        .await?;
    eprintln!(
        "disconnect seen {} ms after SIGSTOP",
        frozen_at.elapsed().as_millis()
    );
    assert!(
        broker.is_running(),
        "a frozen broker is still a live process"
    );

    broker.thaw()?;
    events
        .wait_for(Duration::from_secs(10), "a reconnect after thaw", |e| {
            matches!(e, Event::Connected)
        })
        .await?;
    client.flush().await?;

    // Dropping a frozen broker still kills and reaps it.
    broker.freeze()?;
    let pid = broker.pid();
    drop(broker);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} outlived its Broker"
    );
    Ok(())
}

/// A responder on the broker itself, answering `echo` with the request payload.
async fn spawn_echo(
    broker: &Broker,
) -> Result<tokio::task::JoinHandle<()>, Box<dyn std::error::Error>> {
    let responder = async_nats::connect(broker.client_url()).await?;
    let mut sub = responder.subscribe("echo").await?;
    responder.flush().await?;
    Ok(tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            if let Some(reply) = msg.reply {
                let _ = responder.publish(reply, msg.payload).await;
            }
        }
    }))
}

#[tokio::test]
async fn proxy_blackhole_stops_replies_until_heal() -> TestResult {
    let broker = Broker::builder()
        .name("proxy")
        .jetstream(false)
        .start()
        .await?;
    let echo = spawn_echo(&broker).await?;
    let proxy = TcpProxy::start(broker.port()).await?;
    let client = ConnectOptions::new()
        .request_timeout(Some(Duration::from_millis(500)))
        .connect(proxy.url())
        .await?;
    client
        .request("echo", Bytes::from_static(b"before"))
        .await?;

    proxy.blackhole();
    let refused = client.request("echo", Bytes::from_static(b"during")).await;
    assert!(refused.is_err(), "a reply crossed the blackhole");
    assert_eq!(
        proxy.active_count(),
        1,
        "the blackholed socket must stay open"
    );

    proxy.heal();
    let reply = wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "a reply after heal",
        || {
            let client = client.clone();
            async move { client.request("echo", Bytes::from_static(b"after")).await }
        },
    )
    .await?;
    assert_eq!(reply.payload, Bytes::from_static(b"after"));
    echo.abort();
    Ok(())
}

#[tokio::test]
async fn proxy_blackhole_new_holds_only_new_connections() -> TestResult {
    let broker = Broker::builder()
        .name("proxynew")
        .jetstream(false)
        .start()
        .await?;
    let echo = spawn_echo(&broker).await?;
    let proxy = TcpProxy::start(broker.port()).await?;
    let client = ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(2)))
        .connect(proxy.url())
        .await?;

    proxy.blackhole_new();
    client
        .request("echo", Bytes::from_static(b"old path"))
        .await?;
    let held = ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .connect(proxy.url())
        .await;
    assert!(held.is_err(), "a new connection got through the blackhole");

    proxy.heal();
    let fresh = ConnectOptions::new().connect(proxy.url()).await?;
    fresh.flush().await?;
    echo.abort();
    Ok(())
}

/// A delay keeps the broker's reply to each request on one subject, frame-exact, while every
/// other frame on the same connection flows (a reply larger than a proxy chunk among them); the
/// release hands the kept reply over whole, and later requests are answered at once.
/// Mutation seen failing: `Delay::keeps` matching any `MSG` (the echo's reply is kept too).
#[tokio::test]
async fn proxy_delay_keeps_only_the_replies_to_one_subject_until_release() -> TestResult {
    let broker = Broker::builder()
        .name("proxydelay")
        .jetstream(false)
        .start()
        .await?;
    let echo = spawn_echo(&broker).await?;
    let responder = async_nats::connect(broker.client_url()).await?;
    let mut info = responder.subscribe("info").await?;
    responder.flush().await?;
    let answering = tokio::spawn(async move {
        while let Some(msg) = info.next().await {
            if let Some(reply) = msg.reply {
                let _ = responder
                    .publish(reply, Bytes::from_static(b"the frontier"))
                    .await;
            }
        }
    });
    let proxy = TcpProxy::start(broker.port()).await?;
    let client = ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(10)))
        .connect(proxy.url())
        .await?;
    proxy.delay_replies_to("info");
    let slow = tokio::spawn({
        let client = client.clone();
        async move { client.request("info", Bytes::new()).await }
    });
    proxy.wait_delayed(1, IO_BOUND).await?;
    // Other replies on the same connection flow, a large one included.
    let big = Bytes::from(vec![b'x'; 100 * 1024]);
    let reply = tokio::time::timeout(IO_BOUND, client.request("echo", big.clone())).await??;
    assert_eq!(reply.payload, big);
    assert!(
        !slow.is_finished(),
        "the delayed reply arrived before the release"
    );
    proxy.release_delayed();
    let delayed = tokio::time::timeout(IO_BOUND, slow).await???;
    assert_eq!(delayed.payload, Bytes::from_static(b"the frontier"));
    let again = tokio::time::timeout(IO_BOUND, client.request("info", Bytes::new())).await??;
    assert_eq!(again.payload, Bytes::from_static(b"the frontier"));
    assert_eq!(proxy.delayed_count(), 0);
    echo.abort();
    answering.abort();
    Ok(())
}

#[tokio::test]
async fn proxy_cut_closes_established_connections() -> TestResult {
    let broker = Broker::builder()
        .name("proxycut")
        .jetstream(false)
        .start()
        .await?;
    let proxy = TcpProxy::start(broker.port()).await?;
    let (options, mut events) = ClientEvents::capture(ConnectOptions::new());
    let client = options.connect(proxy.url()).await?;
    client.flush().await?;

    proxy.cut_established();
    events
        .wait_for(IO_BOUND, "a disconnect after the cut", |e| {
            matches!(e, Event::Disconnected)
        })
        .await?;
    events
        .wait_for(
            Duration::from_secs(10),
            "a reconnect through the proxy",
            |e| matches!(e, Event::Connected),
        )
        .await?;
    client.flush().await?;
    assert_eq!(proxy.accepted_count(), 2);
    Ok(())
}
