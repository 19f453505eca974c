use super::*;

/// A scripted etcd on 127.0.0.1: answers each call by its path with
/// `answer(path)` (HTTP 200, JSON), for as long as the test runs.
fn scripted(answer: fn(&str) -> String) -> String {
    scripted_on(std::net::TcpListener::bind("127.0.0.1:0").unwrap(), answer)
}

/// [`scripted`] on `listener`.
fn scripted_on(listener: std::net::TcpListener, answer: fn(&str) -> String) -> String {
    use std::io::{BufRead as _, Read as _, Write as _};
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(stream);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).unwrap_or(0) == 0 {
                            return;
                        }
                        if header.trim().is_empty() {
                            break;
                        }
                        if let Some(n) = header.to_ascii_lowercase().strip_prefix("content-length:")
                        {
                            length = n.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let said = answer(&path);
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{said}",
                        said.len()
                    );
                    if reader.get_mut().write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    endpoint
}

/// A member whose lessor is behind its log says "not found" (TTL 0)
/// of a lease that lives: while the lease's key holds on it, that is
/// a failed renewal, not the lease's end; once the key is gone, or on
/// another lease, the lease is gone.
#[test]
fn a_lease_said_gone_is_believed_once_its_key_is_gone_too() {
    let client = |endpoint: String| Etcd::new(&[endpoint], Duration::from_secs(2)).unwrap();
    // etcd's answers: the lease said gone; `/p/leader` on lease
    // `lease`, created at `created`.
    fn gone() -> String {
        r#"{"result":{"ID":"7","TTL":"0"}}"#.into()
    }
    fn leader_on(lease: i64, created: i64) -> String {
        serde_json::json!({"kvs": [{
            "key": b64(b"/p/leader"), "value": "",
            "create_revision": created.to_string(), "mod_revision": created.to_string(),
            "lease": lease.to_string(),
        }]})
        .to_string()
    }
    // The key still on lease 7: tried again.
    let lagging = client(scripted(|path| match path {
        "/v3/lease/keepalive" => gone(),
        _ => leader_on(7, 5),
    }));
    let said = lagging.keep_alive_on(7, b"/p/leader").unwrap_err();
    assert!(said.to_string().contains("tried again"), "{said}");
    // The key gone: the lease is gone.
    let ended = client(scripted(|path| match path {
        "/v3/lease/keepalive" => gone(),
        _ => "{}".into(),
    }));
    assert_eq!(ended.keep_alive_on(7, b"/p/leader").unwrap(), None);
    // The key on another lease (taken): gone.
    let taken = client(scripted(|path| match path {
        "/v3/lease/keepalive" => gone(),
        _ => leader_on(8, 9),
    }));
    assert_eq!(taken.keep_alive_on(7, b"/p/leader").unwrap(), None);
    // Renewed: its TTL, the key not read.
    let renewed = client(scripted(|path| match path {
        "/v3/lease/keepalive" => r#"{"result":{"ID":"7","TTL":"10"}}"#.into(),
        _ => "not json".into(),
    }));
    assert_eq!(
        renewed.keep_alive_on(7, b"/p/leader").unwrap(),
        Some(Duration::from_secs(10))
    );
}

