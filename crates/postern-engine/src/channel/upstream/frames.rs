//! What a stdio upstream writes, held to the result limit before rmcp reads a byte of it. rmcp
//! would buffer a message of any size up to 16 MiB and then parse it whole (a 15.6 MB answer
//! took the gateway from 36 MB to over 1 GB). [`CappedLines`] passes each newline-framed message
//! through only while it stays within the limit; a longer one is dropped as it streams by, never
//! buffered, and — when it was the answer to one of Postern's requests — replaced by a JSON-RPC
//! error naming the limit ([`TOO_LARGE_CODE`]), so the call it answers ends at once as
//! `result_too_large` instead of waiting for an answer that will not come.

use std::{
    pin::Pin,
    task::{Context, Poll},
};
use tokio::io::{AsyncRead, ReadBuf};

/// The JSON-RPC error code of the answer that replaces one larger than the limit.
pub const TOO_LARGE_CODE: i32 = -32099;
/// The marker in that error's `data` (`{"postern": "result_too_large", "limit": N}`).
pub const TOO_LARGE_MARKER: &str = "result_too_large";

/// A reader of newline-framed JSON-RPC messages that never yields one longer than `limit`.
pub struct CappedLines<R> {
    inner: R,
    limit: usize,
    /// The message being read (at most `limit` bytes).
    line: Vec<u8>,
    /// Reading past the end of a message that was too long: its top-level keys are watched.
    discarding: Option<TopLevel>,
    /// Bytes ready for the reader, from `done` on.
    ready: Vec<u8>,
    done: usize,
    eof: bool,
}

impl<R> CappedLines<R> {
    pub fn new(inner: R, limit: usize) -> Self {
        CappedLines { inner, limit, line: Vec::new(), discarding: None, ready: Vec::new(), done: 0, eof: false }
    }

    /// Takes in `bytes` read from the server; complete messages move to `ready`.
    fn absorb(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let newline = memchr::memchr(b'\n', bytes);
            let (part, rest) = match newline {
                Some(i) => (&bytes[..i], &bytes[i + 1..]),
                None => (bytes, &[][..]),
            };
            if let Some(scan) = &mut self.discarding {
                scan.feed(part);
                if newline.is_some() {
                    let scan = self.discarding.take().unwrap_or_default();
                    if let Some(answer) = scan.replacement(self.limit) {
                        self.ready.extend_from_slice(answer.as_bytes());
                    }
                }
            } else if self.line.len() + part.len() > self.limit {
                let mut scan = TopLevel::default();
                scan.feed(&self.line);
                scan.feed(part);
                self.line = Vec::new();
                if newline.is_some() {
                    if let Some(answer) = scan.replacement(self.limit) {
                        self.ready.extend_from_slice(answer.as_bytes());
                    }
                } else {
                    self.discarding = Some(scan);
                }
            } else {
                self.line.extend_from_slice(part);
                if newline.is_some() {
                    self.ready.append(&mut self.line);
                    self.ready.push(b'\n');
                }
            }
            bytes = rest;
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for CappedLines<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.done < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.done);
                buf.put_slice(&this.ready[this.done..this.done + n]);
                this.done += n;
                if this.done == this.ready.len() {
                    this.ready.clear();
                    this.done = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // The server closed its stdout: a message it had not ended is dropped.
                    this.eof = true;
                    this.line.clear();
                }
                Poll::Ready(Ok(())) => {
                    let filled = read.filled().to_vec();
                    this.absorb(&filled);
                }
            }
        }
    }
}

/// Watches a JSON object stream by, byte by byte, in constant memory: whether it has a top-level
/// `method` (a request or notification of the server's) and the raw text of its top-level `id`.
#[derive(Debug, Default)]
struct TopLevel {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The top-level key being read (only the first few bytes are kept).
    key: Option<Vec<u8>>,
    expect_key: bool,
    /// The last top-level key read, until its value starts.
    last_key: Option<Vec<u8>>,
    /// The top-level `id` value being read (raw JSON text, at most 200 bytes).
    id_text: Option<Vec<u8>>,
    id: Option<Vec<u8>>,
    has_method: bool,
}

