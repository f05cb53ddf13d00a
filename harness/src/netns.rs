//! A virtual network of Linux network namespaces for the partition tests: every member process
//! and every store server that must be cut from its peers runs in a namespace of its own, a
//! *host*, joined to one *router* namespace by a veth pair; the test process reaches the hosts
//! through one more veth pair from its own namespace, and is itself the host of the proxies and
//! of the servers nothing needs to cut apart.
//!
//! ```text
//!   host m1 (10.N.1.2) ─┐
//!   host m2 (10.N.2.2) ─┼─ router (forwards; nftables rules drop what is cut) ─ test process (10.N.0.1)
//!   host e1 (10.N.3.2) ─┘
//! ```
//!
//! Faults are real packets dropped by the kernel: [`Net::drop_between`] cuts the traffic between
//! two endpoints (both directions, or one), optionally one TCP port; [`Net::lose_between`] drops
//! a share of the packets at random (TCP then retransmits, as on a lossy link); [`Net::link`]
//! takes a host's link down. Delay and jitter, which this kernel's `tc` may not offer (no
//! `netem`), are the proxy's ([`super::Proxy::set_delay`]).
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables). [`Net::new`] says what is missing as
//! [`Unavailable::Missing`], so a test skips loudly, or fails under `HEADCOUNT_REQUIRE_BACKENDS`.
//! Dropping the [`Net`] stops the servers started in it and deletes every namespace it made
//! (veth pairs and rules go with them); namespaces left by a test process killed outright are
//! deleted by the next [`Net::new`].

// `unsafe` is needed for setns(2) in the child between fork and exec (`pre_exec`): std has no
// API to start a process in another network namespace.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write as _};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::process::{self, RunAs, ServerProcess};
use super::Unavailable;

/// Where `ip netns add` puts its namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Every namespace this module makes is named `hcnet<pid>x<net>-<host>`.
const NS_PREFIX: &str = "hcnet";

/// One host of a [`Net`]: a namespace with one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The name it was given, for messages.
    pub name: String,
    ns: String,
    index: u8,
    /// Its address on the virtual network.
    pub ip: Ipv4Addr,
}

/// One end of a fault: an address, and optionally one TCP port at that address (a server's or
/// a proxy's listening port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The address.
    pub ip: Ipv4Addr,
    /// The listening port, when only the connections to it are meant.
    pub port: Option<u16>,
}

impl Endpoint {
    /// Every packet of an address.
    pub fn host(ip: Ipv4Addr) -> Endpoint {
        Endpoint { ip, port: None }
    }

    /// The connections to one listening port.
    pub fn port(ip: Ipv4Addr, port: u16) -> Endpoint {
        Endpoint {
            ip,
            port: Some(port),
        }
    }
}

/// A fault in place, removed by [`Net::remove`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule(u64);

#[derive(Debug, Default)]
struct Rules {
    next: u64,
    lines: BTreeMap<u64, Vec<String>>,
}

/// A virtual network of namespaces (see the module docs). Deleted when dropped.
#[derive(Debug)]
pub struct Net {
    /// `hcnet<pid>x<hex>`: the prefix of every namespace of this net.
    name: String,
    /// The second octet of the net's `10.N.0.0/16`.
    octet: u8,
    router: String,
    hosts: Mutex<Vec<Host>>,
    rules: Mutex<Rules>,
    servers: Mutex<Vec<Arc<ServerProcess>>>,
}

impl Net {
    /// Makes the router namespace and the link to it from this process's namespace.
    pub fn new() -> Result<Net, Unavailable> {
        if !process::is_root() {
            return Err(Unavailable::Missing(
                "network namespaces need root (run the tests as root)".into(),
            ));
        }
        for (bin, package) in [("ip", "iproute2"), ("nft", "nftables")] {
            if run_ok(Command::new(bin).arg("-V")).is_err() {
                return Err(Unavailable::Missing(format!(
                    "`{bin}` is not installed (apt-get install {package})"
                )));
            }
        }
        sweep_stale();
        let failed = |e: io::Error| Unavailable::Failed(format!("making a network namespace: {e}"));
        let octet = free_octet().map_err(failed)?;
        let name = format!(
            "{NS_PREFIX}{}x{:04x}",
            std::process::id(),
            rand::random::<u16>()
        );
        let net = Net {
            router: format!("{name}-router"),
            name,
            octet,
            hosts: Mutex::default(),
            rules: Mutex::default(),
            servers: Mutex::default(),
        };
        net.make_router().map_err(failed)?;
        Ok(net)
    }

