//! The library as an embedder meets it (issue 21): what it does around
//! the edges of an actix `System`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use poolgate::live::Orchestrator;
use poolgate::Config;

#[test]
fn a_system_dropped_right_after_an_orchestrator_started_panics_nowhere() {
    // Embedder: the SWIM member's first run came during the System's drop
    // and panicked inside actix ("there is no reactor running").
    let panics = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&panics);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        counted.fetch_add(1, Ordering::SeqCst);
        previous(info);
    }));
    let config = Config::parse(
        "[pool]\nid = \"p\"\nmembers = [\"node-1\"]\n[readiness]\nconvergence_window = \"1s\"\n\
         [swim]\nbind = \"127.0.0.1:0\"\ninsecure = true\n[agents]\nlisten = \"127.0.0.1:0\"\n",
        "inline",
    )
    .unwrap();
    for _ in 0..3 {
        let system = actix::System::new();
        system.block_on(async {
            let live = Orchestrator::start(&config).await.unwrap();
            live.shutdown();
            actix::System::current().stop();
        });
        drop(system);
    }
    assert_eq!(panics.load(Ordering::SeqCst), 0);
}
