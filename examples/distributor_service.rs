//! A service under the Distributor: it registers with a heartbeat key, keeps it
//! alive, and watches the work units the distributor assigns it. This example also runs a
//! distributor in-process so it works alone; in production run `headcount distributor` (or
//! `Distributor::spawn` in one place) next to the services: several may run at once.
//!
//! Run it in two terminals on one store and watch the units split, then stop one:
//!
//! ```sh
//! cargo run --example distributor_service -- sqlite://distributor.db parser-1
//! cargo run --example distributor_service -- sqlite://distributor.db parser-2
//! cargo run --features redis --example distributor_service -- redis://127.0.0.1:6379 parser-1
//! ```
//!
//! A third argument stops it after that many seconds (`memory://` runs it alone in-process).

use std::time::Duration;

use headcount::recipes::distributor::{self, Distributor, DistributorConfig, Liveness};
use headcount::DEFAULT_PREFIX;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://distributor.db".into());
    let name = std::env::args().nth(2).unwrap_or_else(|| "parser-1".into());
    let seconds: Option<u64> = std::env::args().nth(3).map(|s| s.parse()).transpose()?;
    let store = headcount::connect(&url).await?;
    let services = distributor::namespace(DEFAULT_PREFIX, "services namespace", "services")?;
    let units = distributor::namespace(DEFAULT_PREFIX, "work units namespace", "workunits")?;
    let distribution =
        distributor::namespace(DEFAULT_PREFIX, "distribution namespace", "distribution")?;

    for unit in [
        "site-1.example",
        "site-2.example",
        "site-3.example",
        "site-4.example",
    ] {
        distributor::add_unit(&store, &units, unit).await?;
    }
    distributor::register(&store, &services, &name, &Liveness::Heartbeat).await?;
    let heartbeat = distributor::spawn_heartbeat(
        store.clone(),
        services.clone(),
        name.clone(),
        Duration::from_secs(3),
    )
    .await?;
    let daemon = Distributor::new(
        store.clone(),
        DistributorConfig::new(["services"], "workunits", "distribution")
            .with_poll_interval(Duration::from_millis(500)),
    )?
    .spawn();
    let mut watch = distributor::watch_assignment(
        store.clone(),
        distribution,
        name.clone(),
        Duration::from_millis(250),
    )?;

    let stop = async {
        match seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            changed = watch.changed() => {
                let assignment = changed?;
                println!("{name}: table v{} gives me {:?}", assignment.version, assignment.units);
            }
        }
    }
    heartbeat.stop();
    distributor::deregister(&store, &services, &name).await?;
    daemon.stop().await;
    Ok(())
}
