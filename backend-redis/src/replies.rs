//! Reading the replies of the scripts: written or not, foreign values, listings.

use headcount_core::{Error, Result};
use redis::Value;

use crate::errors::BACKEND;

/// The reply of a script that returns `1`, `0` or `{'foreign', what}`.
pub(crate) fn written_or_foreign(key: &str, expected: &'static str, reply: Value) -> Result<bool> {
    match reply {
        Value::Int(n) => Ok(n == 1),
        Value::Array(items) => Err(foreign_reply(key, expected, &items)),
        other => Err(unexpected(other)),
    }
}

pub(crate) fn foreign_reply(key: &str, expected: &'static str, items: &[Value]) -> Error {
    let found = items.get(1).map(text).unwrap_or_default();
    Error::foreign(key, expected, &found)
}

pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

pub(crate) fn unexpected(v: Value) -> Error {
    Error::Rejected {
        backend: BACKEND,
        message: format!("unexpected reply from the server: {v:?}"),
        source: None,
    }
}

/// Parses the reply of the list script into sorted pairs.
pub(crate) fn list_reply(reply: Value) -> Result<Vec<(String, String)>> {
    let Value::Array(items) = reply else {
        return Err(unexpected(reply));
    };
    let mut pairs = Vec::with_capacity(items.len() / 2);
    let mut rest = items.into_iter();
    match rest.next() {
        Some(Value::BulkString(s)) if s == b"ok" => {}
        Some(Value::BulkString(s)) if s == b"foreign" => {
            let key = rest.next().map(|v| text(&v)).unwrap_or_default();
            return Err(Error::foreign(
                &key,
                "a string (the key holds another Redis type)",
                &rest.next().map(|v| text(&v)).unwrap_or_default(),
            ));
        }
        other => return Err(unexpected(other.unwrap_or(Value::Nil))),
    }
    while let (Some(k), Some(v)) = (rest.next(), rest.next()) {
        let (Value::BulkString(k), Value::BulkString(v)) = (k, v) else {
            return Err(Error::Rejected {
                backend: BACKEND,
                message: "unexpected reply from the list script".into(),
                source: None,
            });
        };
        let key = String::from_utf8(k).map_err(|e| {
            Error::foreign(
                &String::from_utf8_lossy(e.as_bytes()),
                "a UTF-8 key",
                "bytes that are not UTF-8",
            )
        })?;
        let value = String::from_utf8(v)
            .map_err(|_| Error::foreign(&key, "a UTF-8 value", "bytes that are not UTF-8"))?;
        pairs.push((key, value));
    }
    // The index answers in key order already; sorting keeps the contract whatever the reply.
    pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(pairs)
}

/// Parses the reply of the list-with-TTL script, `{listing, ttls}` (one `PTTL` per listed key,
/// in the listing's order; -1 for a key without a TTL), or the listing script's own error
/// replies.
pub(crate) fn list_with_ttl_reply(
    reply: Value,
) -> Result<Vec<(String, String, Option<std::time::Duration>)>> {
    let Value::Array(mut items) = reply else {
        return Err(unexpected(reply));
    };
    if items.len() != 2 || !matches!(items[0], Value::Array(_)) {
        // `{'foreign', key, type}`: the listing's own answer.
        return list_reply(Value::Array(items)).map(|_| Vec::new());
    }
    let (Some(Value::Array(ttls)), Some(Value::Array(listing))) = (items.pop(), items.pop()) else {
        return Err(Error::Rejected {
            backend: BACKEND,
            message: "unexpected reply from the list_with_ttl script".into(),
            source: None,
        });
    };
    let names: Vec<String> = listing.iter().skip(1).step_by(2).map(text).collect();
    let left: std::collections::HashMap<String, Option<std::time::Duration>> = names
        .into_iter()
        .zip(ttls.iter().map(|t| match t {
            Value::Int(ms) if *ms >= 0 => Some(std::time::Duration::from_millis(*ms as u64)),
            _ => None,
        }))
        .collect();
    Ok(list_reply(Value::Array(listing))?
        .into_iter()
        .map(|(k, v)| {
            let ttl = left.get(&k).copied().flatten();
            (k, v, ttl)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn list_replies_are_sorted_and_checked() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![b("ok"), b("k2"), b("2"), b("k1"), b("1")]);
        assert_eq!(
            list_reply(reply).unwrap(),
            vec![("k1".into(), "1".into()), ("k2".into(), "2".into())]
        );
        let foreign = Value::Array(vec![b("foreign"), b("k"), b("a Redis list")]);
        assert!(matches!(
            list_reply(foreign),
            Err(Error::ForeignValue { .. })
        ));
    }
}