    fn make_router(&self) -> io::Result<()> {
        let r = &self.router;
        ip(&["netns", "add", r])?;
        ip(&["-n", r, "link", "set", "lo", "up"])?;
        // The pair to this process's namespace; named after the net, unique in ours.
        let outside = self.outside_link();
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", "up0", "netns", r,
        ])?;
        let n = self.octet;
        ip(&["addr", "add", &format!("10.{n}.0.1/24"), "dev", &outside])?;
        ip(&["link", "set", &outside, "up"])?;
        ip(&[
            "-n",
            r,
            "addr",
            "add",
            &format!("10.{n}.0.2/24"),
            "dev",
            "up0",
        ])?;
        ip(&["-n", r, "link", "set", "up0", "up"])?;
        ip(&[
            "route",
            "add",
            &format!("10.{n}.0.0/16"),
            "via",
            &format!("10.{n}.0.2"),
        ])?;
        run_ok(
            Command::new("ip")
                .args(["netns", "exec", r, "sysctl", "-qw"])
                .arg("net.ipv4.ip_forward=1"),
        )?;
        self.nft(
            "add table inet hc\n\
             add chain inet hc cuts { type filter hook forward priority 0; policy accept; }\n",
        )
    }

    fn outside_link(&self) -> String {
        // Interface names are at most 15 bytes: the net's random part and its octet.
        format!("hc{}n{}", &self.name[self.name.len() - 4..], self.octet)
    }

    /// The address of this process (the test) on the net: where proxies listen for the hosts.
    pub fn harness_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet, 0, 1)
    }

    /// Adds a host named `name` (letters and digits, for messages and the namespace's name).
    pub fn host(&self, name: &str) -> io::Result<Host> {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) || name.len() > 16 {
            return Err(io::Error::other(format!(
                "host name {name:?}: 1-16 letters and digits"
            )));
        }
        let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        let index = u8::try_from(hosts.len() + 1)
            .ok()
            .filter(|i| *i < 250)
            .ok_or_else(|| io::Error::other("too many hosts on one net"))?;
        let ns = format!("{}-{name}", self.name);
        let host = Host {
            name: name.to_owned(),
            ns,
            index,
            ip: Ipv4Addr::new(10, self.octet, index, 2),
        };
        let (r, n, h) = (&self.router, self.octet, &host.ns);
        ip(&["netns", "add", h])?;
        hosts.push(host.clone());
        let link = format!("h{index}");
        ip(&["-n", h, "link", "set", "lo", "up"])?;
        ip(&[
            "-n", r, "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", h,
        ])?;
        ip(&[
            "-n",
            r,
            "addr",
            "add",
            &format!("10.{n}.{index}.1/24"),
            "dev",
            &link,
        ])?;
        ip(&["-n", r, "link", "set", &link, "up"])?;
        ip(&[
            "-n",
            h,
            "addr",
            "add",
            &format!("{}/24", host.ip),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", h, "link", "set", "eth0", "up"])?;
        ip(&[
            "-n",
            h,
            "route",
            "add",
            "default",
            "via",
            &format!("10.{n}.{index}.1"),
        ])?;
        Ok(host)
    }

    /// Takes `host`'s link down (nothing reaches it, it reaches nothing) or brings it back up.
    pub fn link(&self, host: &Host, up: bool) -> io::Result<()> {
        let link = format!("h{}", host.index);
        ip(&[
            "-n",
            &self.router,
            "link",
            "set",
            &link,
            if up { "up" } else { "down" },
        ])
    }

    /// Drops the packets from `a` to `b`, and from `b` to `a` unless `one_way`: a partition
    /// between them. A port on either end narrows it to the connections to that port.
    pub fn drop_between(&self, a: Endpoint, b: Endpoint, one_way: bool) -> io::Result<Rule> {
        let mut lines = vec![format!("add rule inet hc cuts {} drop", matcher(a, b))];
        if !one_way {
            lines.push(format!("add rule inet hc cuts {} drop", matcher(b, a)));
        }
        self.add(lines)
    }

    /// Drops `percent` % of the packets between `a` and `b` (both ways), at random.
    pub fn lose_between(&self, a: Endpoint, b: Endpoint, percent: u8) -> io::Result<Rule> {
        let p = percent.min(100);
        self.add(
            [matcher(a, b), matcher(b, a)]
                .into_iter()
                .map(|m| format!("add rule inet hc cuts {m} numgen random mod 100 < {p} drop"))
                .collect(),
        )
    }

    /// Removes a fault; removing one already gone is a no-op.
    pub fn remove(&self, rule: Rule) -> io::Result<()> {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        if rules.lines.remove(&rule.0).is_some() {
            self.apply(&rules)?;
        }
        Ok(())
    }

    /// Removes every fault made with rules (links taken down stay down).
    pub fn heal_all(&self) -> io::Result<()> {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        rules.lines.clear();
        self.apply(&rules)
    }

    fn add(&self, lines: Vec<String>) -> io::Result<Rule> {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        rules.next += 1;
        let id = rules.next;
        rules.lines.insert(id, lines);
        if let Err(e) = self.apply(&rules) {
            rules.lines.remove(&id);
            return Err(e);
        }
        Ok(Rule(id))
    }

    /// Replaces the router's rules with `rules` in one transaction.
    fn apply(&self, rules: &Rules) -> io::Result<()> {
        let mut script = String::from("flush chain inet hc cuts\n");
        for line in rules.lines.values().flatten() {
            script.push_str(line);
            script.push('\n');
        }
        self.nft(&script)
    }

    fn nft(&self, script: &str) -> io::Result<()> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.router, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "nft: {}\n{script}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// Makes `command` start inside `host`; the returned file must stay open until it is
    /// spawned.
    fn enter(host: &Host, command: &mut Command) -> io::Result<File> {
        let ns = File::open(Path::new(NETNS_DIR).join(&host.ns))?;
        let fd = ns.as_raw_fd();
        // SAFETY: setns is async-signal-safe and allocates nothing; the caller keeps `fd` open
        // until the child is spawned.
        unsafe {
            command.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(ns)
    }

    /// Spawns `command` inside `host` (through the harness's spawner, so it dies with this
    /// process), optionally as another user.
    pub fn spawn(
        &self,
        host: &Host,
        mut command: Command,
        run_as: Option<RunAs>,
    ) -> io::Result<Child> {
        let ns = Self::enter(host, &mut command)?;
        let child = process::spawn(command, run_as);
        drop(ns);
        child
    }

    /// Starts a server inside `host`, its output appended to `log`; it is stopped when the net
    /// is dropped (or at exit).
    pub fn spawn_server(
        &self,
        host: &Host,
        mut command: Command,
        log: &Path,
        run_as: Option<RunAs>,
        stop_signal: libc::c_int,
    ) -> io::Result<Arc<ServerProcess>> {
        let server = ServerProcess::new(stop_signal);
        let ns = Self::enter(host, &mut command)?;
        let spawned = server.spawn_logged(command, log, run_as);
        drop(ns);
        spawned?;
        self.servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(server.clone());
        Ok(server)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let servers =
            std::mem::take(&mut *self.servers.lock().unwrap_or_else(PoisonError::into_inner));
        for s in servers {
            s.stop(Duration::from_secs(5));
        }
        let hosts = std::mem::take(&mut *self.hosts.lock().unwrap_or_else(PoisonError::into_inner));
        for h in hosts {
            let _ = ip(&["netns", "del", &h.ns]);
        }
        // The outside link is the router's peer: it goes with the router's namespace.
        let _ = ip(&["netns", "del", &self.router]);
    }
}

/// The nftables match of the packets from `a` to `b`.
fn matcher(a: Endpoint, b: Endpoint) -> String {
    let mut m = format!("ip saddr {} ip daddr {}", a.ip, b.ip);
    match (a.port, b.port) {
        (Some(pa), Some(pb)) => m.push_str(&format!(" tcp sport {pa} tcp dport {pb}")),
        (Some(pa), None) => m.push_str(&format!(" tcp sport {pa}")),
        (None, Some(pb)) => m.push_str(&format!(" tcp dport {pb}")),
        (None, None) => {}
    }
    m
}

fn ip(args: &[&str]) -> io::Result<()> {
    run_ok(Command::new("ip").args(args))
}

fn run_ok(command: &mut Command) -> io::Result<()> {
    let out = command.stdin(Stdio::null()).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// A second octet for `10.N.0.0/16` that no address or route of this namespace uses.
fn free_octet() -> io::Result<u8> {
    let used = String::from_utf8_lossy(&Command::new("ip").args(["-4", "addr"]).output()?.stdout)
        .into_owned()
        + &String::from_utf8_lossy(&Command::new("ip").args(["-4", "route"]).output()?.stdout);
    for _ in 0..64 {
        let n = 64 + rand::random::<u8>() % 190;
        if !used.contains(&format!("10.{n}.")) {
            return Ok(n);
        }
    }
    Err(io::Error::other("no free 10.N.0.0/16 for a test network"))
}

/// Deletes the namespaces of test processes that are gone.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(NS_PREFIX)) else {
            continue;
        };
        let Some(Ok(pid)) = rest.split('x').next().map(str::parse::<libc::pid_t>) else {
            continue;
        };
        if pid > 0 && process::proc_stat(pid).is_none() {
            if let Some(n) = name.to_str() {
                let _ = ip(&["netns", "del", n]);
            }
        }
    }
}
