//! `headcount status`: a group's slots, leases, view, the ownership of a sample of keys and the
//! owners of the keys asked for with `--key`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use headcount::assign::KeySet;
use headcount::recipes::group::{remove, status_with_keys, GroupStatus, KeyOwner};
use headcount::{DynStore, Error, DEFAULT_PREFIX};

use crate::exit::{emit, CliError};
use crate::timeline::Observer;
use crate::util::{rfc3339, AssignorArg, Shutdown};

/// The arguments of `status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The group to inspect.
    #[arg(long, env = "HEADCOUNT_GROUP")]
    pub group: String,
    /// One JSON object (per refresh with `--watch`) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Re-print every second until SIGINT (or SIGTERM, SIGHUP, SIGQUIT); a store outage is
    /// reported and watched through.
    #[arg(long)]
    pub watch: bool,
    /// How many keys (`0`..`N-1` as decimal strings) to map to slots for the ownership summary.
    #[arg(long, default_value_t = DEFAULT_SAMPLE)]
    pub sample: u64,
    /// The assignor the group's members use, for views that do not name theirs.
    #[arg(long, value_enum, default_value = "jumpback")]
    pub assignor: AssignorArg,
    /// Print this key's owner under the published view (slot, index, member and the view's
    /// epoch); repeat the flag or separate keys with commas. The key is hashed as the members'
    /// `owns(key)` hashes it.
    #[arg(long = "key", value_name = "NAME", value_delimiter = ',')]
    pub keys: Vec<String>,
    /// A file naming the group's declared keys, one per line (empty lines are skipped): the
    /// table's `owns` column then counts them per member. Needed for a group that declares
    /// named keys (`GroupConfig::with_keys`), whose names the store does not hold; a group of
    /// `run --partitions N` is counted without it. Under a hashing assignor, any key set.
    #[arg(long, value_name = "FILE")]
    pub keys_file: Option<PathBuf>,
    /// Serve the group page on this address (`127.0.0.1:8080`; port 0 picks a free one, logged
    /// at start) until a stop signal: `/` (or `/group`) is a live page of the members, the view,
    /// the hand-off, a grid of the partitions by owner and the view changes seen;
    /// `/group/status.json` is the `--json` document. See docs/observability.md.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["json", "watch"])]
    pub serve: Option<String>,
}

impl StatusArgs {
    /// The arguments of the page `run` and `exec` serve beside their metrics: the group's
    /// status with the default sample and no key asked for.
    pub fn for_page(group: &str, assignor: AssignorArg) -> StatusArgs {
        StatusArgs {
            group: group.to_owned(),
            json: true,
            watch: false,
            sample: DEFAULT_SAMPLE,
            assignor,
            keys: Vec::new(),
            keys_file: None,
            serve: None,
        }
    }
}

/// The keys `--sample` maps by default.
const DEFAULT_SAMPLE: u64 = 10_000;

/// The `format` of the `--json` document, versioned with its schema
/// (`docs/status.schema.json`): a field may be added within a version, never removed or
/// changed.
pub const FORMAT: &str = "headcount.status/1";

/// The JSON Schema of the `--json` document.
pub const SCHEMA: &str = include_str!("../../docs/status.schema.json");

/// The arguments of `remove-group`.
#[derive(Debug, clap::Args)]
pub struct RemoveGroupArgs {
    /// The group to remove: every member must have stopped.
    #[arg(long, env = "HEADCOUNT_GROUP")]
    pub group: String,
    /// One JSON object instead of lines of text.
    #[arg(long)]
    pub json: bool,
}

