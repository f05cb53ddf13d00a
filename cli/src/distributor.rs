//! `headcount distributor`: the Distributor daemon, and the small commands a user
//! needs next to it (register a service, run one, manage work units, read the table).

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use headcount::recipes::distributor::{
    self, grpc, Distributor, DistributorConfig, Liveness, Registration,
};
use headcount::{DynStore, Error, Keyspace};

use crate::exit::{emit, CliError};
use crate::util::{rfc3339, Shutdown};

/// The namespaces shared by the daemon and the commands. Each flag also reads a `HEADCOUNT_`
/// environment variable, and then the article's unprefixed one (`SERVICES_NAMESPACE`, ...),
/// which keeps working.
#[derive(Debug, Clone, clap::Args)]
pub struct Namespaces {
    /// Services namespaces, comma-separated: where services register [default: services]
    /// [also read: SERVICES_NAMESPACE].
    #[arg(
        long,
        env = "HEADCOUNT_SERVICES_NAMESPACE",
        value_delimiter = ',',
        value_name = "NS"
    )]
    pub services_namespaces: Vec<String>,
    /// Where the work units are kept [default: workunits] [also read: WORKUNITS_NAMESPACE].
    #[arg(long, env = "HEADCOUNT_WORKUNITS_NAMESPACE", value_name = "NS")]
    pub workunits_namespace: Option<String>,
    /// Where the matching table is written [default: distribution] [also read:
    /// DISTRIBUTION_NAMESPACE].
    #[arg(long, env = "HEADCOUNT_DISTRIBUTION_NAMESPACE", value_name = "NS")]
    pub distribution_namespace: Option<String>,
}

/// `value` (the flag or its `HEADCOUNT_` variable), else the unprefixed variable `legacy`.
fn twin(value: Option<&str>, legacy: &str) -> Option<String> {
    value
        .map(str::to_owned)
        .or_else(|| std::env::var(legacy).ok().filter(|v| !v.is_empty()))
}

impl Namespaces {
    fn services_names(&self) -> Vec<String> {
        if !self.services_namespaces.is_empty() {
            return self.services_namespaces.clone();
        }
        match twin(None, "SERVICES_NAMESPACE") {
            Some(list) => list.split(',').map(str::to_owned).collect(),
            None => vec!["services".to_owned()],
        }
    }

    fn workunits_name(&self) -> String {
        twin(self.workunits_namespace.as_deref(), "WORKUNITS_NAMESPACE")
            .unwrap_or_else(|| "workunits".to_owned())
    }

    fn distribution_name(&self) -> String {
        twin(
            self.distribution_namespace.as_deref(),
            "DISTRIBUTION_NAMESPACE",
        )
        .unwrap_or_else(|| "distribution".to_owned())
    }

    fn services(&self) -> Result<Vec<Keyspace>, Error> {
        let names = self.services_names();
        if names.is_empty() {
            return Err(Error::config("no services namespace given"));
        }
        names
            .iter()
            .map(|ns| keyspace("services namespace", ns))
            .collect()
    }

    fn units(&self) -> Result<Keyspace, Error> {
        keyspace("work units namespace", &self.workunits_name())
    }

    fn distribution(&self) -> Result<Keyspace, Error> {
        keyspace("distribution namespace", &self.distribution_name())
    }

    fn check(&self) -> Result<(), Error> {
        self.services()?;
        self.units()?;
        self.distribution()?;
        Ok(())
    }
}

