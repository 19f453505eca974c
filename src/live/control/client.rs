//! The control socket's client side: what `run` and `status` ask of the
//! orchestrator that serves it.

use std::path::Path;

use poolgate_actors::core::RunId;
use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::{read_line, Reply, Request};

/// A requester's connection to the control socket.
pub struct Client {
    reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
}

impl Client {
    /// Connects to `path`; `None` when nobody serves it.
    pub async fn connect(path: &Path) -> Option<Client> {
        let stream = UnixStream::connect(path).await.ok()?;
        let (reader, writer) = stream.into_split();
        Some(Client {
            reader: BufReader::new(reader),
            writer,
        })
    }

    /// Sends `request`.
    pub async fn ask(&mut self, request: &Request) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.writer.write_all(&line).await
    }

    /// The next reply; `None` once the orchestrator closed the connection.
    pub async fn next(&mut self) -> Option<Reply> {
        let line = read_line(&mut self.reader).await?;
        serde_json::from_str(&line).ok()
    }
}

/// Asks the orchestrator serving `path` one thing and reads its one
/// answer (within the status wait); `None` when it closed without one.
async fn ask_once(path: &Path, request: &Request) -> Result<Option<Reply>, String> {
    let mut client = Client::connect(path)
        .await
        .ok_or_else(|| format!("no orchestrator serves {}", path.display()))?;
    client
        .ask(request)
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    tokio::time::timeout(crate::live::status::STATUS_WAIT, client.next())
        .await
        .map_err(|_| format!("no answer from {} in time", path.display()))
}

/// Asks the orchestrator serving `path` to end `run` of `pool` (`run
/// --end`): `Ok(None)` when it did, `Ok(Some(why))` when it refused.
pub async fn end_run(
    path: &Path,
    pool: Option<&str>,
    run: &RunId,
) -> Result<Option<String>, String> {
    let request = Request::End {
        v: 1,
        pool: pool.map(str::to_string),
        run: run.to_string(),
    };
    match ask_once(path, &request).await? {
        Some(Reply::Ended { .. }) => Ok(None),
        Some(Reply::Refused { detail, .. }) => Ok(Some(detail)),
        _ => Err(format!("{} closed without an answer", path.display())),
    }
}

/// Asks the orchestrator serving `path` where its pools stand.
pub async fn status(path: &Path, pool: Option<&str>) -> Result<Value, String> {
    let request = Request::Status {
        v: 1,
        pool: pool.map(str::to_string),
    };
    match ask_once(path, &request).await? {
        Some(Reply::Status { status }) => match status["error"].as_str() {
            Some(error) => Err(format!("{}: {error}", path.display())),
            None => Ok(status),
        },
        _ => Err(format!("{} closed without an answer", path.display())),
    }
}
