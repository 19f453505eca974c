//! The orchestrator's whole live side embedded in a Rust program: gate,
//! SWIM member and agent listener from one `Config`, then wait for the
//! pool and plan on it.
//!
//! ```text
//! cargo run --example orchestrator -- config.toml
//! ```
//!
//! The config needs `[registry]` (the nodes and their pinned keys) and
//! `[swim] cluster_keys` (or `insecure = true`); start `poolgate node` on
//! each node (docs/operator.md, "Deploy on real machines").

use poolgate::core::RunId;
use poolgate::live::Orchestrator;
use poolgate::Config;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "config.toml".into());
    let config = Config::load(path.as_ref())?;
    actix_rt::System::new().block_on(async {
        let live = Orchestrator::start(&config).await?;
        println!(
            "SWIM on {}, agents on {}; waiting for the pool",
            live.swim_addr, live.agents_addr
        );
        let ready = live.gate.wait_ready().await?;
        println!("pool {} ready at epoch {}", ready.pool, ready.epoch);
        let run = RunId::new("run-1")?;
        live.gate
            .begin_planning(run.clone(), Some(ready.epoch))
            .await?;
        let members = config.pool.members().to_vec();
        live.gate
            .commit_plan(run, members, Some(ready.epoch))
            .await?;
        println!("run-1 committed; a lost node now faults it");
        Ok(())
    })
}