#[test]
fn endpoints_are_http_or_https_host_port() {
    assert!(!parse_endpoint("http://127.0.0.1:2379").unwrap().tls);
    assert!(parse_endpoint("http://etcd-1:2379/").is_ok());
    let tls = parse_endpoint("https://etcd-1:2379").unwrap();
    assert!(tls.tls);
    assert_eq!(tls.base, "https://etcd-1:2379");
    for bad in [
        "ftp://a:1",
        "127.0.0.1:2379",
        "http://a",
        "https://:1",
        "http://a:0",
        "http://a:1/x",
    ] {
        assert!(parse_endpoint(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_streamed_answer_gives_its_first_value_and_what_is_not_json_is_named() {
    assert_eq!(
        int(&first_value(b"{\"a\":\"1\"}\n{\"a\":\"2\"}\n").unwrap()["a"]),
        1
    );
    assert_eq!(first_value(b"\n  \n").unwrap(), Value::Null);
    let why = first_value(b"<html>").unwrap_err();
    assert!(why.contains("not JSON"), "{why}");
}

#[test]
fn tls_files_given_with_plain_endpoints_or_half_a_client_pair_are_refused() {
    let at = |endpoint: &str| Etcd::new(&[endpoint.to_string()], Duration::from_secs(1)).unwrap();
    let files = TlsFiles {
        ca_file: Some("ca.pem".into()),
        ..TlsFiles::default()
    };
    let why = at("http://127.0.0.1:2379").with_tls(&files).unwrap_err();
    assert!(why.contains("plain http"), "{why}");
    let https = || at("https://127.0.0.1:2379");
    let half = TlsFiles {
        cert_file: Some("client.pem".into()),
        ..TlsFiles::default()
    };
    let why = https().with_tls(&half).unwrap_err();
    assert!(why.contains("needs key_file"), "{why}");
    let missing = TlsFiles {
        ca_file: Some("/nonexistent/ca.pem".into()),
        ..TlsFiles::default()
    };
    let why = https().with_tls(&missing).unwrap_err();
    assert!(why.contains("ca_file /nonexistent/ca.pem"), "{why}");
    assert!(https().with_tls(&TlsFiles::default()).is_ok());
}

#[test]
fn a_prefix_range_ends_after_every_key_under_it() {
    assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
    assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
    assert_eq!(prefix_end(b"\xff"), vec![0]);
}

#[test]
fn no_endpoint_answering_names_them_all() {
    // A port nobody listens on, found by binding and dropping it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let etcd = Etcd::new(std::slice::from_ref(&endpoint), Duration::from_millis(300)).unwrap();
    match etcd.get(b"k") {
        Err(EtcdError::Unreachable(why)) => assert!(why.contains(&endpoint), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// etcd's raft term, as each answer's header names it: a rise is noted
/// with its instant; the first term seen, the same again, or a lower one
/// (a member behind) is not a rise.
#[test]
fn a_rise_of_etcds_raft_term_is_noted_when_an_answer_first_names_it() {
    use std::sync::atomic::AtomicI64;
    static TERM: AtomicI64 = AtomicI64::new(3);
    let etcd = Etcd::new(
        &[scripted(|_| {
            let term = TERM.load(Ordering::SeqCst);
            format!(r#"{{"header":{{"raft_term":"{term}"}},"kvs":[]}}"#)
        })],
        Duration::from_secs(2),
    )
    .unwrap();
    etcd.get(b"k").unwrap();
    assert_eq!(etcd.raft_term_rose_at(), None, "the first term seen");
    etcd.get(b"k").unwrap();
    assert_eq!(etcd.raft_term_rose_at(), None);
    TERM.store(4, Ordering::SeqCst);
    let before = Instant::now();
    etcd.get(b"k").unwrap();
    let rose = etcd.raft_term_rose_at().expect("a rise");
    assert!(rose >= before, "{rose:?}");
    TERM.store(2, Ordering::SeqCst);
    etcd.get(b"k").unwrap();
    etcd.get(b"k").unwrap();
    assert_eq!(
        etcd.raft_term_rose_at(),
        Some(rose),
        "a lower term is no rise"
    );
}

/// A call that no endpoint answered, then an answer: the leases are in
/// doubt from that answer on (renewals etcd held meanwhile land then).
#[test]
fn etcd_answering_again_after_an_unanswered_call_puts_leases_in_doubt() {
    // A port nobody listens on yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let etcd = Etcd::new(
        &[format!("http://127.0.0.1:{port}")],
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(etcd.leases_in_doubt_since(), None);
    assert!(etcd.get(b"k").is_err());
    assert_eq!(etcd.leases_in_doubt_since(), None, "not answered yet");
    scripted_on(
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap(),
        |_| r#"{"header":{"raft_term":"3"},"kvs":[]}"#.into(),
    );
    let before = Instant::now();
    etcd.get(b"k").unwrap();
    let back = etcd.leases_in_doubt_since().expect("etcd back");
    assert!(back >= before);
    etcd.get(b"k").unwrap();
    assert_eq!(
        etcd.leases_in_doubt_since(),
        Some(back),
        "answered all along"
    );
    assert_eq!(etcd.raft_term_rose_at(), None);
}
