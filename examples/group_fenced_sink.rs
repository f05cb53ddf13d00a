//! Group membership with a fenced PostgreSQL sink: each instance joins the group `orders`,
//! processes the orders it owns, and writes each result behind a fence in the same statement,
//! so an instance that lost an order without knowing it (paused past its lease) cannot
//! overwrite the new owner's result: its token (the first epoch of its unbroken ownership of the
//! order) is older than the new owner's.
//!
//! The store and the sink share the application's own connection pool (`from_pool`). Needs a
//! PostgreSQL server; run it in two or three terminals and stop one:
//!
//! ```sh
//! cargo run --features postgres --example group_fenced_sink -- \
//!   postgres://user:pass@127.0.0.1:5432/db
//! ```
//!
//! A second argument stops it after that many seconds.

use std::sync::Arc;
use std::time::Duration;

use headcount::postgres::deadpool_postgres::{Manager, Pool};
use headcount::postgres::tokio_postgres::{self, NoTls};
use headcount::postgres::{PgFence, PostgresStore};
use headcount::recipes::group::{Group, GroupConfig};
use headcount::recipes::DEFAULT_GROUP_TTL;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: group_fenced_sink postgres://user:pass@host:port/db [seconds]")?;
    let seconds: Option<u64> = std::env::args().nth(2).map(|s| s.parse()).transpose()?;
    // The application's pool (TLS, pool size and the like are its business).
    let config: tokio_postgres::Config = url.parse()?;
    let pool = Pool::builder(Manager::new(config, NoTls))
        .max_size(4)
        .build()?;

    // headcount's store over the same pool, with metrics and spans like `connect` gives.
    let store = headcount::instrumented::instrument(Arc::new(
        PostgresStore::from_pool(pool.clone()).await?,
    ));
    let member = Group::join(store, GroupConfig::new("orders", DEFAULT_GROUP_TTL)).await?;
    let active = member.active(0).await?;
    eprintln!(
        "{} is {} of {} under epoch {}",
        member.member(),
        active.index.unwrap_or(0),
        active.replicas,
        active.epoch
    );

    let fence = PgFence::new("orders_fence")?;
    {
        let client = pool.get().await?;
        fence.ensure_table(&**client).await?;
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS orders_done \
                 (order_id text PRIMARY KEY, token bigint NOT NULL, done_by text NOT NULL)",
            )
            .await?;
    }

    let stop = async {
        match seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        let client = pool.get().await?;
        let mut written = 0;
        for n in 0..20 {
            let order = format!("order-{n}");
            // Hold the grant while working on the order: a hand-off waits for it.
            let Some(grant) = member.owns(&order) else {
                continue;
            };
            let outcome = fence
                .execute_fenced(
                    &**client,
                    "INSERT INTO orders_done (order_id, token, done_by) \
                     SELECT $3, token, $4 FROM hc_fence \
                     ON CONFLICT (order_id) DO UPDATE SET token = EXCLUDED.token, \
                     done_by = EXCLUDED.done_by",
                    &order,
                    grant.token(),
                    &[&order, &member.member()],
                )
                .await?;
            if outcome.admitted {
                written += 1;
            } else {
                eprintln!("{order}: refused, a newer owner wrote it");
            }
        }
        println!(
            "wrote {written} orders under epoch {}",
            member.assignment().epoch
        );
    }
    member.leave().await?;
    Ok(())
}
