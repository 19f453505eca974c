use super::*;
use rand::SeedableRng;

/// A ping sent twice (as a copy) is answered once, and the answer goes
/// out twice, byte for byte.
#[test]
fn a_ping_and_its_copy_get_one_ack_sent_twice() {
    use foca::{Codec, Header, Message};
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
        let header = Header {
            src: SwimIdentity {
                node: "node-2".into(),
                addr: peer.local_addr().unwrap(),
                generation: 1,
            },
            src_incarnation: 0,
            dst: SwimIdentity {
                node: "node-1".into(),
                addr,
                generation,
            },
            message: Message::Ping(7),
        };
        let mut ping = Vec::new();
        foca::PostcardCodec
            .encode_header(&header, &mut ping)
            .unwrap();
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