/// A duration from its flag or `HEADCOUNT_` variable, else the unprefixed variable, else the
/// default.
fn duration_twin(
    value: Option<Duration>,
    legacy: &str,
    default: Duration,
) -> Result<Duration, Error> {
    if let Some(d) = value {
        return Ok(d);
    }
    match twin(None, legacy) {
        Some(text) => crate::util::parse_duration(&text)
            .map_err(|why| Error::config(format!("{legacy}={text:?}: {why}"))),
        None => Ok(default),
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
    /// How often every service is pinged and the table recomputed [default: 1s] [also read:
    /// POLL_INTERVAL].
    #[arg(long, env = "HEADCOUNT_POLL_INTERVAL", value_parser = crate::util::parse_duration)]
    poll_interval: Option<Duration>,
    /// How long a ping may take before the service counts as down [default: 1s] [also read:
    /// PING_TIMEOUT].
    #[arg(long, env = "HEADCOUNT_PING_TIMEOUT", value_parser = crate::util::parse_duration)]
    ping_timeout: Option<Duration>,
    /// How many pings in a row a service that holds units must fail before its units move
    /// [default: 2]; 1 moves them at the first failed ping, as the article's distributor does.
    #[arg(long, env = "HEADCOUNT_DOWN_AFTER", value_name = "PINGS")]
    down_after: Option<u32>,
    #[command(flatten)]
    pub metrics: crate::observe::MetricsArgs,
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
    /// change of its units until SIGINT, SIGTERM, SIGHUP or SIGQUIT.
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

impl DistributorArgs {
    /// Whether the command only reads (`table`, `units ls`): then no store is created.
    pub fn is_read_only(&self) -> bool {
        matches!(
            self.command,
            Some(Action::Table { .. })
                | Some(Action::Units {
                    action: UnitsAction::Ls,
                    ..
                })
        )
    }

    /// Checks everything that needs no store, before connecting: nothing is written when any
    /// part of the command is wrong.
    pub fn check(&self) -> Result<(), Error> {
        match &self.command {
            None => {
                self.namespaces.check()?;
                let poll = duration_twin(self.poll_interval, "POLL_INTERVAL", DEFAULT_POLL)?;
                let ping = duration_twin(self.ping_timeout, "PING_TIMEOUT", DEFAULT_POLL)?;
                if poll.is_zero() || ping.is_zero() {
                    return Err(Error::invalid(
                        "--poll-interval and --ping-timeout must be above zero",
                    ));
                }
                if let Some(n) = self.down_after {
                    if !(1..=distributor::MAX_DOWN_AFTER).contains(&n) {
                        return Err(Error::invalid(format!(
                            "--down-after {n} is outside 1..={}",
                            distributor::MAX_DOWN_AFTER
                        )));
                    }
                }
                Ok(())
            }
            Some(Action::Register {
                namespaces,
                name,
                address,
                heartbeat,
            }) => {
                namespaces.services()?;
                distributor::check_service_name(name)?;
                if let (Some(a), false) = (address, heartbeat) {
                    Liveness::grpc(a)?;
                }
                Ok(())
            }
            Some(Action::Deregister { namespaces, name }) => {
                namespaces.services()?;
                distributor::check_service_name(name)
            }
            Some(Action::Service {
                namespaces,
                name,
                advertise,
                watch_interval,
                ..
            }) => {
                namespaces.check()?;
                distributor::check_service_name(name)?;
                if let Some(a) = advertise {
                    Liveness::grpc(a)?;
                }
                if watch_interval.is_zero() {
                    return Err(Error::invalid("--watch-interval must be above zero"));
                }
                Ok(())
            }
            Some(Action::Units { namespaces, action }) => {
                namespaces.units()?;
                match action {
                    UnitsAction::Add { names } | UnitsAction::Rm { names } => names
                        .iter()
                        .try_for_each(|n| distributor::check_unit_name(n)),
                    UnitsAction::Ls => Ok(()),
                }
            }
            Some(Action::Table { namespaces, .. }) => namespaces.distribution().map(|_| ()),
        }
    }
}

/// The poll interval and ping timeout when none is given.
const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// Runs the daemon or the command.
pub async fn distributor(store: DynStore, args: DistributorArgs) -> Result<ExitCode, CliError> {
    match args.command {
        None => {
            let poll = duration_twin(args.poll_interval, "POLL_INTERVAL", DEFAULT_POLL)?;
            let ping = duration_twin(args.ping_timeout, "PING_TIMEOUT", DEFAULT_POLL)?;
            let down_after = args.down_after.unwrap_or(distributor::DEFAULT_DOWN_AFTER);
            daemon(store, args.namespaces, poll, ping, down_after).await
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
                (None, false) => return Err(Error::invalid("give --address or --heartbeat").into()),
            };
            register_everywhere(&store, &namespaces, &name, &liveness).await?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Action::Deregister { namespaces, name }) => {
            for ns in namespaces.services()? {
                let removed = distributor::deregister(&store, &ns, &name).await?;
                emit(
                    serde_json::json!({"service": name, "namespace": ns.group(), "removed": removed}),
                )?;
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
                        emit(serde_json::json!({"unit": n, "added": added}))?;
                    }
                }
                UnitsAction::Rm { names } => {
                    for n in names {
                        let removed = distributor::remove_unit(&store, &ns, &n).await?;
                        emit(serde_json::json!({"unit": n, "removed": removed}))?;
                    }
                }
                UnitsAction::Ls => {
                    for n in distributor::list_units(&store, &ns).await? {
                        emit(serde_json::json!({ "unit": n }))?;
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
                    emit(serde_json::json!({
                        "service": s,
                        "version": a.as_ref().map(|a| a.version),
                        "units": a.map(|a| a.units).unwrap_or_default(),
                    }))?;
                }
                None => match distributor::read_table(&store, &ns).await? {
                    Some(t) => emit(
                        serde_json::json!({"version": t.version, "services": t.services, "down": t.down}),
                    )?,
                    None => emit(serde_json::json!({"version": null, "services": {}}))?,
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
) -> Result<(), CliError> {
    for ns in namespaces.services()? {
        let r = distributor::register(store, &ns, name, liveness).await?;
        let (what, previous) = match r {
            Registration::New => ("new", None),
            Registration::Unchanged => ("unchanged", None),
            Registration::AddressChanged { previous } => ("address_changed", Some(previous)),
        };
        emit(serde_json::json!({
            "service": name,
            "namespace": ns.group(),
            "address": liveness.as_record(),
            "registration": what,
            "previous": previous,
        }))?;
    }
    Ok(())
}

async fn daemon(
    store: DynStore,
    namespaces: Namespaces,
    poll_interval: Duration,
    ping_timeout: Duration,
    down_after: u32,
) -> Result<ExitCode, CliError> {
    let config = DistributorConfig::new(
        namespaces.services_names(),
        namespaces.workunits_name(),
        namespaces.distribution_name(),
    )
    .with_poll_interval(poll_interval)
    .with_ping_timeout(ping_timeout)
    .with_down_after(down_after);
    let d = Distributor::new(store, config)?;
    tracing::info!(
        services = ?namespaces.services_names(),
        workunits = %namespaces.workunits_name(),
        distribution = %namespaces.distribution_name(),
        ?poll_interval,
        ?ping_timeout,
        down_after,
        "distributor started"
    );
    let mut shutdown = Shutdown::new()?;
    d.run(async move { shutdown.recv().await }).await;
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
) -> Result<ExitCode, CliError> {
    let mut shutdown = Shutdown::new()?;
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
    // A closed stdout stops the service like a signal: its health endpoint goes away, so the
    // distributor moves its units.
    let ended: Result<(), CliError> = loop {
        tokio::select! {
            a = watch.changed() => {
                let line = match a {
                    Ok(a) => serde_json::json!({
                        "service": name,
                        "version": a.version,
                        "units": a.units,
                        "at": rfc3339(SystemTime::now()),
                    }),
                    Err(e) => break Err(e.into()),
                };
                if let Err(e) = emit(line) {
                    break Err(e);
                }
            }
            () = shutdown.recv() => break Ok(()),
        }
    };
    server.shutdown().await?;
    ended?;
    Ok(ExitCode::SUCCESS)
}
