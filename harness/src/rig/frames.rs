//! The NATS client protocol's framing, as a byte stream crosses the harness proxy
//! (`proxy.rs`): which bytes are a frame's head line (`PUB <subject> [reply] <size>`,
//! `MSG <subject> <sid> [reply] <size>`, `INFO {…}`, `PING`…) and which are its payload, so the
//! proxy can tell a client's request from the broker's reply to it and hold one frame while the
//! frames after it keep flowing (a slow JetStream API answer, which a real broker gives).
//!
//! Why a parser of its own: the proxy sees chunks, not frames; a head line may straddle two
//! chunks, and a payload may hold any byte. The framer is a state machine over the stream from
//! the connection's first byte. A stream it cannot read as the protocol (TLS after the `INFO`,
//! an unknown operation, a head line past [`LINE_MAX_BYTES`]) makes it *lost*: every byte from
//! there on is passed through raw, so a stream it does not understand is carried as before.

/// Longest head line the framer keeps while waiting for its end; past it the stream is lost.
pub const LINE_MAX_BYTES: usize = 64 * 1024;

/// Which way the stream runs (the operations each side may send differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to broker: `CONNECT`, `PUB`, `HPUB`, `SUB`, `UNSUB`, `PING`, `PONG`.
    ToBroker,
    /// Broker to client: `INFO`, `MSG`, `HMSG`, `PING`, `PONG`, `+OK`, `-ERR`.
    ToClient,
}

impl Direction {
    fn ops(self) -> &'static [&'static str] {
        match self {
            Direction::ToBroker => &["CONNECT", "PUB", "HPUB", "SUB", "UNSUB", "PING", "PONG"],
            Direction::ToClient => &["INFO", "MSG", "HMSG", "PING", "PONG", "+OK", "-ERR"],
        }
    }
}

/// A frame's head, parsed: its operation, and for a message its subject, reply subject and
/// payload size (headers and body, without the trailing CRLF).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub op: String,
    pub subject: Option<String>,
    pub reply: Option<String>,
    pub payload_bytes: usize,
}

/// What the framer found in a chunk, in stream order.
#[derive(Debug, PartialEq, Eq)]
pub enum Framed<'a> {
    /// A complete head line (its bytes, CRLF included, possibly gathered over several chunks).
    Head(Head, Vec<u8>),
    /// Bytes of the current frame's payload (and its trailing CRLF).
    Body(&'a [u8]),
    /// The current frame is complete.
    End,
    /// Bytes passed through unparsed (the stream is lost, or the head line was given up on).
    Raw(Vec<u8>),
}

/// The framing state of one direction of one connection.
#[derive(Debug)]
pub struct Framer {
    direction: Direction,
    /// The head line gathered so far (no CRLF yet).
    line: Vec<u8>,
    /// Payload bytes (with the trailing CRLF) the current frame still has to carry.
    payload_left: usize,
    lost: bool,
}

impl Framer {
    pub fn new(direction: Direction) -> Framer {
        Framer {
            direction,
            line: Vec::new(),
            payload_left: 0,
            lost: false,
        }
    }

