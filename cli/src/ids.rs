//! `headcount ids next` and `headcount ids serve`: monotonically increasing IDs agreed by a
//! majority of stores, taken directly or through IDs servers.

use std::process::ExitCode;
use std::time::Duration;

use async_trait::async_trait;
use headcount::recipes::ids::{
    DurabilityPolicy, IdsClient, IdsConfig, IdsService, MajorityIds, MediatedIds, ServeOptions,
    DEFAULT_MAX_CONNECTIONS,
};
use headcount::{redact_url, Capabilities, DynStore, Error, Result};

use crate::exit::{emit, CliError};

/// The subcommands of `ids`.
#[derive(Debug, clap::Subcommand)]
pub enum IdsCommand {
    /// Print the next ID(s), one per line: each greater than every ID handed out before, never
    /// repeated, agreed by a majority (N/2+1) of the stores.
    Next(NextArgs),
    /// Serve IDs over gRPC (`headcount.ids.v1.Ids/Next`, and the standard health service): the
    /// seed's IDs server, which takes one majority round for every caller waiting (group
    /// commit). Several servers over the same stores are safe at once; clients fail over
    /// between them (`ids next --server A,B`). Stops on SIGINT, SIGTERM, SIGHUP or SIGQUIT after
    /// the calls under
    /// way.
    Serve(ServeArgs),
}

/// The arguments of `ids serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The address to listen on (`127.0.0.1:7400`, `[::]:7400`; port 0 picks a free one, which
    /// the server prints on stdout as `listening on ADDR`).
    #[arg(long)]
    pub listen: String,
    /// The stores, as for `ids next --stores`: an odd number of them.
    #[arg(long, required = true)]
    pub stores: Vec<String>,
    /// A generator name the server serves (`hc:{ids}:id:K` on every store). May be repeated.
    #[arg(long = "key", default_value = "default")]
    pub keys: Vec<String>,
    /// Use stores that are not durable, with a warning (see `ids next`).
    #[arg(long)]
    pub allow_non_durable: bool,
    /// How long one call may take on the server, waiting for its round included.
    #[arg(long, default_value = "5s", value_parser = crate::util::parse_duration)]
    pub deadline: Duration,
    /// The most client connections open at once [default: 512, or half the open-files limit
    /// (`ulimit -n`) when that is lower]. At the cap a new connection closes the one idle
    /// longest (or itself, when every connection has a call in flight).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// How long a connection with no call in flight may stay silent before the server closes
    /// it (clients connect again at their next call).
    #[arg(long, default_value = "60s", value_parser = crate::util::parse_duration)]
    pub idle_timeout: Duration,
    #[command(flatten)]
    pub metrics: crate::observe::MetricsArgs,
}

/// The arguments of `ids next`.
#[derive(Debug, clap::Args)]
pub struct NextArgs {
    /// The stores, comma-separated (an odd number, each a different server or file). A piece
    /// that does not start with a store scheme (`redis:`, `etcd:`, ...) continues the previous
    /// URL's host list, so `redis+cluster://h:7000,h:7001,sqlite://ids.db` is two stores. May be
    /// repeated.
    #[arg(long, required_unless_present = "server", conflicts_with = "server")]
    pub stores: Vec<String>,
    /// Take the IDs from IDs servers (`ids serve`) instead of the stores: `host:port`,
    /// comma-separated; the command moves on to the next when one does not answer. `-n N`
    /// is one call for N consecutive IDs.
    #[arg(long, value_delimiter = ',')]
    pub server: Vec<String>,
    /// The generator's name: the key is `hc:{ids}:id:K` on every store.
    #[arg(long, default_value = "default")]
    pub key: String,
    /// How many IDs to print.
    #[arg(short = 'n', default_value_t = 1)]
    pub n: u64,
    /// Use stores that are not durable (Redis without appendfsync always, SQLite without
    /// synchronous=full...), with a warning: a crash of one can repeat an ID.
    #[arg(long)]
    pub allow_non_durable: bool,
    /// How long one ID may take before the command gives up, printing no further ID.
    #[arg(long, default_value = "5s", value_parser = crate::util::parse_duration)]
    pub deadline: Duration,
    #[command(flatten)]
    pub metrics: crate::observe::MetricsArgs,
}

