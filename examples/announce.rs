//! How many agent announcements the orchestrator handles per second, on
//! its one actix thread: signed frames from many nodes over a few TCP
//! connections, each frame verified against the node's pinned key and
//! applied to the gate (identity, fault, availability).
//!
//! ```text
//! cargo run --release --example announce -- [--nodes N] [--rounds R] [--json]
//! ```
//!
//! Baselines in the same run: Ed25519 verification alone (the floor any
//! signed frame pays), and the cost of refused frames (an unknown node is
//! refused before any signature check). Also the gossip sealing: seal +
//! open of a typical 300-byte SWIM datagram, and a garbage datagram
//! refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use poolgate::core::NodeId;
use poolgate::live::keys::{NodeKey, PublicKey};
use poolgate::live::wire::{self, Announcement};
use poolgate::live::Orchestrator;
use poolgate::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONNECTIONS: usize = 8;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut nodes = 1000usize;
    let mut rounds = 20usize;
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--nodes" => nodes = args.next().ok_or("--nodes N")?.parse()?,
            "--rounds" => rounds = args.next().ok_or("--rounds R")?.parse()?,
            "--json" => json = true,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let keys: Vec<(NodeId, NodeKey)> = (0..nodes)
        .map(|i| Ok((NodeId::new(&format!("n{i}"))?, NodeKey::generate())))
        .collect::<Result<_, poolgate::core::InvalidId>>()?;
    let registry: BTreeMap<NodeId, PublicKey> =
        keys.iter().map(|(n, k)| (n.clone(), k.public())).collect();
    let members: Vec<String> = keys.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    let text = format!(
        "[pool]\nid = \"p\"\nmembers = [{}]\n[readiness]\nconvergence_window = \"1s\"\n[swim]\ninsecure = true\n[agents]\nlisten = \"127.0.0.1:0\"\n",
        members.join(", ")
    );
    let mut config = Config::parse(&text, "announce")?;
    config.registry = registry;

    // Frames per connection: every node's state flips each round, signed
    // over the connection's challenge (made once each connection has
    // asked for it, before the clock starts).
    let signers = keys.clone();
    let frames_for = move |connection: usize, nonce: &wire::Nonce| {
        let mut bytes = Vec::new();
        for round in 0..rounds {
            for (i, (node, key)) in signers.iter().enumerate() {
                if i % CONNECTIONS != connection {
                    continue;
                }
                let state = Announcement {
                    available: round % 2 == 0,
                    identity: Some(wire::identity_text(node.as_str().as_bytes())),
                    swim: None,
                    generation: None,
                    fault: None,
                    leaving: false,
                    heartbeat_ms: None,
                    ask: None,
                };
                let seq = round as u64 + 1;
                bytes.extend(wire::encode(
                    key,
                    "poolgate",
                    node.as_str(),
                    seq,
                    Some(nonce),
                    &state,
                ));
            }
        }
        bytes
    };
    let asking: Vec<Vec<u8>> = (0..CONNECTIONS)
        .map(|connection| {
            let (node, key) = &keys[connection % keys.len()];
            wire::encode(
                key,
                "poolgate",
                node.as_str(),
                1,
                None,
                &Announcement::default(),
            )
        })
        .collect();
    let frames = nodes * rounds;
    let one_refused = wire::encode(
        &NodeKey::generate(),
        "poolgate",
        "stranger",
        1,
        None,
        &Announcement::default(),
    );

    // Refused frames: a node the registry does not know.
    let stranger = NodeKey::generate();
    let mut refused = Vec::new();
    for seq in 1..=frames as u64 {
        refused.extend(wire::encode(
            &stranger,
            "poolgate",
            "stranger",
            seq,
            None,
            &Announcement::default(),
        ));
    }

    let system = actix::System::new();
    let (elapsed, refused_elapsed) = system.block_on(async {
        let live = Orchestrator::start(&config).await?;
        let addr = live.agents_addr;
        // The senders run on their own thread, so the orchestrator's thread
        // does only the orchestrator's work.
        let sender = std::thread::spawn(move || -> Result<(Duration, Duration), std::io::Error> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let mut opened = Vec::new();
                for (connection, first) in asking.iter().enumerate() {
                    let (stream, nonce) = challenged(addr, first).await?;
                    opened.push((stream, frames_for(connection, &nonce)));
                }
                let started = Instant::now();
                let mut tasks = Vec::new();
                for (stream, bytes) in opened {
                    tasks.push(tokio::spawn(send_on(stream, bytes)));
                }
                for task in tasks {
                    task.await.map_err(std::io::Error::other)??;
                }
                let elapsed = started.elapsed();
                // One connection of refused frames: closed at the first.
                let started = Instant::now();
                let mut refused_count = 0usize;
                let mut rest = &refused[..];
                while !rest.is_empty() {
                    let length =
                        4 + u32::from_be_bytes(rest[..4].try_into().unwrap_or_default()) as usize;
                    let stream = tokio::net::TcpStream::connect(addr).await?;
                    send_on(stream, rest[..length].to_vec()).await?;
                    rest = &rest[length..];
                    refused_count += 1;
                    if refused_count == 2000 {
                        break;
                    }
                }
                Ok((elapsed, started.elapsed() / refused_count as u32))
            })
        });
        loop {
            if sender.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let result = sender.join().map_err(|_| "the sender thread failed")??;
        Ok::<_, Box<dyn std::error::Error>>(result)
    })?;

    // Baseline: verification alone, same frames' signed bytes.
    let (node, key) = &keys[0];
    let message = b"poolgate/announce/v1 a typical announcement of some two hundred bytes, about the size of a node's state";
    let signature = key.sign(message);
    let public = key.public();
    let checks = 20_000;
    let started = Instant::now();
    for _ in 0..checks {
        assert!(public.verifies(message, &signature), "{node}");
    }
    let verify = started.elapsed() / checks;

    // Gossip sealing: a typical SWIM datagram (300 bytes) sealed and
    // opened, and a garbage datagram refused.
    let ring = wire::Keyring::new(&[poolgate::live::keys::ClusterKey::generate()], "poolgate");
    let datagram = [0x5au8; 300];
    let rounds_n = 200_000u32;
    let started = Instant::now();
    for _ in 0..rounds_n {
        let sealed = ring.seal(std::hint::black_box(&datagram));
        assert!(ring.open(&sealed).is_some());
    }
    let seal_open = started.elapsed() / rounds_n;
    let garbage = [0xa5u8; 340];
    let started = Instant::now();
    for _ in 0..rounds_n {
        assert!(ring.open(std::hint::black_box(&garbage)).is_none());
    }
    let open_garbage = started.elapsed() / rounds_n;

    // A refused frame without the network: decoded, then refused for an
    // unknown node (before any signature check) or a bad signature.
    let unknown = &one_refused[4..];
    let started = Instant::now();
    for _ in 0..rounds_n {
        let frame = wire::decode_frame(std::hint::black_box(unknown)).map_err(|e| e.to_string())?;
        let node = NodeId::new(&frame.node)?;
        assert!(!config.registry.contains_key(&node));
    }
    let refused_unknown = started.elapsed() / rounds_n;
    let forged = wire::encode(
        &stranger,
        "poolgate",
        keys[0].0.as_str(),
        1,
        None,
        &Announcement::default(),
    );
    let forged_frame = wire::decode_frame(&forged[4..]).map_err(|e| e.to_string())?;
    let pinned = keys[0].1.public();
    let started = Instant::now();
    for _ in 0..2000 {
        assert!(forged_frame.open(&pinned, "poolgate", None).is_err());
    }
    let refused_signature = started.elapsed() / 2000;

    let per_s = frames as f64 / elapsed.as_secs_f64();
    if json {
        println!("{{\"metric\":\"agent_frames_per_s\",\"nodes\":{nodes},\"frames\":{frames},\"value\":{per_s:.0}}}");
        println!(
            "{{\"metric\":\"ed25519_verify_us\",\"value\":{:.1}}}",
            verify.as_secs_f64() * 1e6
        );
        println!(
            "{{\"metric\":\"verify_only_frames_per_s\",\"value\":{:.0}}}",
            1.0 / verify.as_secs_f64()
        );
        println!(
            "{{\"metric\":\"refused_unknown_node_with_connection_us\",\"value\":{:.1}}}",
            refused_elapsed.as_secs_f64() * 1e6
        );
        println!(
            "{{\"metric\":\"refused_unknown_node_ns\",\"value\":{}}}",
            refused_unknown.as_nanos()
        );
        println!(
            "{{\"metric\":\"refused_bad_signature_us\",\"value\":{:.1}}}",
            refused_signature.as_secs_f64() * 1e6
        );
        println!(
            "{{\"metric\":\"gossip_seal_open_ns\",\"bytes\":300,\"value\":{}}}",
            seal_open.as_nanos()
        );
        println!(
            "{{\"metric\":\"gossip_datagrams_per_s\",\"bytes\":300,\"value\":{:.0}}}",
            1.0 / seal_open.as_secs_f64()
        );
        println!(
            "{{\"metric\":\"gossip_garbage_rejected_ns\",\"value\":{}}}",
            open_garbage.as_nanos()
        );
    } else {
        println!(
            "{frames} signed frames from {nodes} nodes over {CONNECTIONS} connections: {:.3}s, {per_s:.0} frames/s",
            elapsed.as_secs_f64()
        );
        println!(
            "Ed25519 verification alone: {:.1} µs ({:.0}/s); a refused frame (unknown node, with its connection): {:.1} µs",
            verify.as_secs_f64() * 1e6,
            1.0 / verify.as_secs_f64(),
            refused_elapsed.as_secs_f64() * 1e6
        );
        println!(
            "in process: an unknown node's frame refused in {} ns, a bad signature in {:.1} µs; seal + open of a 300-byte datagram {} ns ({:.0}/s), garbage refused in {} ns",
            refused_unknown.as_nanos(),
            refused_signature.as_secs_f64() * 1e6,
            seal_open.as_nanos(),
            1.0 / seal_open.as_secs_f64(),
            open_garbage.as_nanos()
        );
    }
    Ok(())
}

/// A new connection that has sent its first frame (`first`) and read the
/// orchestrator's challenge: the connection and the challenge.
async fn challenged(
    addr: std::net::SocketAddr,
    first: &[u8],
) -> Result<(tokio::net::TcpStream, wire::Nonce), std::io::Error> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(first).await?;
    match wire::read_reply(&mut stream).await {
        Ok(Some(wire::Reply::Challenge { nonce })) => wire::challenge_nonce(&nonce)
            .map(|nonce| (stream, nonce))
            .ok_or_else(|| std::io::Error::other("a challenge that is not 16 bytes")),
        other => Err(std::io::Error::other(format!("no challenge: {other:?}"))),
    }
}

/// Writes `bytes` on `stream`, then waits until the orchestrator closes it
/// (it has read, and applied, everything).
async fn send_on(stream: tokio::net::TcpStream, bytes: Vec<u8>) -> Result<(), std::io::Error> {
    let (mut reader, mut writer) = stream.into_split();
    // The orchestrator acknowledges every frame: read its replies while
    // writing, or both sides' buffers fill.
    let replies = tokio::spawn(async move {
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest).await;
    });
    writer.write_all(&bytes).await?;
    writer.shutdown().await?;
    let _ = replies.await;
    Ok(())
}
