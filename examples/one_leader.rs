//! One leader: every instance joins a group; the member at index 1 of the active view leads, and
//! the view's epoch is its fencing token, so a sink that keeps the newest token refuses a
//! deposed leader that has not noticed yet (paused past its lease, cut off from the store).
//!
//! Run it in two or three terminals on one store, then stop the leader (Ctrl-C) and watch
//! another take over within one heartbeat (or one TTL after a `kill -9`):
//!
//! ```sh
//! cargo run --example one_leader -- sqlite://leader.db
//! cargo run --features redis --example one_leader -- redis://127.0.0.1:6379
//! cargo run --features postgres --example one_leader -- postgres://user:pass@127.0.0.1/db
//! ```
//!
//! A second argument stops it after that many seconds (`memory://` runs it alone in-process).

use std::time::Duration;

use headcount::fence::MemoryFence;
use headcount::recipes::group::{Group, GroupConfig};
use headcount::recipes::DEFAULT_GROUP_TTL;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://leader.db".into());
    let seconds: Option<u64> = std::env::args().nth(2).map(|s| s.parse()).transpose()?;
    let store = headcount::connect(&url).await?;
    let member = Group::join(store, GroupConfig::new("leaders", DEFAULT_GROUP_TTL)).await?;
    eprintln!("joined as {}", member.member());

    // Stands for the leader's sink (a PostgreSQL PgFence or a RedisFence across processes).
    let sink = MemoryFence::new();
    let stop = async {
        match seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut led_under = None;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        let assignment = member.assignment();
        // The share grant is valid while this member's (index, replicas) pair stays the same;
        // its token is the epoch of the view that made it leader.
        let grant = match (assignment.index, member.share()) {
            (Some(1), Some(grant)) if grant.epoch() == assignment.epoch => grant,
            _ => {
                if led_under.take().is_some() {
                    println!("no longer the leader");
                }
                continue;
            }
        };
        if led_under != Some(grant.token()) {
            println!("leader under epoch {}", grant.token());
            led_under = Some(grant.token());
        }
        // Leader-only work, fenced: a write with an older token than the sink has seen is
        // refused, whoever sends it.
        if grant.is_valid() && !sink.admit("leader-work", grant.token()) {
            println!(
                "the sink refused epoch {}: a newer leader wrote",
                grant.token()
            );
        }
    }
    member.leave().await?;
    Ok(())
}
