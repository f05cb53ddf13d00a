//! The group page: `status --serve ADDR`, and `/group` beside `/metrics` in `run` and `exec`.
//!
//! A background task reads the group (as `status` does) every [`EVERY`] while the page is
//! watched, and keeps the `status --json` document, the owners of the grid's keys and the view
//! changes it saw ([`Observer`]); requests are answered from what it kept, so an answer costs
//! no store round trip. The HTML, script and style are built into the binary: the page loads
//! nothing from anywhere else.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use headcount::assign::{AssignorKind, KeySet};
use headcount::recipes::group::{status_with_keys, GroupStatus};
use headcount::{DynStore, Error, DEFAULT_PREFIX};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::http::{self, Body, Request, Response};
use crate::status::{document, error_document, key_json, StatusArgs};
use crate::timeline::Observer;
use crate::util::AssignorArg;

/// The page: HTML, style and script in one file.
const HTML: &str = include_str!("group.html");

/// How often the group is read while the page is watched.
pub const EVERY: Duration = Duration::from_millis(250);

/// How old a document may be when it is asked for: older, the group is read again first.
const STALE_AFTER: Duration = Duration::from_secs(1);

/// How long after the last request the page of `run` and `exec` stops reading the group: a
/// member's page costs the store nothing while nobody looks at it.
const IDLE_AFTER: Duration = Duration::from_secs(30);

/// What the last read of the group left for the requests.
#[derive(Default)]
struct Kept {
    /// The `status --json` document (or the error document of a failed read).
    document: Option<Arc<Vec<u8>>>,
    /// The owners document of the newest view read.
    owners: Option<(u64, Arc<Vec<u8>>)>,
    /// The newest status read, for `/group/key`.
    status: Option<Arc<GroupStatus>>,
    /// When the group was last read.
    read_at: Option<Instant>,
}

/// One group's page (see the module's documentation).
pub struct Page {
    store: DynStore,
    args: StatusArgs,
    declared: Option<Arc<KeySet>>,
    /// Read the group even when nobody watches (`status --serve`, whose timeline should have
    /// no gaps), rather than only within [`IDLE_AFTER`] of a request.
    always: bool,
    kept: Mutex<Kept>,
    /// Held while the group is read (reads that overlapped could be taken in out of order),
    /// with the view changes seen: the documents are built under it, not under [`Kept`]'s lock,
    /// so requests are answered while a read builds its documents.
    reading: tokio::sync::Mutex<Observer>,
    last_request: Mutex<Option<Instant>>,
    wake: Notify,
}

static INSTALLED: OnceLock<Arc<Page>> = OnceLock::new();

/// The page `run` or `exec` installed beside its metrics, if any.
pub fn installed() -> Option<Arc<Page>> {
    INSTALLED.get().cloned()
}

/// Installs the page `/group` serves beside `/metrics` (once per process) and starts reading
/// the group when it is watched.
pub fn install(page: Arc<Page>) {
    if INSTALLED.set(page.clone()).is_ok() {
        tokio::spawn(page.read_on());
    }
}

/// In `run` and `exec`: installs the page of `group` beside the metrics when `--metrics-addr`
/// is given (the metrics endpoint then answers `/group`).
pub fn install_beside_metrics(
    store: &DynStore,
    group: &str,
    assignor: Option<AssignorArg>,
    metrics: &crate::observe::MetricsArgs,
) {
    if metrics.metrics_addr.is_some() {
        let assignor = assignor.unwrap_or(AssignorArg(AssignorKind::JumpBackFailover));
        let args = StatusArgs::for_page(group, assignor);
        install(Page::new(store.clone(), args, None, false));
    }
}

/// Serves `page` alone on `addr` (`status --serve`): `/` and `/group` are the page.
pub async fn serve(addr: &str, page: Arc<Page>) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::config(format!("cannot serve the group page on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::config(format!("cannot serve the group page on {addr}: {e}")))?;
    tokio::spawn(page.clone().read_on());
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let page = page.clone();
            tokio::spawn(async move {
                let exchange = async {
                    let Some(request) = http::read_request(&mut stream).await? else {
                        return Ok(());
                    };
                    let response = match (request.method.as_str(), request.path.as_str()) {
                        ("GET" | "HEAD", "/") => page.respond_to("/group", &request).await,
                        ("GET" | "HEAD", _) => page.respond(&request).await,
                        _ => Response::text("405 Method Not Allowed", "use GET\n"),
                    };
                    http::write_response(&mut stream, &request.method, &response).await
                };
                // A client that stalls is dropped; nothing else depends on it.
                let _: Result<std::io::Result<()>, _> =
                    tokio::time::timeout(Duration::from_secs(10), exchange).await;
            });
        }
    });
    Ok(local)
}

impl Page {
    /// A page of the group `args` names, read from `store`.
    pub fn new(
        store: DynStore,
        args: StatusArgs,
        declared: Option<Arc<KeySet>>,
        always: bool,
    ) -> Arc<Page> {
        Arc::new(Page {
            store,
            args,
            declared,
            always,
            kept: Mutex::new(Kept::default()),
            reading: tokio::sync::Mutex::new(Observer::default()),
            last_request: Mutex::new(None),
            wake: Notify::new(),
        })
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a request came within [`IDLE_AFTER`].
    fn watched(&self) -> bool {
        self.last_request
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|t| t.elapsed() < IDLE_AFTER)
    }

