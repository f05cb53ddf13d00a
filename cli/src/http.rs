//! The little HTTP/1.x the CLI's endpoints speak (`/metrics`, the group page): one request per
//! connection, read to its blank line, one answer, then close.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most a request head may take; longer ones are cut there.
const MAX_HEAD: usize = 8192;

/// A request's method, path and query string (without the `?`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `HEAD`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string, empty when none.
    pub query: String,
}

impl Request {
    /// The value of `name` in the query, percent-decoded (`+` is a space).
    pub fn param(&self, name: &str) -> Option<String> {
        self.query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k) == name).then(|| decode(v))
        })
    }
}

/// An answer: status line, content type and body.
#[derive(Debug, Clone)]
pub struct Response {
    /// `200 OK`, `404 Not Found`, ...
    pub status: &'static str,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Body,
}

/// A response's body.
#[derive(Debug, Clone)]
pub enum Body {
    /// Made for this answer.
    Text(String),
    /// Shared with other answers (a document rebuilt only when it changes).
    Shared(Arc<Vec<u8>>),
    /// Built into the binary.
    Static(&'static str),
}

impl Body {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Body::Text(t) => t.as_bytes(),
            Body::Shared(b) => b,
            Body::Static(s) => s.as_bytes(),
        }
    }
}

impl Response {
    /// A plain-text answer.
    pub fn text(status: &'static str, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: Body::Text(body.into()),
        }
    }
}

/// Reads a request head; `None` when the client closed before sending a request line.
pub async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r' || b == b'\n').next();
    let line = String::from_utf8_lossy(line.unwrap_or_default());
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Ok(None);
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Some(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        query: query.to_owned(),
    }))
}

/// Writes `response` (its head only for `HEAD`) and closes the connection.
pub async fn write_response(
    stream: &mut TcpStream,
    method: &str,
    response: &Response,
) -> std::io::Result<()> {
    let body = response.body.as_bytes();
    // A page may load nothing from anywhere else: the browser refuses it, should a change of
    // the page ever try (a CDN script, a web font).
    let policy = if response.content_type.starts_with("text/html") {
        "Content-Security-Policy: default-src 'self'; script-src 'unsafe-inline'; \
         style-src 'unsafe-inline'; img-src 'self' data:\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{policy}Connection: close\r\n\r\n",
        response.status,
        response.content_type,
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        stream.write_all(body).await?;
    }
    stream.shutdown().await
}

/// Percent-decoding of a query component; `+` is a space, a bad escape is kept as it is.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_percent_decoded() {
        let r = Request {
            method: "GET".into(),
            path: "/group/key".into(),
            query: "name=order%2D42+x&other=%zz%4".into(),
        };
        assert_eq!(r.param("name").as_deref(), Some("order-42 x"));
        assert_eq!(r.param("other").as_deref(), Some("%zz%4"));
        assert_eq!(r.param("missing"), None);
    }
}
