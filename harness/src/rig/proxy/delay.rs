//! The proxy's *delay* (see the module doc of `proxy.rs`): whole frames of the NATS protocol
//! kept at the proxy while every other frame of the connection flows, then handed over in
//! order. Two kinds: the broker's replies to the requests a client makes on a subject (the
//! request reaches the broker and is answered; the answer is late), and a client's own
//! publishes on a subject (they reach the broker late, or never if the connection dies first).
//! Subjects are matched as NATS does (`*` is one token, a trailing `>` the rest), by the wire's
//! own matcher of grant patterns.
//!
//! A *drop* is the delay's one-shot sibling: the client's next publishes on a subject, up to a
//! count, are dropped whole and never reach the broker, while every other frame (later
//! publishes on that subject too) flows: a request lost before the broker, so it is never
//! answered, and a retry of it is carried.

use std::sync::Mutex;

use cotal_delivery::wire::channel_matches as subject_matches;

use crate::rig::frames::{Direction, Framed, Framer, Head};

/// What the delay keeps, and what it kept.
#[derive(Debug, Default)]
pub(super) struct Delay {
    /// Replies to requests on subjects this pattern matches are kept.
    replies_to: Option<String>,
    /// Client publishes on subjects this pattern matches are kept.
    publishes_to: Option<String>,
    /// Reply subjects of the requests made while armed: (connection, reply subject).
    awaited: Vec<(u64, String)>,
    /// Bytes kept, in order, per connection and direction.
    held: Vec<Kept>,
    /// Frames kept whole in this round.
    complete: usize,
    /// Bumped at each release: bytes kept in an earlier round are handed over.
    round: u64,
    /// Client publishes on subjects this pattern matches are dropped, while `drops_left` lasts.
    drop_publishes: Option<String>,
    /// How many more publishes the drop takes.
    drops_left: usize,
    /// Frames dropped whole so far.
    dropped: usize,
}

/// What becomes of a frame the delay recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameFate {
    /// Kept in this round, until a release.
    Keep(u64),
    /// Dropped: never forwarded.
    Drop,
}

#[derive(Debug)]
struct Kept {
    id: u64,
    direction: Direction,
    round: u64,
    bytes: Vec<u8>,
}

impl Delay {
    /// Keeps the broker's replies to requests on `pattern` from now on.
    pub(super) fn arm_replies(&mut self, pattern: &str) {
        self.replies_to = Some(pattern.to_string());
        self.awaited.clear();
    }
    /// Keeps client publishes on `pattern` from now on.
    pub(super) fn arm_publishes(&mut self, pattern: &str) {
        self.publishes_to = Some(pattern.to_string());
    }
    /// Drops the client's next `count` publishes on `pattern` (see the module doc).
    pub(super) fn arm_drop(&mut self, pattern: &str, count: usize) {
        self.drop_publishes = Some(pattern.to_string());
        self.drops_left = count;
    }
    /// Frames dropped whole so far.
    pub(super) fn dropped(&self) -> usize {
        self.dropped
    }
    /// Frames kept whole since the last release.
    pub(super) fn complete(&self) -> usize {
        self.complete
    }
    /// Disarms both kinds; what was kept is handed over by each connection's pump.
    pub(super) fn release(&mut self) {
        self.replies_to = None;
        self.publishes_to = None;
        self.awaited.clear();
        self.complete = 0;
        self.round += 1;
    }

    /// A head the client sent on connection `id`: notes a request whose reply is kept; what
    /// becomes of the frame itself when it is a publish that is dropped or kept.
    fn client_head(&mut self, id: u64, head: &Head) -> Option<FrameFate> {
        if !matches!(head.op.as_str(), "PUB" | "HPUB") {
            return None;
        }
        let subject = head.subject.as_deref()?;
        if self.drops_left > 0
            && self
                .drop_publishes
                .as_deref()
                .is_some_and(|p| subject_matches(p, subject))
        {
            self.drops_left -= 1;
            return Some(FrameFate::Drop);
        }
        if let (Some(p), Some(reply)) = (&self.replies_to, &head.reply) {
            if subject_matches(p, subject) {
                self.awaited.push((id, reply.clone()));
            }
        }
        let keep = self
            .publishes_to
            .as_deref()
            .is_some_and(|p| subject_matches(p, subject));
        keep.then_some(FrameFate::Keep(self.round))
    }
    /// A head the broker sent on connection `id`: the round to keep it in when it answers an
    /// awaited request.
    fn broker_head(&mut self, id: u64, head: &Head) -> Option<u64> {
        self.replies_to.as_ref()?;
        if !matches!(head.op.as_str(), "MSG" | "HMSG") {
            return None;
        }
        let subject = head.subject.as_ref()?;
        let at = self
            .awaited
            .iter()
            .position(|(c, r)| *c == id && r == subject)?;
        self.awaited.remove(at);
        Some(self.round)
    }
    /// Keeps `bytes` of connection `id` going `direction` if `round` is still the current one.
    fn keep(&mut self, id: u64, direction: Direction, round: u64, bytes: &[u8]) -> bool {
        if round != self.round {
            return false;
        }
        match self
            .held
            .iter_mut()
            .find(|k| k.id == id && k.direction == direction && k.round == round)
        {
            Some(k) => k.bytes.extend_from_slice(bytes),
            None => self.held.push(Kept {
                id,
                direction,
                round,
                bytes: bytes.to_vec(),
            }),
        }
        true
    }
    /// A frame kept in `round` is whole.
    fn ended(&mut self, round: u64) {
        if round == self.round {
            self.complete += 1;
        }
    }
    /// The bytes of connection `id` going `direction` kept in rounds already released.
    pub(super) fn take_released(&mut self, id: u64, direction: Direction) -> Vec<u8> {
        let mut out = Vec::new();
        let round = self.round;
        self.held.retain_mut(|k| {
            if k.id == id && k.direction == direction && k.round < round {
                out.append(&mut k.bytes);
                false
            } else {
                true
            }
        });
        out
    }
}

