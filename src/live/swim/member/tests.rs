use super::*;
use rand::SeedableRng;

/// Ping 7 from node-2 at `from` to node-1 (of `generation`) at `to`, as
/// a datagram.
fn ping_from_node2(from: SocketAddr, to: SocketAddr, generation: u64) -> Vec<u8> {
    let header = foca::Header {
        src: SwimIdentity::new("node-2", from, 1),
        src_incarnation: 0,
        dst: SwimIdentity::new("node-1", to, generation),
        message: foca::Message::Ping(7),
    };
    let mut datagram = Vec::new();
    foca::Codec::encode_header(&mut foca::PostcardCodec, &header, &mut datagram).unwrap();
    datagram
}

/// A ping sent twice (as a copy) is answered once, and the answer goes
/// out twice, byte for byte.
#[test]
fn a_ping_and_its_copy_get_one_ack_sent_twice() {
    use foca::{Codec, Message};
    actix_rt::System::new().block_on(async {
        let generation = 5;
        let (_member, addr) = SwimMember::start(
            "node-1",
            "127.0.0.1:0".parse().unwrap(),
            None,
            generation,
            SwimTimings::default().foca_config(4),
            StdRng::seed_from_u64(1),
            None,
            Keyring::new(&[], "test"),
        )
        .unwrap();
        let peer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let ping = ping_from_node2(peer.local_addr().unwrap(), addr, generation);
        peer.send_to(&ping, addr).await.unwrap();
        peer.send_to(&ping, addr).await.unwrap();
        let mut acks = Vec::new();
        let mut buffer = vec![0u8; 65_536];
        let until = tokio::time::Instant::now() + Duration::from_millis(600);
        while let Ok(Ok((len, _))) =
            tokio::time::timeout_at(until, peer.recv_from(&mut buffer)).await
        {
            let datagram = buffer[..len].to_vec();
            let decoded =
                Codec::<SwimIdentity>::decode_header(&mut foca::PostcardCodec, &datagram[..]);
            if matches!(decoded.map(|h| h.message), Ok(Message::Ack(7))) {
                acks.push(datagram);
            }
        }
        assert_eq!(acks.len(), 2, "one ack and its copy");
        assert_eq!(acks[0], acks[1], "the copy is the same datagram");
    });
}

/// A member and a bare socket beside it, on 127.0.0.1, with the `fast`
/// timings: the member's address and the socket.
async fn beside(node: &str) -> (Addr<SwimMember>, SocketAddr, tokio::net::UdpSocket) {
    let (member, addr) = SwimMember::start(
        node,
        "127.0.0.1:0".parse().unwrap(),
        None,
        5,
        crate::live::swim::SwimTimings::FAST.foca_config(4),
        StdRng::seed_from_u64(1),
        None,
        Keyring::new(&[], "test"),
    )
    .unwrap();
    let peer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    (member, addr, peer)
}

/// The headers of what `peer` receives within `within`.
async fn headers_within(
    peer: &tokio::net::UdpSocket,
    within: Duration,
) -> Vec<foca::Header<SwimIdentity>> {
    let mut headers = Vec::new();
    let mut buffer = vec![0u8; 65_536];
    let until = tokio::time::Instant::now() + within;
    while let Ok(Ok((len, _))) = tokio::time::timeout_at(until, peer.recv_from(&mut buffer)).await {
        headers.extend(drive::header(&buffer[..len]));
    }
    headers
}

/// A node agent that lost its orchestrator joins again: at a new
/// incarnation when it heard no datagram for a probe period (cut off, so
/// perhaps suspected: refuted in the announce itself, see
/// `drive::join_again`), at the same one when its SWIM went on (only its
/// agent connection was cut: a refutation would be a change of the node
/// in the gate before the orchestrator's own word that it is
/// unavailable). A first join refutes nothing.
#[test]
fn a_member_joining_again_refutes_only_when_it_was_away() {
    actix_rt::System::new().block_on(async {
        let (member, addr, peer) = beside("node-1").await;
        let seeds = vec![peer.local_addr().unwrap()];
        let announced = |headers: Vec<foca::Header<SwimIdentity>>| {
            headers
                .into_iter()
                .find(|h| matches!(h.message, foca::Message::Announce))
                .map(|h| h.src_incarnation)
        };
        member.do_send(Join {
            seeds: seeds.clone(),
        });
        let first = announced(headers_within(&peer, Duration::from_millis(300)).await);
        assert_eq!(first, Some(0), "a first join");
        // Heard from a moment ago: its SWIM goes on.
        let ping = ping_from_node2(peer.local_addr().unwrap(), addr, 5);
        peer.send_to(&ping, addr).await.unwrap();
        // Its ack says it was heard.
        let acked = headers_within(&peer, Duration::from_millis(50)).await;
        assert!(acked
            .iter()
            .any(|h| matches!(h.message, foca::Message::Ack(7))));
        member.do_send(JoinAgain {
            seeds: seeds.clone(),
        });
        let went_on = announced(headers_within(&peer, Duration::from_millis(300)).await);
        assert_eq!(went_on, Some(0), "heard from lately: only announced");
        // Nothing heard for longer than a probe period (`fast`: 400 ms).
        let _ = headers_within(&peer, Duration::from_millis(300)).await;
        member.do_send(JoinAgain { seeds });
        let again = announced(headers_within(&peer, Duration::from_millis(300)).await);
        assert_eq!(again, Some(1), "cut off: refuted first");
    });
}
