//! ttrpc framing (github.com/containerd/ttrpc v1.2.8, PROTOCOL.md): a 10-byte header — data
//! length (u32, big-endian), stream id (u32, big-endian), message type (u8), flags (u8) — then
//! the data, at most 4 MiB. A request's data is a protobuf `ttrpc.Request` (service, method,
//! payload), a response's a `ttrpc.Response` (google.rpc status, payload).
//!
//! Written here rather than taken from the `ttrpc` crate: that crate's synchronous server only
//! serves connections it accepts itself on a listening fd, while NRI runs ttrpc over one
//! sub-connection of a multiplexed socket ([`crate::mux`]) that the plugin dialled (or
//! inherited); and the crate brings a second protobuf library (rust-protobuf) beside prost.
//! Unary calls are all NRI uses; the framing is this file.

use crate::api::ttrpc as pb;

/// Bytes of a message header.
pub const HEADER_LEN: usize = 10;
/// Largest message data ttrpc accepts (`messageLengthMax`).
pub const MAX_DATA: usize = 4 << 20;

/// Message types.
pub const TYPE_REQUEST: u8 = 1;
pub const TYPE_RESPONSE: u8 = 2;
pub const TYPE_DATA: u8 = 3;

/// gRPC status codes used in responses.
pub mod code {
    pub const OK: i32 = 0;
    /// What a Go handler's plain error becomes: how a refusal reaches the runtime.
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
}

/// A message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub length: u32,
    pub stream_id: u32,
    pub kind: u8,
    pub flags: u8,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        Header {
            length: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            stream_id: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            kind: b[8],
            flags: b[9],
        }
    }
}

/// Why a message could not be encoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("ttrpc message of {0} bytes exceeds the {MAX_DATA}-byte maximum")]
pub struct Oversized(pub usize);

/// One message (header and data) ready to write.
pub fn encode(stream_id: u32, kind: u8, flags: u8, data: &[u8]) -> Result<Vec<u8>, Oversized> {
    if data.len() > MAX_DATA {
        return Err(Oversized(data.len()));
    }
    let mut out = Vec::with_capacity(HEADER_LEN + data.len());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(data);
    Ok(out)
}

/// What the byte stream of one sub-connection carried.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A whole message.
    Message { header: Header, data: Vec<u8> },
    /// A message over [`MAX_DATA`]: its data is skipped (as ttrpc's Go reader does) and the
    /// stream gets a RESOURCE_EXHAUSTED answer.
    Oversized { header: Header },
}

/// Reassembles messages from the chunks a sub-connection delivers. Holds at most one header and
/// one message's data ([`MAX_DATA`]); an oversized message is skipped byte by byte without being
/// held.
#[derive(Debug, Default)]
pub struct Decoder {
    header: Vec<u8>,
    current: Option<(Header, Vec<u8>)>,
    skip: usize,
}

impl Decoder {
    /// Feed a chunk; the messages it completes, in order.
    pub fn push(&mut self, mut chunk: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        while !chunk.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(chunk.len());
                self.skip -= n;
                chunk = &chunk[n..];
                continue;
            }
            if let Some((header, data)) = self.current.as_mut() {
                let want = header.length as usize - data.len();
                let n = want.min(chunk.len());
                data.extend_from_slice(&chunk[..n]);
                chunk = &chunk[n..];
                if data.len() == header.length as usize {
                    let (header, data) = self.current.take().expect("current message");
                    out.push(Event::Message { header, data });
                }
                continue;
            }
            let n = (HEADER_LEN - self.header.len()).min(chunk.len());
            self.header.extend_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
            if self.header.len() < HEADER_LEN {
                continue;
            }
            let mut raw = [0u8; HEADER_LEN];
            raw.copy_from_slice(&self.header);
            self.header.clear();
            let header = Header::parse(&raw);
            let len = header.length as usize;
            if len > MAX_DATA {
                self.skip = len;
                out.push(Event::Oversized { header });
            } else if len == 0 {
                out.push(Event::Message {
                    header,
                    data: Vec::new(),
                });
            } else {
                // Grows with what arrives, not with what the header claims.
                self.current = Some((header, Vec::new()));
            }
        }
        out
    }
}