/// Deletes a stopped group's view, settled mark and acknowledgements (see
/// [`headcount::recipes::group::remove`]); refuses, with status 1, while a member is live.
pub async fn remove_group(store: DynStore, args: RemoveGroupArgs) -> Result<ExitCode, CliError> {
    headcount::validate_group(&args.group)?;
    let removed = remove(&store, DEFAULT_PREFIX, &args.group).await?;
    if args.json {
        emit(serde_json::json!({
            "group": args.group,
            "removed": removed.keys,
            "kept": removed.kept,
        }))?;
    } else {
        for key in &removed.keys {
            emit!("removed  {key}")?;
        }
        for key in &removed.kept {
            emit!("kept     {key} (not a record of ours, or written meanwhile)")?;
        }
        emit!(
            "group {}: {} key(s) removed, {} kept",
            args.group,
            removed.keys.len(),
            removed.kept.len()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The most keys `--sample` may map: beyond this the summary costs more than it tells.
const MAX_SAMPLE: u64 = 10_000_000;

/// Checks the arguments before any store is opened, and reads `--keys-file`.
pub fn check(args: &StatusArgs) -> Result<Option<Arc<KeySet>>, Error> {
    if args.sample > MAX_SAMPLE {
        return Err(Error::invalid(format!(
            "--sample {} is above the limit of {MAX_SAMPLE}",
            args.sample
        )));
    }
    headcount::validate_group(&args.group)?;
    let Some(path) = &args.keys_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid(format!("--keys-file {}: {e}", path.display())))?;
    let keys = KeySet::new(
        text.lines()
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .filter(|l| !l.is_empty()),
    )
    .map_err(|e| Error::invalid(format!("--keys-file {}: {e}", path.display())))?;
    Ok(Some(Arc::new(keys)))
}

/// Prints the group's status once, or every second with `--watch`, or serves the group page
/// with `--serve`. Under `--watch` a store error is reported (a line on stdout in the chosen
/// format) and the watch goes on: an outage is what one watches for.
pub async fn status(
    store: DynStore,
    args: StatusArgs,
    declared: Option<Arc<KeySet>>,
) -> Result<ExitCode, CliError> {
    let mut shutdown = Shutdown::new()?;
    if let Some(addr) = args.serve.clone() {
        let page = crate::page::Page::new(store, args, declared, true);
        let local = crate::page::serve(&addr, page).await?;
        emit!("serving the group page at http://{local}/ (the JSON at /group/status.json)")?;
        shutdown.recv().await;
        return Ok(ExitCode::SUCCESS);
    }
    let mut observer = Observer::default();
    loop {
        let now = SystemTime::now();
        match status_with_keys(
            &store,
            DEFAULT_PREFIX,
            &args.group,
            args.assignor.0,
            args.sample,
            declared.clone(),
        )
        .await
        {
            Ok(s) => {
                observer.observe(&s, now, args.sample);
                if args.json {
                    emit(document(&args, &s, now, &observer))?;
                } else {
                    print_table(&args, &s, now)?;
                }
            }
            Err(e) if !args.watch => return Err(e.into()),
            Err(e) if args.json => emit(error_document(&args.group, now, &e))?,
            Err(e) => {
                emit!("group {}  at {}", args.group, rfc3339(now))?;
                emit!("store error: {e} (watching on)")?;
                emit("")?;
            }
        }
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = shutdown.recv() => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// The document of a read that failed: the store's error, and whether trying again may work.
pub fn error_document(group: &str, now: SystemTime, e: &Error) -> serde_json::Value {
    serde_json::json!({
        "format": FORMAT,
        "group": group,
        "at": rfc3339(now),
        "error": e.to_string(),
        "retryable": e.is_retryable(),
    })
}

pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn owned(s: &GroupStatus, slot: u32) -> Option<u64> {
    s.sample_owned
        .iter()
        .find(|(sl, _)| *sl == slot)
        .map(|&(_, n)| n)
}

/// How many keys the group declares, when they are counted per member: the set given or rebuilt,
/// or the count a sticky view's stored owners cover.
fn declared_count(s: &GroupStatus) -> Option<usize> {
    match (&s.keys, s.assignor.declared()) {
        (Some(keys), _) => Some(keys.len()),
        (None, Some(id)) if !s.keys_owned.is_empty() => Some(id.count as usize),
        _ => None,
    }
}

fn keys_owned(s: &GroupStatus, slot: u32) -> Option<u64> {
    s.keys_owned
        .iter()
        .find(|(sl, _)| *sl == slot)
        .map(|&(_, n)| n)
}

/// Why keys cannot be mapped, with what to do about it.
fn unmapped(args: &StatusArgs, s: &GroupStatus) -> Option<String> {
    s.unmapped.as_ref().map(|e| match &args.keys_file {
        Some(path) => format!("{e}: {} names another set", path.display()),
        None => format!("{e}: give the group's declared keys with --keys-file FILE, one per line"),
    })
}

/// What a member is doing, as the store shows it: `active` (in the published view, which it
/// acknowledged), `handoff` (in the view, not acknowledged yet: it holds up the hand-off),
/// `joining` (live, not in the view yet), `parked` (away for a restart, its place kept) or
/// `handed` (its place handed to a standby, which takes it over).
fn phase(s: &GroupStatus, slot: u32, holding_up: &[u32]) -> &'static str {
    let Some(r) = s.table.slots.get(&slot) else {
        return "gone";
    };
    let in_view = s
        .table
        .view
        .as_ref()
        .is_some_and(|v| v.holders.contains(&r.holder(slot)));
    let heir = s
        .standbys
        .iter()
        .any(|b| b.heir_of == Some(slot) && b.member == r.member);
    match (r.parked, heir, in_view) {
        (Some(_), true, _) => "handed",
        (Some(_), false, _) => "parked",
        (None, _, false) => "joining",
        (None, _, true) if holding_up.binary_search(&slot).is_ok() => "handoff",
        (None, _, true) => "active",
    }
}

/// The `--json` document (and the group page's `/group/status.json`): see
/// `docs/status.schema.json` and docs/observability.md.
pub fn document(
    args: &StatusArgs,
    s: &GroupStatus,
    now: SystemTime,
    observer: &Observer,
) -> serde_json::Value {
    let now_ms = unix_ms(now);
    let holding_up = s.holding_up();
    let view_slots: Vec<u32> = s
        .table
        .view
        .as_ref()
        .map(|v| v.slots().collect())
        .unwrap_or_default();
    let members: Vec<serde_json::Value> = s
        .table
        .slots
        .iter()
        .map(|(&slot, r)| {
            let in_view = s
                .table
                .view
                .as_ref()
                .is_some_and(|v| v.holders.contains(&r.holder(slot)));
            serde_json::json!({
                "slot": slot,
                "index": view_slots.binary_search(&slot).ok().filter(|_| in_view).map(|i| i + 1),
                "member": r.member,
                "nonce": format!("{:016x}", r.nonce),
                "phase": phase(s, slot, &holding_up),
                "since": rfc3339(UNIX_EPOCH + Duration::from_millis(r.since_ms)),
                "age_ms": now_ms.saturating_sub(r.since_ms),
                "ttl_ms": r.ttl_ms,
                // As the store counts it (the slot key's remaining TTL, less any crash grace);
                // null for a parked claim or a store that cannot read TTLs.
                "lease_left_ms": s.lease_left(slot).map(|d| d.as_millis() as u64),
                "record_left_ms": s.record_left.get(&slot).map(|d| d.as_millis() as u64),
                "acked": s.acked(slot),
                "in_view": in_view,
                "holds_up": holding_up.binary_search(&slot).is_ok(),
                // Away for a restart (static membership): since when, or null.
                "parked": r.parked.map(|ms| rfc3339(UNIX_EPOCH + Duration::from_millis(ms))),
                "sample_owned": owned(s, slot),
                "keys_owned": keys_owned(s, slot),
            })
        })
        .collect();
    let foreign: Vec<serde_json::Value> = s
        .table
        .foreign
        .iter()
        .map(|(slot, value)| serde_json::json!({"slot": slot, "value": value}))
        .collect();
    let view = s.table.view.as_ref().map(|v| {
        serde_json::json!({
            "epoch": v.epoch,
            "slots": view_slots,
        })
    });
    let handoff = s.table.view.as_ref().filter(|_| !s.view_settled).map(|v| {
        let since = observer.first_seen(v.epoch);
        serde_json::json!({
            "epoch": v.epoch,
            "waiting_on": holding_up.iter().map(|slot| serde_json::json!({
                "slot": slot,
                "member": s.table.slots.get(slot).map(|r| r.member.clone()),
            })).collect::<Vec<_>>(),
            "since": since.map(rfc3339),
            "for_ms": since.map(|t| now.duration_since(t).unwrap_or_default().as_millis() as u64),
        })
    });
    let timeline: Vec<serde_json::Value> = observer
        .seen()
        .map(|c| {
            serde_json::json!({
                "epoch": c.epoch,
                "at": rfc3339(c.at),
                "slots": c.slots,
                "joined": c.joined,
                "left": c.left,
                "moved": c.moved,
                "keys": c.keys,
                "settled_after_ms": c.settled_after_ms,
                "first": c.first,
            })
        })
        .collect();
    serde_json::json!({
        "format": FORMAT,
        "group": args.group,
        "at": rfc3339(now),
        "assignor": s.assignor.to_string(),
        "members": members,
        "foreign": foreign,
        "view": view,
        "view_text": if s.table.view.is_none() { s.table.view_text.clone() } else { None },
        "view_current": s.view_current,
        "settled": s.table.settled.map(|m| m.epoch),
        "view_settled": s.view_settled,
        "handoff": handoff,
        "sample": args.sample,
        "sample_owned": s.sample_owned.iter().map(|&(slot, n)| serde_json::json!({"slot": slot, "keys": n})).collect::<Vec<_>>(),
        "unlisted": s.unlisted,
        "keys": args.keys.iter().map(|k| key_json(k, s)).collect::<Vec<_>>(),
        // The declared key set counted per member (`--keys-file`, a group's partitions, or the
        // owners a sticky view stores).
        "declared_keys": declared_count(s),
        "keys_owned": s.keys_owned.iter().map(|&(slot, n)| serde_json::json!({"slot": slot, "keys": n})).collect::<Vec<_>>(),
        "unmapped": unmapped(args, s),
        // New members standing by for a leaving member's place (`--standby-for`), oldest first.
        "standbys": s.standbys.iter().map(|b| serde_json::json!({
            "member": b.member,
            "since": rfc3339(UNIX_EPOCH + Duration::from_millis(b.since_ms)),
            "heir_of": b.heir_of,
        })).collect::<Vec<_>>(),
        "problems": s.problems.iter().map(|p| serde_json::json!({
            "key": p.key,
            "kind": p.kind,
            "found": p.found,
            "fix": p.fix,
        })).collect::<Vec<_>>(),
        "timeline": timeline,
    })
}

/// The owner of `key` under the published view, or the error that kept it from being mapped.
fn key_owner(s: &GroupStatus, key: &str) -> Result<Option<KeyOwner>, String> {
    s.key_owner(key).map_err(|e| e.to_string())
}

/// The owner of one key, as `--json` lists it under `keys` and the page's `/group/key` answers.
pub fn key_json(key: &str, s: &GroupStatus) -> serde_json::Value {
    match key_owner(s, key) {
        Ok(Some(o)) => serde_json::json!({
            "key": key,
            "slot": o.slot,
            "index": o.index,
            "replicas": o.replicas,
            "member": o.member,
            "view_epoch": o.view_epoch,
        }),
        Ok(None) => serde_json::json!({"key": key, "slot": null, "member": null}),
        Err(e) => serde_json::json!({"key": key, "slot": null, "member": null, "error": e}),
    }
}

fn print_keys(args: &StatusArgs, s: &GroupStatus) -> Result<(), CliError> {
    if args.keys.is_empty() {
        return Ok(());
    }
    emit("")?;
    let width = args.keys.iter().map(String::len).max().unwrap_or(3).max(3);
    emit!(
        "{:<width$}  {:>4}  {:>7}  {:<16}  {:>10}",
        "key",
        "slot",
        "index",
        "member",
        "view epoch"
    )?;
    for key in &args.keys {
        match key_owner(s, key) {
            Ok(Some(o)) => emit!(
                "{:<width$}  {:>4}  {:>7}  {:<16}  {:>10}",
                key,
                o.slot,
                format!("{}/{}", o.index, o.replicas),
                o.member.as_deref().unwrap_or("- (slot gone)"),
                o.view_epoch
            )?,
            Ok(None) => emit!("{key:<width$}  no owner: no view with live slots is published")?,
            Err(e) => emit!("{key:<width$}  cannot map: {e}")?,
        }
    }
    emit!(
        "view epoch: a grant of the key under this view carries a token of at most this epoch \
         (the epoch since which its owner has held the key without a break, which only the owner knows)"
    )
}

fn print_table(args: &StatusArgs, s: &GroupStatus, now: SystemTime) -> Result<(), CliError> {
    let now_ms = unix_ms(now);
    let view = match (&s.table.view, &s.table.view_text) {
        (Some(v), _) => format!(
            "epoch {} over slots {:?} ({})",
            v.epoch,
            v.slots().collect::<Vec<u32>>(),
            if s.view_current {
                "matches the live slots"
            } else {
                "does NOT match the live slots yet"
            }
        ),
        (None, Some(text)) => format!("unreadable: {text:?}"),
        (None, None) => "none published".to_owned(),
    };
    emit!("group {}  at {}", args.group, rfc3339(now))?;
    emit!("view  {view}")?;
    match s.table.settled {
        Some(m) => emit!(
            "settled  epoch {} (every live member acknowledged it)",
            m.epoch
        )?,
        None => emit!("settled  none yet")?,
    }
    for p in &s.problems {
        match p.kind {
            "unlisted" => emit!("problem  {}: unlisted: {}", p.key, p.fix)?,
            kind => emit!("problem  {}: {kind} {:?}: {}", p.key, p.found, p.fix)?,
        }
    }
    emit("")?;
    if s.table.slots.is_empty() {
        emit!("no live members")?;
    } else {
        let width = s
            .table
            .slots
            .values()
            .map(|r| r.member.len())
            .max()
            .unwrap_or(6)
            .max(6);
        emit!(
            "{:>4}  {:<width$}  {:<16}  {:<24}  {:>9}  {:>8}  {:>10}  {:>6}  {:>10}",
            "slot",
            "member",
            "nonce",
            "since",
            "age",
            "ttl",
            "lease left",
            "acked",
            "owns"
        )?;
        for (&slot, r) in &s.table.slots {
            let owns = match (declared_count(s), keys_owned(s, slot), owned(s, slot)) {
                (Some(declared), Some(n), _) => format!("{n} of {declared}"),
                (None, _, Some(n)) if args.sample > 0 => {
                    format!("{n} ({:.1}%)", n as f64 * 100.0 / args.sample as f64)
                }
                (None, _, Some(n)) => n.to_string(),
                _ => "-".to_owned(),
            };
            let lease_left = match s.lease_left(slot) {
                Some(d) => format!("{}ms", d.as_millis()),
                None => "-".to_owned(),
            };
            emit!(
                "{:>4}  {:<width$}  {:016x}  {:<24}  {:>8.1}s  {:>6}ms  {:>10}  {:>6}  {:>10}",
                slot,
                r.member,
                r.nonce,
                rfc3339(UNIX_EPOCH + Duration::from_millis(r.since_ms)),
                now_ms.saturating_sub(r.since_ms) as f64 / 1000.0,
                r.ttl_ms,
                lease_left,
                s.acked(slot).unwrap_or(r.acked),
                owns
            )?;
            let heir = s
                .standbys
                .iter()
                .any(|b| b.heir_of == Some(slot) && b.member == r.member);
            match r.parked {
                Some(ms) if heir => emit!(
                    "      handed to the standby {} at {}: it takes the slot over",
                    r.member,
                    rfc3339(UNIX_EPOCH + Duration::from_millis(ms))
                )?,
                Some(ms) => emit!(
                    "      away for a restart since {}: its place is kept for the same member id",
                    rfc3339(UNIX_EPOCH + Duration::from_millis(ms))
                )?,
                None => {}
            }
        }
    }
    for b in &s.standbys {
        let heir = match b.heir_of {
            Some(slot) => format!(": taking over slot {slot}"),
            None => String::new(),
        };
        emit!(
            "standby  {} since {}{heir}",
            b.member,
            rfc3339(UNIX_EPOCH + Duration::from_millis(b.since_ms))
        )?;
    }
    match (declared_count(s), unmapped(args, s)) {
        (Some(declared), Some(why)) => emit!(
            "owns: of the {declared} declared keys under the published view ({} assignor, counted from the owners it stores); names cannot be looked up: {why}",
            s.assignor
        )?,
        (None, Some(why)) => emit!("owns: cannot map keys: {why}")?,
        (Some(declared), None) => emit!(
            "owns: of the {declared} declared keys under the published view ({} assignor)",
            s.assignor
        )?,
        (None, None) => emit!(
            "owns: of {} sample keys under the published view ({} assignor)",
            args.sample,
            s.assignor
        )?,
    }
    print_keys(args, s)
}
