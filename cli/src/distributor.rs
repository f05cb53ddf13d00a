//! `headcount distributor`: the Distributor daemon of seed 003, and the small commands a user
//! needs next to it (register a service, run one, manage work units, read the table).

use std::process::ExitCode;
use std::time::Duration;

use headcount::recipes::distributor::{
    self, grpc, Distributor, DistributorConfig, Liveness, Registration,
};
use headcount::{DynStore, Error, Keyspace};

use crate::run::shutdown_signal;

/// The namespaces shared by the daemon and the commands, with the article's flags and
/// environment variables.
#[derive(Debug, Clone, clap::Args)]
pub struct Namespaces {
    /// Services namespaces, comma-separated: where services register.
    #[arg(
        long,
        env = "SERVICES_NAMESPACE",
        value_delimiter = ',',
        default_value = "services"
    )]
    pub services_namespaces: Vec<String>,
    /// Where the work units are kept.
    #[arg(long, env = "WORKUNITS_NAMESPACE", default_value = "workunits")]
    pub workunits_namespace: String,
    /// Where the matching table is written.
    #[arg(long, env = "DISTRIBUTION_NAMESPACE", default_value = "distribution")]
    pub distribution_namespace: String,
}

impl Namespaces {
    fn services(&self) -> Result<Vec<Keyspace>, Error> {
        if self.services_namespaces.is_empty() {
            return Err(Error::config("no services namespace given"));
        }
        self.services_namespaces
            .iter()
            .map(|ns| keyspace("services namespace", ns))
            .collect()
    }

    fn units(&self) -> Result<Keyspace, Error> {
        keyspace("work units namespace", &self.workunits_namespace)
    }

    fn distribution(&self) -> Result<Keyspace, Error> {
        keyspace("distribution namespace", &self.distribution_namespace)
    }
}

fn keyspace(what: &str, ns: &str) -> Result<Keyspace, Error> {
    distributor::namespace(headcount::DEFAULT_PREFIX, what, ns)
}

/// The arguments of `distributor`: the daemon's options, or one of the commands.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DistributorArgs {
    #[command(flatten)]
    namespaces: Namespaces,
    /// How often every service is pinged and the table recomputed.
    #[arg(long, env = "POLL_INTERVAL", default_value = "1s", value_parser = crate::util::parse_duration)]
    poll_interval: Duration,
    /// How long a ping may take before the service counts as down.
    #[arg(long, env = "PING_TIMEOUT", default_value = "1s", value_parser = crate::util::parse_duration)]
    ping_timeout: Duration,
    #[command(subcommand)]
    command: Option<Action>,
}

/// The commands next to the daemon.
#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Register a service (idempotent) in every services namespace.
    Register {
        #[command(flatten)]
        namespaces: Namespaces,
        /// The service's name.
        #[arg(long)]
        name: String,
        /// Where it answers grpc.health.v1.Health/Check: host:port or http://host:port.
        #[arg(long, required_unless_present = "heartbeat")]
        address: Option<String>,
        /// It renews a TTL heartbeat key instead of serving gRPC.
        #[arg(long, conflicts_with = "address")]
        heartbeat: bool,
    },
    /// Remove a service from every services namespace.
    Deregister {
        #[command(flatten)]
        namespaces: Namespaces,
        /// The service's name.
        #[arg(long)]
        name: String,
    },
    /// Run a service: serve the gRPC health endpoint, register, and print one JSON line per
    /// change of its units until SIGINT or SIGTERM.
    Service {
        #[command(flatten)]
        namespaces: Namespaces,
        /// The service's name.
        #[arg(long)]
        name: String,
        /// Where to serve the health endpoint.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// The address to register, when others reach it by another one than --listen.
        #[arg(long)]
        advertise: Option<String>,
        /// How often its record is read.
        #[arg(long, default_value = "500ms", value_parser = crate::util::parse_duration)]
        watch_interval: Duration,
    },
    /// Add, remove or list work units.
    Units {
        #[command(flatten)]
        namespaces: Namespaces,
        #[command(subcommand)]
        action: UnitsAction,
    },
    /// Print the table (one JSON object), or one service's units.
    Table {
        #[command(flatten)]
        namespaces: Namespaces,
        /// Print only this service's record.
        #[arg(long)]
        service: Option<String>,
    },
}