/// One direction of one connection as the delay sees it: its framing, and the fate of the
/// frame being kept or dropped while its bytes still arrive.
#[derive(Debug)]
pub(super) struct Framing {
    direction: Direction,
    framer: Framer,
    keeping: Option<FrameFate>,
}

impl Framing {
    pub(super) fn new(direction: Direction) -> Framing {
        Framing {
            direction,
            framer: Framer::new(direction),
            keeping: None,
        }
    }

    /// Splits a chunk of connection `id` into the bytes to hand over first (kept in a round a
    /// release has ended since) and the chunk's bytes to forward; the rest is kept. A head line
    /// still arriving is held back by the framer until it ends, so a frame is recognised before
    /// any of its bytes go out.
    pub(super) fn split(
        &mut self,
        delay: &Mutex<Delay>,
        id: u64,
        chunk: &[u8],
    ) -> (Vec<u8>, Vec<u8>) {
        let mut d = delay.lock().unwrap_or_else(|p| p.into_inner());
        if self.framer.is_lost() {
            return (d.take_released(id, self.direction), chunk.to_vec());
        }
        let direction = self.direction;
        let keeping = &mut self.keeping;
        let mut out = Vec::with_capacity(chunk.len());
        self.framer.feed(chunk, |e| match e {
            Framed::Head(head, line) => {
                let fate = match direction {
                    Direction::ToBroker => d.client_head(id, &head),
                    Direction::ToClient => d.broker_head(id, &head).map(FrameFate::Keep),
                };
                *keeping = match fate {
                    Some(FrameFate::Drop) => Some(FrameFate::Drop),
                    Some(FrameFate::Keep(round)) if d.keep(id, direction, round, &line) => {
                        Some(FrameFate::Keep(round))
                    }
                    _ => {
                        out.extend(line);
                        None
                    }
                };
            }
            Framed::Body(bytes) => match *keeping {
                Some(FrameFate::Drop) => {}
                Some(FrameFate::Keep(round)) if d.keep(id, direction, round, bytes) => {}
                _ => out.extend_from_slice(bytes),
            },
            Framed::End => match keeping.take() {
                Some(FrameFate::Keep(round)) => d.ended(round),
                Some(FrameFate::Drop) => d.dropped += 1,
                None => {}
            },
            Framed::Raw(bytes) => out.extend(bytes),
        });
        (d.take_released(id, direction), out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A publish kept mid-frame when the release comes is handed over whole, before the rest
    /// of its frame and every later byte.
    /// Mutation seen failing: `take_released` handing over only rounds older than the previous one
    /// (`k.round + 1 < round`).
    #[test]
    fn a_release_mid_frame_hands_the_frame_over_in_order() {
        let delay = Mutex::new(Delay::default());
        delay.lock().unwrap().arm_publishes("cotal.demo.dlv.>");
        let mut f = Framing::new(Direction::ToBroker);
        let (first, out) = f.split(
            &delay,
            1,
            b"PUB a 1\r\nx\r\nHPUB cotal.demo.dlv.b 2 6\r\nNA",
        );
        assert!(first.is_empty());
        assert_eq!(out, b"PUB a 1\r\nx\r\n");
        delay.lock().unwrap().release();
        let (first, out) = f.split(&delay, 1, b"\r\nyy\r\nPING\r\n");
        assert_eq!(first, b"HPUB cotal.demo.dlv.b 2 6\r\nNA");
        assert_eq!(out, b"\r\nyy\r\nPING\r\n");
        // Nothing is kept once released.
        let (first, out) = f.split(&delay, 1, b"PUB cotal.demo.dlv.c 1\r\nz\r\n");
        assert!(first.is_empty());
        assert_eq!(out, b"PUB cotal.demo.dlv.c 1\r\nz\r\n");
    }

    /// A drop of one publish takes the next one on its subject whole (split across chunks),
    /// forwards every other frame, and carries the next publish on the subject: the retry of a
    /// request lost once.
    /// Mutation seen failing: `client_head` not counting the drop down (`drops_left` left as it
    /// is): the second publish is dropped too.
    #[test]
    fn a_drop_takes_the_next_publish_whole_and_carries_the_one_after() {
        let delay = Mutex::new(Delay::default());
        delay
            .lock()
            .unwrap()
            .arm_drop("$JS.API.CONSUMER.DELETE.KV_x.*", 1);
        let mut f = Framing::new(Direction::ToBroker);
        let (first, out) = f.split(
            &delay,
            1,
            b"PUB a 1\r\nx\r\nPUB $JS.API.CONSUMER.DELETE.KV_x.w _INBOX.r 2\r\n{",
        );
        assert!(first.is_empty());
        assert_eq!(out, b"PUB a 1\r\nx\r\n");
        assert_eq!(
            delay.lock().unwrap().dropped(),
            0,
            "the frame is not whole yet"
        );
        let (_, out) = f.split(
            &delay,
            1,
            b"}\r\nPING\r\nPUB $JS.API.CONSUMER.DELETE.KV_x.w _INBOX.s 2\r\n{}\r\n",
        );
        assert_eq!(
            out,
            b"PING\r\nPUB $JS.API.CONSUMER.DELETE.KV_x.w _INBOX.s 2\r\n{}\r\n"
        );
        assert_eq!(delay.lock().unwrap().dropped(), 1);
        // Nothing kept either: a drop is not a delay.
        assert_eq!(delay.lock().unwrap().complete(), 0);
    }
}
