//! systemd's readiness protocol (`Type=notify`, sd_notify): when
//! `NOTIFY_SOCKET` names a socket (systemd sets it for a unit of that
//! type), a state line such as `READY=1` is sent there as one datagram.
//! Without it nothing is sent. A failure to send is logged, never fatal:
//! the service runs the same whether systemd hears it or not.

use std::os::unix::net::UnixDatagram;

/// The service is up: `watch` serves its sockets (alone, its orchestrator
/// started; among replicas, campaigning), `node` has started its member
/// and its connection to the orchestrators.
pub const READY: &str = "READY=1";

/// The service is stopping (SIGTERM or SIGINT taken).
pub const STOPPING: &str = "STOPPING=1";

/// Sends `state` to `NOTIFY_SOCKET`, if it is set: a path, or an abstract
/// name written with a leading `@`.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let target = target.to_string_lossy().into_owned();
    if let Err(e) = send(&target, state) {
        tracing::warn!(socket = %target, state, error = %e, "systemd not told (NOTIFY_SOCKET)");
    }
}

fn send(target: &str, state: &str) -> std::io::Result<usize> {
    let socket = UnixDatagram::unbound()?;
    match target.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            socket.send_to_addr(state.as_bytes(), &address)
        }
        None => socket.send_to(state.as_bytes(), target),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reaches_a_socket_by_path_and_by_abstract_name() {
        let dir = std::env::temp_dir().join(format!("poolgate-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        send(path.to_str().unwrap(), READY).unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], READY.as_bytes());
        std::fs::remove_dir_all(&dir).unwrap();

        use std::os::linux::net::SocketAddrExt;
        let name = format!("poolgate-notify-{}", std::process::id());
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&address).unwrap();
        send(&format!("@{name}"), STOPPING).unwrap();
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], STOPPING.as_bytes());
    }

    #[test]
    fn nobody_listening_is_an_error_to_log_not_a_panic() {
        assert!(send("/nonexistent/poolgate/notify.sock", READY).is_err());
    }
}