    /// Whether the framer gave up on this stream (every later byte passes through raw).
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Feeds the next chunk of the stream; `on` gets its events in order. The bytes of a head
    /// line that has not ended yet are kept (not reported) until it does.
    pub fn feed<'a>(&mut self, chunk: &'a [u8], mut on: impl FnMut(Framed<'a>)) {
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.lost {
                on(Framed::Raw(rest.to_vec()));
                return;
            }
            if self.payload_left > 0 {
                let n = self.payload_left.min(rest.len());
                on(Framed::Body(&rest[..n]));
                self.payload_left -= n;
                rest = &rest[n..];
                if self.payload_left == 0 {
                    on(Framed::End);
                }
                continue;
            }
            match rest.iter().position(|b| *b == b'\n') {
                None => {
                    self.line.extend_from_slice(rest);
                    if self.line.len() > LINE_MAX_BYTES || !self.could_be_op() {
                        self.lose(&mut on);
                    }
                    return;
                }
                Some(i) => {
                    self.line.extend_from_slice(&rest[..=i]);
                    rest = &rest[i + 1..];
                    match self.parse_line() {
                        Some(head) => {
                            let line = std::mem::take(&mut self.line);
                            let payload = head.payload_bytes;
                            let has_payload =
                                matches!(head.op.as_str(), "PUB" | "HPUB" | "MSG" | "HMSG");
                            on(Framed::Head(head, line));
                            if has_payload {
                                // The payload and its CRLF.
                                self.payload_left = payload + 2;
                            } else {
                                on(Framed::End);
                            }
                        }
                        None => self.lose(&mut on),
                    }
                }
            }
        }
    }

    /// Gives up: what was gathered goes out raw, and so does everything after.
    fn lose<'a>(&mut self, on: &mut impl FnMut(Framed<'a>)) {
        self.lost = true;
        let kept = std::mem::take(&mut self.line);
        if !kept.is_empty() {
            on(Framed::Raw(kept));
        }
    }

    /// Whether the gathered start of a line can still begin one of this direction's operations.
    fn could_be_op(&self) -> bool {
        let start: Vec<u8> = self
            .line
            .iter()
            .take_while(|b| !b.is_ascii_whitespace())
            .map(u8::to_ascii_uppercase)
            .collect();
        let word_ended = start.len() < self.line.len();
        self.direction.ops().iter().any(|op| {
            let op = op.as_bytes();
            if word_ended {
                op == start.as_slice()
            } else {
                op.starts_with(&start)
            }
        })
    }

    /// The complete line (CRLF at its end) as a head, or `None` if it is not one.
    fn parse_line(&self) -> Option<Head> {
        let text = std::str::from_utf8(&self.line).ok()?;
        let text = text.strip_suffix('\n')?.strip_suffix('\r')?;
        let (op, args) = match text.split_once([' ', '\t']) {
            Some((op, args)) => (op.to_ascii_uppercase(), args),
            None => (text.to_ascii_uppercase(), ""),
        };
        if !self.direction.ops().contains(&op.as_str()) {
            return None;
        }
        let words: Vec<&str> = args.split_ascii_whitespace().collect();
        let size = |w: &str| w.parse::<usize>().ok();
        let (subject, reply, payload_bytes) = match (op.as_str(), words.as_slice()) {
            ("PUB", [s, n]) => (Some(*s), None, size(n)?),
            ("PUB", [s, r, n]) => (Some(*s), Some(*r), size(n)?),
            ("HPUB", [s, h, n]) => (Some(*s), None, sized(size(h)?, size(n)?)?),
            ("HPUB", [s, r, h, n]) => (Some(*s), Some(*r), sized(size(h)?, size(n)?)?),
            ("MSG", [s, _sid, n]) => (Some(*s), None, size(n)?),
            ("MSG", [s, _sid, r, n]) => (Some(*s), Some(*r), size(n)?),
            ("HMSG", [s, _sid, h, n]) => (Some(*s), None, sized(size(h)?, size(n)?)?),
            ("HMSG", [s, _sid, r, h, n]) => (Some(*s), Some(*r), sized(size(h)?, size(n)?)?),
            ("PUB" | "HPUB" | "MSG" | "HMSG", _) => return None,
            _ => (None, None, 0),
        };
        Some(Head {
            op,
            subject: subject.map(str::to_string),
            reply: reply.map(str::to_string),
            payload_bytes,
        })
    }
}

