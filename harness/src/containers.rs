//! PostgreSQL in Docker (testcontainers), when its binaries are not installed and a Docker
//! engine is reachable.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use testcontainers::runners::SyncRunner as _;
use testcontainers::Container;
use testcontainers_modules::postgres::Postgres;

use super::{process, Unavailable};

/// Containers started by this process, removed at exit.
static CONTAINERS: Mutex<Vec<Container<Postgres>>> = Mutex::new(Vec::new());

/// Whether a Docker engine answers where testcontainers will look for it.
pub fn docker_reachable() -> bool {
    match std::env::var("DOCKER_HOST") {
        Ok(host) => match host.split_once("://") {
            Some(("unix", path)) => std::os::unix::net::UnixStream::connect(path).is_ok(),
            Some(("tcp", addr)) => {
                use std::net::ToSocketAddrs as _;
                let addr = addr.trim_end_matches('/');
                addr.to_socket_addrs()
                    .ok()
                    .and_then(|mut a| a.next())
                    .is_some_and(|a| {
                        std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok()
                    })
            }
            _ => false,
        },
        Err(_) => std::os::unix::net::UnixStream::connect("/var/run/docker.sock").is_ok(),
    }
}

/// Starts a PostgreSQL container (trust authentication) and returns its URL.
pub fn start_postgres() -> Result<String, Unavailable> {
    if !docker_reachable() {
        return Err(Unavailable::Missing(
            "no Docker engine reachable for the `containers` feature (DOCKER_HOST or \
             /var/run/docker.sock)"
                .into(),
        ));
    }
    let container = Postgres::default()
        .with_host_auth()
        .start()
        .map_err(|e| Unavailable::Failed(format!("starting a PostgreSQL container: {e}")))?;
    let port = container
        .get_host_port_ipv4(5432)
        .map_err(|e| Unavailable::Failed(format!("PostgreSQL container port: {e}")))?;
    let host = container
        .get_host()
        .map_err(|e| Unavailable::Failed(format!("PostgreSQL container host: {e}")))?;
    let url = format!("postgres://postgres@{host}:{port}/postgres");
    CONTAINERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(container);
    process::at_exit(|| {
        // Dropping a container stops and removes it.
        let all = std::mem::take(&mut *CONTAINERS.lock().unwrap_or_else(PoisonError::into_inner));
        drop(all);
    });
    Ok(url)
}
