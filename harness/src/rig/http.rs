//! A minimal HTTP/1.1 GET for the broker's monitoring endpoints (`/healthz`, `/varz`, `/connz`,
//! `/jsz`). Loopback only, one request per connection, bounded in time and size; it exists so the
//! harness needs no HTTP client crate.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::rig::error::HarnessError;

/// Largest response body accepted.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// A response: status code and decoded body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn json(&self) -> Result<serde_json::Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("body is not JSON: {e}"))
    }
}

/// `GET http://127.0.0.1:<port><path_and_query>` within `bound`.
pub async fn get(
    port: u16,
    path_and_query: &str,
    bound: Duration,
) -> Result<HttpResponse, HarnessError> {
    let url = format!("http://127.0.0.1:{port}{path_and_query}");
    let fail = |message: String| HarnessError::Monitoring {
        url: url.clone(),
        message,
    };
    let raw = tokio::time::timeout(bound, exchange(port, path_and_query))
        .await
        .map_err(|_| {
            fail(format!(
                "no complete answer within {} ms",
                bound.as_millis()
            ))
        })?
        .map_err(|e| fail(e.to_string()))?;
    parse(&raw).map_err(fail)
}

async fn exchange(port: u16, path_and_query: &str) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "GET {path_and_query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(raw);
        }
        raw.extend_from_slice(&chunk[..n]);
        if raw.len() > MAX_RESPONSE_BYTES {
            return Err(std::io::Error::other(format!(
                "response larger than {MAX_RESPONSE_BYTES} bytes"
            )));
        }
    }
}

fn parse(raw: &[u8]) -> Result<HttpResponse, String> {
    let head_end = find(raw, b"\r\n\r\n").ok_or("response has no header terminator")?;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut chunked = false;
    let mut content_length: Option<usize> = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            content_length = value.parse().ok();
        }
    }
    let rest = &raw[head_end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(len) = content_length {
        rest.get(..len)
            .ok_or_else(|| format!("body shorter than Content-Length {len}"))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(HttpResponse { status, body })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n").ok_or("chunk size line not terminated")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("bad chunk size {size_hex:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let data = rest.get(..size).ok_or("chunk shorter than its size")?;
        body.extend_from_slice(data);
        rest = rest.get(size + 2..).ok_or("chunk not terminated")?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length() {
        let r = parse(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}").ok();
        assert_eq!(r.map(|r| (r.status, r.body)), Some((503, b"{}".to_vec())));
    }

    #[test]
    fn parses_chunked() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        let r = parse(raw).ok();
        assert_eq!(r.map(|r| r.body), Some(b"{\"a\":1}".to_vec()));
    }
}