/// A response message carrying `payload` (status OK).
pub fn ok_response(stream_id: u32, payload: Vec<u8>) -> Vec<u8> {
    response(stream_id, code::OK, String::new(), payload)
}

/// A response message carrying an error status with `message`.
pub fn error_response(stream_id: u32, code: i32, message: &str) -> Vec<u8> {
    response(stream_id, code, bounded_message(message), Vec::new())
}

/// Longest error message sent back (a refusal is one line; anything longer is cut).
pub const MAX_ERROR_MESSAGE: usize = 4096;

/// `message` on one line and at most [`MAX_ERROR_MESSAGE`] bytes.
pub fn bounded_message(message: &str) -> String {
    let s = message.replace(['\n', '\r'], " ");
    if s.len() <= MAX_ERROR_MESSAGE {
        return s;
    }
    format!("{}…", gpufence_core::text::clip(&s, MAX_ERROR_MESSAGE))
}

fn response(stream_id: u32, code: i32, message: String, payload: Vec<u8>) -> Vec<u8> {
    use prost::Message;
    let r = pb::Response {
        status: Some(pb::Status { code, message }),
        payload,
    };
    encode(stream_id, TYPE_RESPONSE, 0, &r.encode_to_vec()).unwrap_or_else(|_| {
        // Only a payload over 4 MiB gets here (an error message is bounded): say so instead.
        let r = pb::Response {
            status: Some(pb::Status {
                code: code::RESOURCE_EXHAUSTED,
                message: "response exceeds ttrpc's 4 MiB message limit".into(),
            }),
            payload: Vec::new(),
        };
        encode(stream_id, TYPE_RESPONSE, 0, &r.encode_to_vec()).expect("small response")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn header_round_trip_is_big_endian() {
        let m = encode(0x0102_0304, TYPE_REQUEST, 0, b"abc").unwrap();
        assert_eq!(&m[..HEADER_LEN], &[0, 0, 0, 3, 1, 2, 3, 4, 1, 0]);
        let mut raw = [0u8; HEADER_LEN];
        raw.copy_from_slice(&m[..HEADER_LEN]);
        assert_eq!(
            Header::parse(&raw),
            Header {
                length: 3,
                stream_id: 0x0102_0304,
                kind: TYPE_REQUEST,
                flags: 0
            }
        );
    }

    #[test]
    fn encode_refuses_over_4_mib() {
        assert_eq!(
            encode(1, TYPE_REQUEST, 0, &vec![0; MAX_DATA + 1]),
            Err(Oversized(MAX_DATA + 1))
        );
        assert!(encode(1, TYPE_REQUEST, 0, &vec![0; MAX_DATA]).is_ok());
    }

    #[test]
    fn decoder_reassembles_across_chunks_of_any_size() {
        let mut stream = encode(1, TYPE_REQUEST, 0, b"hello").unwrap();
        stream.extend(encode(3, TYPE_REQUEST, 0, b"").unwrap());
        stream.extend(encode(5, TYPE_DATA, 1, &[7; 300]).unwrap());
        for size in [1, 2, 9, 10, 11, 4096] {
            let mut d = Decoder::default();
            let events: Vec<Event> = stream.chunks(size).flat_map(|c| d.push(c)).collect();
            assert_eq!(events.len(), 3, "chunk size {size}");
            let Event::Message { header, data } = &events[0] else {
                panic!("{events:?}")
            };
            assert_eq!((header.stream_id, data.as_slice()), (1, &b"hello"[..]));
            assert!(matches!(&events[1], Event::Message { header, data }
                if header.stream_id == 3 && data.is_empty()));
            assert!(matches!(&events[2], Event::Message { header, data }
                if header.kind == TYPE_DATA && header.flags == 1 && data.len() == 300));
        }
    }

    #[test]
    fn oversized_message_is_skipped_without_being_held_and_the_next_one_is_read() {
        let mut d = Decoder::default();
        let len = (MAX_DATA + 1) as u32;
        let mut head = len.to_be_bytes().to_vec();
        head.extend(7u32.to_be_bytes());
        head.extend([TYPE_REQUEST, 0]);
        let events = d.push(&head);
        assert!(matches!(&events[..], [Event::Oversized { header }] if header.stream_id == 7));
        // The claimed data arrives in chunks; none of it is kept.
        let chunk = vec![0xAAu8; 1 << 20];
        for _ in 0..4 {
            assert!(d.push(&chunk).is_empty());
            assert!(d.current.is_none());
        }
        let mut tail = vec![0xAAu8; 1];
        tail.extend(encode(9, TYPE_REQUEST, 0, b"x").unwrap());
        let events = d.push(&tail);
        assert!(matches!(&events[..], [Event::Message { header, data }]
            if header.stream_id == 9 && data == b"x"));
    }

    #[test]
    fn a_header_claiming_much_does_not_allocate_it_up_front() {
        let mut d = Decoder::default();
        let mut head = (MAX_DATA as u32).to_be_bytes().to_vec();
        head.extend(1u32.to_be_bytes());
        head.extend([TYPE_REQUEST, 0]);
        assert!(d.push(&head).is_empty());
        let (_, data) = d.current.as_ref().unwrap();
        assert!(data.capacity() < 1024);
    }

    #[test]
    fn error_response_is_one_bounded_line() {
        let long = format!("first\nsecond{}", "é".repeat(5000));
        let m = error_response(3, code::UNKNOWN, &long);
        let r = pb::Response::decode(&m[HEADER_LEN..]).unwrap();
        let s = r.status.unwrap();
        assert_eq!(s.code, code::UNKNOWN);
        assert!(s.message.starts_with("first second"));
        assert!(!s.message.contains('\n'));
        assert!(s.message.len() <= MAX_ERROR_MESSAGE + '…'.len_utf8());
        assert_eq!(m[8], TYPE_RESPONSE);
    }

    #[test]
    fn oversized_response_payload_becomes_resource_exhausted() {
        let m = ok_response(5, vec![0; MAX_DATA + 1]);
        let r = pb::Response::decode(&m[HEADER_LEN..]).unwrap();
        assert_eq!(r.status.unwrap().code, code::RESOURCE_EXHAUSTED);
    }

    proptest::proptest! {
        /// Any messages, cut into any chunks, come out whole and in order.
        #[test]
        fn decoder_reassembles_any_chunking(
            msgs in proptest::collection::vec(
                (proptest::num::u32::ANY, 1u8..4, proptest::collection::vec(proptest::num::u8::ANY, 0..600)),
                0..8,
            ),
            cuts in proptest::collection::vec(1usize..700, 1..40),
        ) {
            let mut wire = Vec::new();
            for (sid, kind, data) in &msgs {
                wire.extend(encode(*sid, *kind, 0, data).unwrap());
            }
            let mut d = Decoder::default();
            let mut got = Vec::new();
            let mut rest = &wire[..];
            let mut i = 0;
            while !rest.is_empty() {
                let n = cuts[i % cuts.len()].min(rest.len());
                got.extend(d.push(&rest[..n]));
                rest = &rest[n..];
                i += 1;
            }
            let want: Vec<Event> = msgs
                .iter()
                .map(|(sid, kind, data)| Event::Message {
                    header: Header { length: data.len() as u32, stream_id: *sid, kind: *kind, flags: 0 },
                    data: data.clone(),
                })
                .collect();
            proptest::prop_assert_eq!(got, want);
        }

        /// Arbitrary bytes never panic the decoder, and it never holds more than one message.
        #[test]
        fn decoder_takes_any_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..4096)) {
            let mut d = Decoder::default();
            for e in d.push(&bytes) {
                if let Event::Message { data, .. } = e {
                    proptest::prop_assert!(data.len() <= MAX_DATA);
                }
            }
            proptest::prop_assert!(d.current.as_ref().is_none_or(|(_, v)| v.len() <= MAX_DATA));
        }
    }
}
