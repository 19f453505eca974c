//! What a follower does while another replica leads: answer agents
//! and status on its addresses with who leads, and nothing else.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::ha::requests::LEADER_SAID_WITHIN;
use crate::live::status::LeaderSaid;
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

/// At most this many reads of what the leader published are under way
/// at once (each ends within the etcd client's own timeout, after the
/// answer that gave up on it): more askers are answered without one.
const LEADER_SAID_READS: usize = 4;

/// Each pool's id and the store the leader publishes its status in.
/// A reload that grows the pools grows it while following.
pub(super) type Published = Arc<std::sync::RwLock<Vec<(String, Arc<EtcdStore>)>>>;

/// A follower's agent listener: every node is refused with `not_leader`
/// and a pointer to the leader; `poolgate status` is told who leads and
/// what the leader last published of each pool (`published`).
pub(super) async fn follow(
    config: &crate::Config,
    role: watch::Receiver<Role>,
    published: Published,
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
    let slots = Arc::new(tokio::sync::Semaphore::new(FOLLOWER_CONNECTIONS));
    let reads = Arc::new(tokio::sync::Semaphore::new(LEADER_SAID_READS));
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
            let (published, reads) = (Arc::clone(&published), Arc::clone(&reads));
            connections.spawn(async move {
                let _slot = slot;
                refuse_as_follower(&mut stream, leader, &published, reads).await;
            });
        }
    }))
}

async fn refuse_as_follower(
    stream: &mut tokio::net::TcpStream,
    role: Role,
    published: &Published,
    reads: Arc<tokio::sync::Semaphore>,
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
    if let Some(only) = crate::live::status::status_query(&bytes) {
        let leader = leader.as_ref().map(ToString::to_string);
        let answer = follower_status(published, only.as_deref(), leader, reads).await;
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
        leader: leader.map(|leader| leader.agents),
        signed_elsewhere: false,
    });
    let _ =
        tokio::time::timeout(crate::live::listener::FIRST_FRAME, stream.write_all(&reply)).await;
}

/// What the leader published of a pool, read from `store` by `deadline`,
/// or why it was not: etcd did not answer by then, or too many reads are
/// under way already (each goes on to its own end, holding one of
/// `reads`), or etcd refused.
async fn leader_said_by(
    store: &Arc<EtcdStore>,
    deadline: tokio::time::Instant,
    reads: &Arc<tokio::sync::Semaphore>,
) -> LeaderSaid {
    let Ok(read) = Arc::clone(reads).try_acquire_owned() else {
        return LeaderSaid::Unread(format!(
            "etcd has not answered the {LEADER_SAID_READS} reads already under way (no quorum, or out of this replica's reach)"
        ));
    };
    let store = Arc::clone(store);
    let reading = tokio::spawn(async move {
        let _read = read;
        crate::ha::requests::leader_said(store).await
    });
    match tokio::time::timeout_at(deadline, reading).await {
        Ok(Ok(Ok(said))) => LeaderSaid::Read(said),
        Ok(Ok(Err(e))) => LeaderSaid::Unread(format!("etcd: {e}")),
        Ok(Err(e)) => LeaderSaid::Unread(format!("the read of etcd failed: {e}")),
        Err(_) => LeaderSaid::Unread(format!(
            "etcd did not answer within {LEADER_SAID_WITHIN:?} (no quorum, or out of this replica's reach)"
        )),
    }
}

/// A follower's status answer: each pool (or `only`) with what the leader
/// last published of it; with several pools, the first's answer and
/// `pools` listing each, as the leader answers; an unknown pool an error
/// naming those there are.
async fn follower_status(
    published: &Published,
    only: Option<&str>,
    leader: Option<String>,
    reads: Arc<tokio::sync::Semaphore>,
) -> serde_json::Value {
    let published = published
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let asked: Vec<&(String, Arc<EtcdStore>)> = match only {
        Some(only) => published.iter().filter(|(pool, _)| pool == only).collect(),
        None => published.iter().collect(),
    };
    let mut said = Vec::with_capacity(asked.len());
    let deadline = tokio::time::Instant::now() + LEADER_SAID_WITHIN;
    for (pool, store) in asked {
        said.push((pool, leader_said_by(store, deadline, &reads).await));
    }
    let shown = leader.as_ref().map(|l| l as &dyn std::fmt::Display);
    let mut answers = said
        .into_iter()
        .map(|(pool, said)| crate::live::status::follower_answer(pool, shown, said));
    let Some(mut all) = answers.next() else {
        let defined: Vec<&str> = published.iter().map(|(pool, _)| pool.as_str()).collect();
        return match only {
            Some(only) => crate::live::status::unknown_pool(only, &defined, shown),
            None => serde_json::json!({"error": "no pool is defined"}),
        };
    };
    let rest: Vec<serde_json::Value> = answers.collect();
    if !rest.is_empty() {
        let mut every = vec![all.clone()];
        every.extend(rest);
        all["pools"] = serde_json::Value::Array(every);
    }
    all
}