    /// Reads the group every [`EVERY`] while it is watched (always for `status --serve`).
    async fn read_on(self: Arc<Self>) {
        loop {
            if !self.always && !self.watched() {
                self.wake.notified().await;
            }
            self.read().await;
            tokio::time::sleep(EVERY).await;
        }
    }

    /// Reads the group once and keeps the documents.
    async fn read(&self) {
        let mut observer = self.reading.lock().await;
        let started = Instant::now();
        let now = SystemTime::now();
        let read = status_with_keys(
            &self.store,
            DEFAULT_PREFIX,
            &self.args.group,
            self.args.assignor.0,
            self.args.sample,
            self.declared.clone(),
        )
        .await;
        match read {
            Ok(s) => {
                observer.observe(&s, now, self.args.sample);
                let doc = Arc::new(
                    document(&self.args, &s, now, &observer)
                        .to_string()
                        .into_bytes(),
                );
                let kept_epoch = self.kept().owners.as_ref().map(|(e, _)| *e);
                let owners = match observer.owners() {
                    Some((epoch, _)) if kept_epoch == Some(epoch) => None,
                    Some((epoch, owners)) => Some(Some((
                        epoch,
                        Arc::new(owners_document(&s, epoch, &owners).to_string().into_bytes()),
                    ))),
                    None => Some(None),
                };
                let mut kept = self.kept();
                kept.read_at = Some(started);
                kept.document = Some(doc);
                if let Some(owners) = owners {
                    kept.owners = owners;
                }
                kept.status = Some(Arc::new(s));
            }
            Err(e) => {
                let doc = error_document(&self.args.group, now, &e);
                let mut kept = self.kept();
                kept.read_at = Some(started);
                kept.document = Some(Arc::new(doc.to_string().into_bytes()));
            }
        }
        tracing::debug!(
            target: "headcount::page",
            took_us = started.elapsed().as_micros() as u64,
            "read the group and built its documents"
        );
    }

    /// Answers a request under `/group`.
    pub async fn respond(&self, request: &Request) -> Response {
        self.respond_to(&request.path, request).await
    }

    async fn respond_to(&self, path: &str, request: &Request) -> Response {
        let was_watched = self.watched();
        *self
            .last_request
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        if !was_watched {
            self.wake.notify_one();
        }
        let json = |body: Arc<Vec<u8>>| Response {
            status: "200 OK",
            content_type: "application/json",
            body: Body::Shared(body),
        };
        match path {
            "/group" | "/group/" => Response {
                status: "200 OK",
                content_type: "text/html; charset=utf-8",
                body: Body::Static(HTML),
            },
            "/group/status.json" => {
                // A page that was not watched reads the group itself, so it is not answered
                // with a document from before its reads stopped.
                let stale = self
                    .kept()
                    .read_at
                    .is_none_or(|t| t.elapsed() > STALE_AFTER);
                if stale {
                    self.read().await;
                }
                match self.kept().document.clone() {
                    Some(doc) => json(doc),
                    None => Response::text("503 Service Unavailable", "not read yet\n"),
                }
            }
            "/group/owners.json" => match self.kept().owners.clone() {
                Some((_, doc)) => json(doc),
                None => Response {
                    status: "200 OK",
                    content_type: "application/json",
                    body: Body::Static("null"),
                },
            },
            "/group/key" => {
                let Some(name) = request.param("name") else {
                    return Response::text("400 Bad Request", "give the key as ?name=KEY\n");
                };
                let status = self.kept().status.clone();
                match status {
                    Some(s) => Response {
                        status: "200 OK",
                        content_type: "application/json",
                        body: Body::Text(key_json(&name, &s).to_string()),
                    },
                    None => Response::text("503 Service Unavailable", "not read yet\n"),
                }
            }
            "/group/schema.json" => Response {
                status: "200 OK",
                content_type: "application/schema+json",
                body: Body::Static(crate::status::SCHEMA),
            },
            _ => Response::text(
                "404 Not Found",
                "not found: try /group, /group/status.json, /group/owners.json, \
                 /group/key?name=KEY or /group/schema.json\n",
            ),
        }
    }
}

/// The owners document: the slot that owns each of the grid's keys under the view of `epoch`
/// (`null` for none), and their names when they are not `0`, `1`, ... (named declared keys).
fn owners_document(s: &GroupStatus, epoch: u64, owners: &[Option<u32>]) -> serde_json::Value {
    let names = s
        .keys
        .as_ref()
        .filter(|_| !s.keys_are_partitions())
        .map(|k| {
            k.keys()
                .map(|(_, name)| String::from_utf8_lossy(name).into_owned())
                .collect::<Vec<_>>()
        });
    serde_json::json!({
        "epoch": epoch,
        "count": owners.len(),
        "names": names,
        "owners": owners,
    })
}
