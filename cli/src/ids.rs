//! `headcount ids next`: monotonically increasing IDs agreed by a majority of stores.

use std::process::ExitCode;
use std::time::Duration;

use async_trait::async_trait;
use headcount::recipes::ids::{DurabilityPolicy, IdsConfig, MajorityIds};
use headcount::{redact_url, Capabilities, DynStore, Error, Result, Store};

use crate::exit::{emit, CliError};

/// The subcommands of `ids`.
#[derive(Debug, clap::Subcommand)]
pub enum IdsCommand {
    /// Print the next ID(s), one per line: each greater than every ID handed out before, never
    /// repeated, agreed by a majority (N/2+1) of the stores.
    Next(NextArgs),
}

/// The arguments of `ids next`.
#[derive(Debug, clap::Args)]
pub struct NextArgs {
    /// The stores, comma-separated (an odd number, each a different server or file). A piece
    /// that does not start with a store scheme (`redis:`, `etcd:`, ...) continues the previous
    /// URL's host list, so `redis+cluster://h:7000,h:7001,sqlite://ids.db` is two stores. May be
    /// repeated.
    #[arg(long, required = true)]
    pub stores: Vec<String>,
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
        IdsCommand::Next(args) => next(args).await,
    }
}

async fn next(args: NextArgs) -> std::result::Result<ExitCode, CliError> {
    let urls = check_urls(&args.stores)?;
    if args.n == 0 {
        return Err(Error::invalid("-n must be at least 1").into());
    }
    let stores = futures::future::join_all(urls.iter().map(|u| connect(u))).await;
    let stores = stores.into_iter().collect::<Result<Vec<_>>>()?;
    let policy = if args.allow_non_durable {
        DurabilityPolicy::AllowNonDurable
    } else {
        DurabilityPolicy::Require
    };
    let config = IdsConfig::new(args.key)
        .with_deadline(args.deadline)
        .with_durability(policy);
    let ids = MajorityIds::new(stores, config).await?;
    for delivered in 0..args.n {
        let id = ids.next().await?;
        // An ID the reader never got is still spent: say so, and never exit 0.
        if let Err(e) = emit(id) {
            let why = match &e {
                CliError::StdoutClosed => "stdout was closed".to_owned(),
                other => other.message().unwrap_or_default(),
            };
            return Err(CliError::Exit {
                code: crate::exit::FAILURE,
                message: format!(
                    "{why}: ID {id} was issued but not delivered ({delivered} of {} delivered)",
                    args.n
                ),
            });
        }
    }
    Ok(ExitCode::SUCCESS)
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

/// Connects to one store. A store that is down now stands in the set as [`Down`], so it still
/// counts toward the majority's size; a bad URL or a refusal fails the command.
async fn connect(url: &str) -> Result<DynStore> {
    match headcount::connect(url).await {
        Ok(store) => Ok(store),
        Err(e) if e.is_retryable() => {
            tracing::warn!(store = %redact_url(url), error = %e, "ID store unreachable");
            Ok(std::sync::Arc::new(Down {
                url: redact_url(url),
                message: e.to_string(),
            }))
        }
        Err(e) => Err(e),
    }
}

/// A store that could not be reached when the command started: every call fails, retryably.
#[derive(Debug)]
struct Down {
    url: String,
    message: String,
}

impl Down {
    fn error(&self) -> Error {
        Error::Unavailable {
            backend: "unreachable store",
            message: format!("{}: {}", self.url, self.message),
            source: None,
        }
    }
}

#[async_trait]
impl Store for Down {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new("unreachable store")
    }
    async fn incr(&self, _: &str, _: Option<Duration>) -> Result<i64> {
        Err(self.error())
    }
    async fn get(&self, _: &str) -> Result<Option<String>> {
        Err(self.error())
    }
    async fn expire(&self, _: &str, _: Duration) -> Result<bool> {
        Err(self.error())
    }
    async fn compare_and_set(
        &self,
        _: &str,
        _: Option<&str>,
        _: &str,
        _: Option<Duration>,
    ) -> Result<bool> {
        Err(self.error())
    }
    async fn delete(&self, _: &str) -> Result<bool> {
        Err(self.error())
    }
    async fn list(&self, _: &str) -> Result<Vec<(String, String)>> {
        Err(self.error())
    }
    async fn set_max(&self, _: &str, _: i64, _: Option<Duration>) -> Result<bool> {
        Err(self.error())
    }
    async fn durability(&self) -> Result<headcount::Durability> {
        Err(self.error())
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
                "redis://r:6379",
            ]))
            .ok(),
            Some(list(&[
                "redis+cluster://h:7000,h:7001",
                "etcd://e:2379,e2:2379",
                "sqlite://c.db",
                "redis://r:6379"
            ]))
        );
    }
}