/// What `units` does.
#[derive(Debug, clap::Subcommand)]
enum UnitsAction {
    /// Add units (idempotent); any characters, commas included.
    Add {
        /// The unit names.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove units.
    Rm {
        /// The unit names.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// List units, one JSON line each.
    Ls,
}

/// Runs the daemon or the command.
pub async fn distributor(store: DynStore, args: DistributorArgs) -> Result<ExitCode, Error> {
    match args.command {
        None => {
            daemon(
                store,
                args.namespaces,
                args.poll_interval,
                args.ping_timeout,
            )
            .await
        }
        Some(Action::Register {
            namespaces,
            name,
            address,
            heartbeat,
        }) => {
            let liveness = match (address, heartbeat) {
                (_, true) => Liveness::Heartbeat,
                (Some(a), false) => Liveness::grpc(&a)?,
                (None, false) => return Err(Error::invalid("give --address or --heartbeat")),
            };
            register_everywhere(&store, &namespaces, &name, &liveness).await?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Action::Deregister { namespaces, name }) => {
            for ns in namespaces.services()? {
                let removed = distributor::deregister(&store, &ns, &name).await?;
                println!(
                    "{}",
                    serde_json::json!({"service": name, "namespace": ns.group(), "removed": removed})
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Action::Service {
            namespaces,
            name,
            listen,
            advertise,
            watch_interval,
        }) => service(store, namespaces, name, listen, advertise, watch_interval).await,
        Some(Action::Units { namespaces, action }) => {
            let ns = namespaces.units()?;
            match action {
                UnitsAction::Add { names } => {
                    for n in names {
                        let added = distributor::add_unit(&store, &ns, &n).await?;
                        println!("{}", serde_json::json!({"unit": n, "added": added}));
                    }
                }
                UnitsAction::Rm { names } => {
                    for n in names {
                        let removed = distributor::remove_unit(&store, &ns, &n).await?;
                        println!("{}", serde_json::json!({"unit": n, "removed": removed}));
                    }
                }
                UnitsAction::Ls => {
                    for n in distributor::list_units(&store, &ns).await? {
                        println!("{}", serde_json::json!({ "unit": n }));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Action::Table {
            namespaces,
            service,
        }) => {
            let ns = namespaces.distribution()?;
            match service {
                Some(s) => {
                    let a = distributor::read_assignment(&store, &ns, &s).await?;
                    println!(
                        "{}",
                        serde_json::json!({
                            "service": s,
                            "version": a.as_ref().map(|a| a.version),
                            "units": a.map(|a| a.units).unwrap_or_default(),
                        })
                    );
                }
                None => match distributor::read_table(&store, &ns).await? {
                    Some(t) => println!(
                        "{}",
                        serde_json::json!({"version": t.version, "services": t.services, "down": t.down})
                    ),
                    None => println!("{}", serde_json::json!({"version": null, "services": {}})),
                },
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn register_everywhere(
    store: &DynStore,
    namespaces: &Namespaces,
    name: &str,
    liveness: &Liveness,
) -> Result<(), Error> {
    for ns in namespaces.services()? {
        let r = distributor::register(store, &ns, name, liveness).await?;
        let (what, previous) = match r {
            Registration::New => ("new", None),
            Registration::Unchanged => ("unchanged", None),
            Registration::AddressChanged { previous } => ("address_changed", Some(previous)),
        };
        println!(
            "{}",
            serde_json::json!({
                "service": name,
                "namespace": ns.group(),
                "address": liveness.as_record(),
                "registration": what,
                "previous": previous,
            })
        );
    }
    Ok(())
}

async fn daemon(
    store: DynStore,
    namespaces: Namespaces,
    poll_interval: Duration,
    ping_timeout: Duration,
) -> Result<ExitCode, Error> {
    let config = DistributorConfig::new(
        namespaces.services_namespaces.clone(),
        namespaces.workunits_namespace.clone(),
        namespaces.distribution_namespace.clone(),
    )
    .with_poll_interval(poll_interval)
    .with_ping_timeout(ping_timeout);
    let d = Distributor::new(store, config)?;
    tracing::info!(
        services = ?namespaces.services_namespaces,
        workunits = %namespaces.workunits_namespace,
        distribution = %namespaces.distribution_namespace,
        ?poll_interval,
        ?ping_timeout,
        "distributor started"
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<Result<(), Error>>();
    let signal = tokio::spawn(async move {
        let _ = tx.send(shutdown_signal().await);
    });
    let mut failed = None;
    d.run(async {
        if let Ok(Err(e)) = rx.await {
            failed = Some(e);
        }
    })
    .await;
    signal.abort();
    if let Some(e) = failed {
        return Err(e);
    }
    tracing::info!("distributor stopped");
    Ok(ExitCode::SUCCESS)
}

async fn service(
    store: DynStore,
    namespaces: Namespaces,
    name: String,
    listen: String,
    advertise: Option<String>,
    watch_interval: Duration,
) -> Result<ExitCode, Error> {
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| Error::config(format!("cannot listen on {listen}: {e}")))?;
    let server = grpc::serve_health(listener)?;
    let address = advertise.unwrap_or_else(|| server.address());
    register_everywhere(&store, &namespaces, &name, &Liveness::grpc(&address)?).await?;
    let mut watch = distributor::watch_assignment(
        store,
        namespaces.distribution()?,
        name.clone(),
        watch_interval,
    )?;
    let mut stop = Box::pin(shutdown_signal());
    loop {
        tokio::select! {
            a = watch.changed() => {
                let a = a?;
                println!("{}", serde_json::json!({"service": name, "version": a.version, "units": a.units}));
            }
            s = &mut stop => {
                s?;
                break;
            }
        }
    }
    server.shutdown().await?;
    Ok(ExitCode::SUCCESS)
}