/// A headers-and-body frame's total size, refused when the headers claim more than the total.
fn sized(headers: usize, total: usize) -> Option<usize> {
    (headers <= total).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event of `chunks` fed in order, with the bytes each carries.
    fn run(direction: Direction, chunks: &[&[u8]]) -> (Vec<String>, Vec<u8>) {
        let mut f = Framer::new(direction);
        let mut events = Vec::new();
        let mut bytes = Vec::new();
        for c in chunks {
            f.feed(c, |e| match e {
                Framed::Head(h, line) => {
                    events.push(format!(
                        "head {} {:?} {:?} {}",
                        h.op, h.subject, h.reply, h.payload_bytes
                    ));
                    bytes.extend(line);
                }
                Framed::Body(b) => {
                    events.push(format!("body {}", b.len()));
                    bytes.extend_from_slice(b);
                }
                Framed::End => events.push("end".into()),
                Framed::Raw(r) => {
                    events.push(format!("raw {}", r.len()));
                    bytes.extend(r);
                }
            });
        }
        (events, bytes)
    }

    /// A broker's stream cut at every byte boundary frames the same and loses no byte.
    /// Mutation seen failing: the payload counted without its trailing CRLF.
    #[test]
    fn broker_frames_survive_any_chunking() {
        let stream: &[u8] = b"INFO {\"a\":1}\r\nMSG _INBOX_x.y.1 7 5\r\nhello\r\nPING\r\nHMSG s.t 9 _INBOX_x.y.2 12 14\r\nNATS/1.0\r\n\r\nhi\r\n+OK\r\n";
        let (whole, bytes) = run(Direction::ToClient, &[stream]);
        assert_eq!(bytes, stream);
        assert_eq!(
            whole,
            [
                "head INFO None None 0",
                "end",
                "head MSG Some(\"_INBOX_x.y.1\") None 5",
                "body 7",
                "end",
                "head PING None None 0",
                "end",
                "head HMSG Some(\"s.t\") Some(\"_INBOX_x.y.2\") 14",
                "body 16",
                "end",
                "head +OK None None 0",
                "end",
            ]
        );
        for cut in 1..stream.len() {
            let (events, bytes) = run(Direction::ToClient, &[&stream[..cut], &stream[cut..]]);
            assert_eq!(bytes, stream, "cut at {cut}");
            let heads: Vec<&String> = events.iter().filter(|e| e.starts_with("head")).collect();
            let want: Vec<&String> = whole.iter().filter(|e| e.starts_with("head")).collect();
            assert_eq!(heads, want, "cut at {cut}");
        }
    }

    /// A client's request names its subject and its reply subject.
    #[test]
    fn a_client_request_names_its_reply() {
        let stream: &[u8] = b"CONNECT {\"jwt\":\"x y\"}\r\nSUB _INBOX_k.m.* 1\r\nPUB $JS.API.STREAM.INFO.CHAT_demo _INBOX_k.m.3 2\r\n{}\r\nHPUB a.b 4 6\r\n\r\n\r\nxy\r\n";
        let (events, bytes) = run(Direction::ToBroker, &[stream]);
        assert_eq!(bytes, stream);
        assert!(events.contains(
            &"head PUB Some(\"$JS.API.STREAM.INFO.CHAT_demo\") Some(\"_INBOX_k.m.3\") 2"
                .to_string()
        ));
        assert!(events.contains(&"head HPUB Some(\"a.b\") None 6".to_string()));
    }

    /// A stream that is not the protocol (TLS after the greeting) goes through raw at once, even
    /// before any line end: a handshake is never withheld waiting for a CRLF.
    /// Mutation seen failing: `could_be_op` always true (the TLS bytes are withheld).
    #[test]
    fn a_stream_that_is_not_the_protocol_passes_raw_at_once() {
        let (events, bytes) = run(
            Direction::ToClient,
            &[
                b"INFO {}\r\n",
                &[0x16, 0x03, 0x01, 0x02, 0x00],
                &[0x01, 0x00],
            ],
        );
        assert_eq!(events, ["head INFO None None 0", "end", "raw 5", "raw 2"]);
        assert_eq!(bytes.len(), 9 + 7);
        // A message whose size is not a number is not framed either.
        let (events, _) = run(Direction::ToClient, &[b"MSG a 1 many\r\nxx\r\n"]);
        assert_eq!(events, ["raw 14", "raw 4"]);
        // A head line still arriving is kept, not reported.
        let mut f = Framer::new(Direction::ToClient);
        let mut seen = 0;
        f.feed(b"MSG _INBOX_a.b", |_| seen += 1);
        assert_eq!(seen, 0);
        assert!(!f.is_lost());
    }
}