impl TopLevel {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        if let Some(id) = &mut self.id_text
            && (self.in_string || !matches!(b, b',' | b'}' | b' ' | b'\t' | b'\r'))
            && self.depth == 1
        {
            if id.len() < 200 {
                id.push(b);
            } else {
                self.id_text = None;
            }
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if let Some(key) = self.key.take() {
                    self.has_method |= key == b"method";
                    self.last_key = Some(key);
                }
                return;
            }
            if let Some(key) = &mut self.key
                && key.len() < 16
            {
                key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.key = Some(Vec::new());
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = true;
                }
            }
            b'}' | b']' => {
                if self.depth == 1 {
                    self.finish_id();
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b',' if self.depth == 1 => {
                self.finish_id();
                self.expect_key = true;
            }
            b':' if self.depth == 1 => {
                let key = self.last_key.take();
                if key.as_deref() == Some(b"id") && self.id.is_none() {
                    self.id_text = Some(Vec::new());
                }
            }
            _ => {}
        }
    }

    fn finish_id(&mut self) {
        if let Some(text) = self.id_text.take() {
            let trimmed: Vec<u8> = text.into_iter().filter(|b| !b.is_ascii_whitespace()).collect();
            if !trimmed.is_empty() {
                self.id = Some(trimmed);
            }
        }
    }

    /// The answer that stands in for a message that was too long: an error response to the
    /// request it answered (none for a server's own request or notification, or without an id).
    fn replacement(&self, limit: usize) -> Option<String> {
        if self.has_method {
            return None;
        }
        let id = std::str::from_utf8(self.id.as_deref()?).ok()?;
        // Only an id Postern could have sent: a number or a plain string.
        let parsed: serde_json::Value = serde_json::from_str(id).ok()?;
        if !(parsed.is_number() || parsed.is_string()) {
            return None;
        }
        Some(format!("{}\n", too_large_answer(&parsed, limit)))
    }
}

/// The JSON-RPC error answer that stands in for one to request `id` larger than `limit` bytes:
/// the same for a stdio server's line and a remote server's body or event.
pub(super) fn too_large_answer(id: &impl serde::Serialize, limit: usize) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": TOO_LARGE_CODE,
            "message": format!("the answer was larger than the limit of {limit} bytes and was not read"),
            "data": { "postern": TOO_LARGE_MARKER, "limit": limit },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokio::io::AsyncReadExt;

    fn read_all(input: &[u8], limit: usize, chunk: usize) -> Vec<u8> {
        let mut capped = CappedLines::new(&b""[..], limit);
        for piece in input.chunks(chunk.max(1)) {
            capped.absorb(piece);
        }
        capped.ready[capped.done..].to_vec()
    }

    #[test]
    fn messages_within_the_limit_pass_and_a_long_answer_becomes_an_error() {
        let small = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n";
        let big = format!("{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{{\"t\":\"{}\"}}}}\n", "x".repeat(5000));
        let late_id =
            format!("{{\"jsonrpc\":\"2.0\",\"result\":{{\"t\":\"{}\",\"id\":9}},\"id\":\"r-2\"}}\n", "y".repeat(5000));
        let notification =
            format!("{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\",\"params\":\"{}\"}}\n", "z".repeat(5000));
        let input = [small.as_slice(), big.as_bytes(), late_id.as_bytes(), notification.as_bytes(), small].concat();
        for chunk in [1, 7, 4096, 100_000] {
            let out = String::from_utf8(read_all(&input, 1000, chunk)).unwrap();
            let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            assert_eq!(lines.len(), 4, "{out}");
            assert_eq!(lines[0]["id"], 1);
            assert_eq!((lines[1]["id"].clone(), lines[1]["error"]["code"].clone()), (7.into(), TOO_LARGE_CODE.into()));
            assert_eq!(lines[1]["error"]["data"]["limit"], 1000);
            assert_eq!(lines[2]["id"], "r-2", "the top-level id, not the one nested in the result");
            assert_eq!(lines[3]["id"], 1, "a server's own message that is too long is dropped");
        }
    }

    #[tokio::test]
    async fn it_reads_as_a_stream() {
        let input = format!("{{\"id\":3,\"result\":\"{}\"}}\n{{\"id\":4}}\n", "a".repeat(300));
        let mut capped = CappedLines::new(input.as_bytes(), 100);
        let mut out = String::new();
        capped.read_to_string(&mut out).await.unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains("\"code\":-32099") && lines[0].contains("\"id\":3"), "{out}");
        assert_eq!(lines[1], "{\"id\":4}");
    }

    proptest! {
        /// Whatever a hostile server writes, in whatever pieces: nothing longer than the limit
        /// comes out, messages within it come out unchanged, and every replacement is valid JSON.
        #[test]
        fn nothing_longer_than_the_limit_comes_out(
            messages in proptest::collection::vec(
                prop_oneof![
                    any::<Vec<u8>>().prop_map(|m| m.into_iter().filter(|b| *b != b'\n').collect::<Vec<u8>>()),
                    (any::<u32>(), "[a-z\"\\\\{}:,]{0,400}")
                        .prop_map(|(id, t)| format!("{{\"id\":{id},\"result\":\"{t}\"}}").into_bytes()),
                ],
                0..8,
            ),
            limit in 1usize..300,
            chunk in 1usize..64,
        ) {
            let input: Vec<u8> = messages.iter().flat_map(|m| m.iter().copied().chain([b'\n'])).collect();
            let out = read_all(&input, limit, chunk);
            for line in out.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let passed = messages.iter().any(|m| m.as_slice() == line && m.len() <= limit);
                let replaced = serde_json::from_slice::<serde_json::Value>(line)
                    .is_ok_and(|v| v["error"]["code"] == TOO_LARGE_CODE);
                prop_assert!(passed || replaced, "{:?}", String::from_utf8_lossy(line));
                prop_assert!(line.len() <= limit || replaced);
            }
        }
    }
}
