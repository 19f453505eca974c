//! What a follower does while another replica leads: answer agents
//! and status on its addresses with who leads, and nothing else.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::live::LiveError;
use crate::state::etcd::EtcdStore;

use super::Role;

/// The follower listener, stopped when dropped (a `lead` given up).
pub(super) struct Following(pub(super) tokio::task::JoinHandle<()>);

impl Drop for Following {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// At most this many follower connections are served at once.
pub(crate) const FOLLOWER_CONNECTIONS: usize = 256;

/// A follower's agent listener: every node is refused with `not_leader`
/// and a pointer to the leader; `poolgate status` is told who leads.
pub(super) async fn follow(
    config: &crate::Config,
    role: watch::Receiver<Role>,
    store: Arc<EtcdStore>,
) -> Result<tokio::task::JoinHandle<()>, LiveError> {
    let addr = config.agents.listen;
    let bound = |source| LiveError::Bind {
        socket: "agent listener (TCP)",
        addr,
        source,
    };
    let listener = crate::live::orchestrator::until_free(|| {
        crate::live::listener::listen(addr).map_err(bound)
    })
    .await?;
    let pool = config.pool.id().to_string();
    let slots = Arc::new(tokio::sync::Semaphore::new(FOLLOWER_CONNECTIONS));
    Ok(actix::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            while connections.try_join_next().is_some() {}
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                continue; // dropped: closed at once
            };
            let leader = role.borrow().clone();
            let (pool, store) = (pool.clone(), Arc::clone(&store));
            connections.spawn(async move {
                let _slot = slot;
                refuse_as_follower(&mut stream, &pool, leader, store).await;
            });
        }
    }))
}

async fn refuse_as_follower(
    stream: &mut tokio::net::TcpStream,
    pool: &str,
    role: Role,
    store: Arc<EtcdStore>,
) {
    use tokio::io::AsyncWriteExt;
    let leader = match role {
        Role::Following(Some(leader)) => Some(leader),
        _ => None,
    };
    let first = tokio::time::timeout(
        crate::live::listener::FIRST_FRAME,
        crate::live::wire::read_prefixed(stream, crate::live::wire::MAX_FRAME),
    )
    .await;
    let Ok(Ok(Some(bytes))) = first else { return };
    if crate::live::status::is_status_query(&bytes) {
        let said = crate::live::requests::leader_said(store).await;
        let answer = crate::live::status::follower_answer(
            pool,
            leader.as_ref().map(|l| l as &dyn std::fmt::Display),
            said,
        );
        let _ = tokio::time::timeout(
            crate::live::listener::FIRST_FRAME,
            crate::live::status::write_answer(stream, &answer),
        )
        .await;
        return;
    }
    let detail = match &leader {
        Some(leader) => format!("not the leader; the leader is {leader}"),
        None => "not the leader; no replica leads right now".to_string(),
    };
    let reply = crate::live::wire::encode_reply(&crate::live::wire::Reply::Refused {
        code: crate::live::wire::NOT_LEADER.to_string(),
        detail,
    });
    let _ =
        tokio::time::timeout(crate::live::listener::FIRST_FRAME, stream.write_all(&reply)).await;
}