/// Runs `ids`.
pub async fn ids(command: IdsCommand) -> std::result::Result<ExitCode, CliError> {
    match command {
        IdsCommand::Next(args) if !args.server.is_empty() => next_from_servers(args).await,
        IdsCommand::Next(args) => next(args).await,
        IdsCommand::Serve(args) => serve(args).await,
    }
}

/// The generator of `key` over the stores of `--stores`, checked as `ids next` does; connecting
/// counts against `deadline`.
async fn generator(
    raw: &[String],
    key: String,
    allow_non_durable: bool,
    deadline: Duration,
) -> std::result::Result<MajorityIds, CliError> {
    let urls = check_urls(raw)?;
    let connecting = futures::future::join_all(urls.iter().map(|u| connect(u)));
    let stores = tokio::time::timeout(deadline, connecting)
        .await
        .map_err(|_| Error::Timeout {
            backend: "majority ids",
            op: "connect",
            after: deadline,
        })?;
    let stores = stores.into_iter().collect::<Result<Vec<_>>>()?;
    let policy = if allow_non_durable {
        DurabilityPolicy::AllowNonDurable
    } else {
        DurabilityPolicy::Require
    };
    let config = IdsConfig::new(key)
        .with_deadline(deadline)
        .with_durability(policy);
    Ok(MajorityIds::new(stores, config).await?)
}

async fn next(args: NextArgs) -> std::result::Result<ExitCode, CliError> {
    if args.n == 0 {
        return Err(Error::invalid("-n must be at least 1").into());
    }
    no_id_without_stdout()?;
    let ids = generator(
        &args.stores,
        args.key,
        args.allow_non_durable,
        args.deadline,
    )
    .await?;
    for delivered in 0..args.n {
        let id = ids.next().await?;
        deliver(id, delivered, args.n)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `ids next --server`: one call for all `-n` IDs, failing over between the servers.
async fn next_from_servers(args: NextArgs) -> std::result::Result<ExitCode, CliError> {
    if args.allow_non_durable {
        return Err(Error::invalid(
            "--allow-non-durable is the server's choice (ids serve), not the client's",
        )
        .into());
    }
    if args.n == 0 {
        return Err(Error::invalid("-n must be at least 1").into());
    }
    no_id_without_stdout()?;
    let client = IdsClient::new(&args.server, args.deadline)?;
    let ids = client.next_block(&args.key, args.n).await?;
    for (delivered, id) in ids.enumerate() {
        deliver(id, delivered as u64, args.n)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses to draw IDs that could not be printed: an ID drawn is spent whether or not anyone
/// reads it.
fn no_id_without_stdout() -> std::result::Result<(), CliError> {
    crate::exit::check_stdout_writable().map_err(|e| CliError::Exit {
        code: e.code(),
        message: format!("{}: no ID drawn", e.message().unwrap_or_default()),
    })
}

/// Prints one ID. An ID the reader never got is still spent: say so, and never exit 0.
fn deliver(id: i64, delivered: u64, n: u64) -> std::result::Result<(), CliError> {
    emit(id).map_err(|e| {
        let why = match &e {
            CliError::StdoutClosed => "stdout was closed".to_owned(),
            other => other.message().unwrap_or_default(),
        };
        CliError::Exit {
            code: crate::exit::FAILURE,
            message: format!(
                "{why}: ID {id} was issued but not delivered ({delivered} of {n} delivered)"
            ),
        }
    })
}

/// `ids serve`.
async fn serve(args: ServeArgs) -> std::result::Result<ExitCode, CliError> {
    let options = serve_options(&args)?;
    let urls = check_urls(&args.stores)?;
    if urls.len() % 2 == 0 {
        return Err(Error::invalid(format!(
            "--stores names {} stores: a majority of an even number tolerates no more failures \
             than one store fewer; give an odd number",
            urls.len()
        ))
        .into());
    }
    let mut generators = Vec::new();
    for key in &args.keys {
        let ids = generator(
            &args.stores,
            key.clone(),
            args.allow_non_durable,
            args.deadline,
        )
        .await?;
        generators.push(MediatedIds::new(ids));
    }
    let service = IdsService::new(generators)?;
    let mut shutdown = crate::util::Shutdown::new()?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| Error::config(format!("cannot listen on {}: {e}", args.listen)))?;
    let server = headcount::recipes::ids::serve_with(listener, service, options).await?;
    crate::exit::emit(format_args!("listening on {}", server.local_addr()))?;
    tracing::info!(
        addr = %server.local_addr(),
        keys = ?args.keys,
        max_connections = options.max_connections(),
        idle_timeout = ?options.idle_timeout(),
        "serving IDs"
    );
    tokio::select! {
        () = shutdown.recv() => {
            tracing::info!("stopping: finishing the calls under way");
            server.shutdown().await?;
        }
        ended = server.wait() => ended?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The connection cap and idle timeout of `ids serve`, checked before anything is opened. The
/// default cap leaves at least half the process's file descriptors to everything else (the
/// stores' connections, the listener, logs): a cap at the limit would leave no room to accept.
fn serve_options(args: &ServeArgs) -> Result<ServeOptions> {
    let max = match args.max_connections {
        Some(0) => return Err(Error::invalid("--max-connections must be at least 1")),
        Some(max) => max,
        None => match open_files_limit() {
            Some(limit) => {
                DEFAULT_MAX_CONNECTIONS.min(usize::try_from(limit / 2).unwrap_or(1).max(1))
            }
            None => DEFAULT_MAX_CONNECTIONS,
        },
    };
    if args.idle_timeout.is_zero() {
        return Err(Error::invalid("--idle-timeout must be above zero"));
    }
    Ok(ServeOptions::default()
        .with_max_connections(max)
        .with_idle_timeout(args.idle_timeout))
}

/// The soft limit on open files (`ulimit -n`), if there is one.
#[allow(unsafe_code)]
fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes only the struct it is given, which lives on this stack.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// The schemes that start a new URL in `--stores`; any other piece continues a host list.
const SCHEMES: &[&str] = &[
    "sqlite",
    "postgres",
    "postgresql",
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "etcd",
    "etcds",
];

fn starts_a_url(piece: &str) -> bool {
    piece
        .split_once(':')
        .is_some_and(|(scheme, _)| SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme)))
}

/// Splits the `--stores` values into URLs (a piece without a scheme joins the previous URL's
/// host list), trims them, and rejects an empty list and duplicates (which would let one server
/// count twice toward a majority).
fn check_urls(raw: &[String]) -> Result<Vec<String>> {
    let mut urls: Vec<String> = Vec::new();
    for value in raw {
        // Each `--stores` value starts afresh: a host list never spans two of them.
        let mut current: Option<String> = None;
        for piece in value.split(',').map(str::trim) {
            match &mut current {
                Some(url) if !piece.is_empty() && !starts_a_url(piece) => {
                    url.push(',');
                    url.push_str(piece);
                }
                _ => {
                    urls.extend(current.take());
                    current = Some(piece.to_owned());
                }
            }
        }
        urls.extend(current);
    }
    urls.retain(|u| !u.is_empty());
    if urls.is_empty() {
        return Err(Error::invalid("--stores names no store"));
    }
    for (i, url) in urls.iter().enumerate() {
        if urls[..i].contains(url) {
            return Err(Error::invalid(format!(
                "--stores names {} twice: a majority must be of distinct stores",
                redact_url(url)
            )));
        }
    }
    Ok(urls)
}

/// Connects to one store. A store that is down now stands in the set as [`Later`], so it still
/// counts toward the majority's size and joins once it answers (a long-running `ids serve` does
/// not stay a store short); a bad URL or a refusal fails the command.
async fn connect(url: &str) -> Result<DynStore> {
    match headcount::connect(url).await {
        Ok(store) => Ok(store),
        Err(e) if e.is_retryable() => {
            tracing::warn!(store = %redact_url(url), error = %e, "ID store unreachable; connecting again at its next use");
            Ok(std::sync::Arc::new(Later {
                url: url.to_owned(),
                shown: redact_url(url),
                store: tokio::sync::OnceCell::new(),
            }))
        }
        Err(e) => Err(e),
    }
}

/// A store that could not be reached when the command started: each call first tries to connect
/// (until one attempt succeeds), and fails retryably while it cannot.
struct Later {
    url: String,
    shown: String,
    store: tokio::sync::OnceCell<DynStore>,
}

impl std::fmt::Debug for Later {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Later")
            .field("url", &self.shown)
            .field("connected", &self.store.initialized())
            .finish()
    }
}

impl Later {
    async fn store(&self) -> Result<&DynStore> {
        self.store
            .get_or_try_init(|| headcount::connect(&self.url))
            .await
            .map_err(|e| Error::Unavailable {
                backend: "unreachable store",
                message: format!("{}: {e}", self.shown),
                source: None,
            })
    }
}

#[async_trait]
impl headcount::backend::Backend for Later {
    fn capabilities(&self) -> Capabilities {
        match self.store.get() {
            Some(store) => store.capabilities(),
            None => Capabilities::new("unreachable store"),
        }
    }
    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        self.store().await?.incr(key, ttl).await
    }
    async fn get(&self, key: &str) -> Result<Option<String>> {
        self.store().await?.get(key).await
    }
    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        self.store().await?.expire(key, ttl).await
    }
    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        self.store()
            .await?
            .compare_and_set(key, expected, new, ttl)
            .await
    }
    async fn delete(&self, key: &str) -> Result<bool> {
        self.store().await?.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        self.store().await?.list(prefix).await
    }
    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        self.store().await?.list_with_ttl(prefix).await
    }
    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        self.store().await?.set_max(key, value, ttl).await
    }
    async fn durability(&self) -> Result<headcount::Durability> {
        self.store().await?.durability().await
    }
    async fn subscribe(&self, dir: &str) -> Result<headcount::notify::Notifications> {
        self.store().await?.subscribe(dir).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        let list = |s: &[&str]| s.iter().map(|u| (*u).to_owned()).collect::<Vec<_>>();
        assert!(check_urls(&list(&[])).is_err());
        assert!(check_urls(&list(&["", " "])).is_err());
        let dup = check_urls(&list(&["sqlite://a.db", " sqlite://a.db"]));
        assert!(
            matches!(&dup, Err(Error::InvalidArgument { message }) if message.contains("twice")),
            "{dup:?}"
        );
        assert_eq!(
            check_urls(&list(&["sqlite://a.db,sqlite://b.db"])).ok(),
            Some(list(&["sqlite://a.db", "sqlite://b.db"]))
        );
        assert_eq!(
            check_urls(&list(&[
                "redis+cluster://h:7000,h:7001, etcd://e:2379,e2:2379,sqlite://c.db",
                "redis://r:6379,redis+sentinel://s1,s2:26380/m/1",
            ]))
            .ok(),
            Some(list(&[
                "redis+cluster://h:7000,h:7001",
                "etcd://e:2379,e2:2379",
                "sqlite://c.db",
                "redis://r:6379",
                "redis+sentinel://s1,s2:26380/m/1"
            ]))
        );
    }
}
