//! NRI's connection multiplexer (containerd/nri `pkg/net/multiplex`): one socket carries several
//! logical connections as frames of an 8-byte header — connection id (u32, big-endian), payload
//! length (u32, big-endian) — and the payload. Each logical connection is a byte stream (here:
//! ttrpc messages, [`crate::ttrpc`]). Connection 1 carries the Plugin service (the runtime is
//! the ttrpc client, the plugin serves); connection 2 the Runtime service (the plugin is the
//! client). Id 0 is reserved; frames for other ids are dropped, as NRI's own mux does.

use std::io::{self, Read, Write};

/// The plugin's ttrpc server (`multiplex.PluginServiceConn`).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// The runtime's ttrpc server (`multiplex.RuntimeServiceConn`).
pub const RUNTIME_SERVICE_CONN: u32 = 2;

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 8;
/// Largest frame payload NRI writes (`maxPayloadSize`: one ttrpc header and message); larger
/// frames are a protocol error.
pub const MAX_PAYLOAD: usize = crate::ttrpc::HEADER_LEN + crate::ttrpc::MAX_DATA;
/// Largest payload gpufence puts in one frame. NRI's Go side reads each sub-connection through
/// a 4096-byte `bufio.Reader`, and its mux refuses (ENOMEM) a frame larger than the buffer it
/// is asked to fill: frames of at most 4096 bytes always fit, whatever the reader's position.
pub const WRITE_CHUNK: usize = 4096;

/// Why the multiplexed socket can no longer be read.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    #[error("connection closed by the runtime")]
    Closed,
    #[error("frame for connection {conn} of {len} bytes exceeds NRI's {MAX_PAYLOAD}-byte maximum")]
    Oversized { conn: u32, len: usize },
    #[error("reading the NRI socket: {0}")]
    Io(#[from] io::Error),
}

/// One frame read from the socket.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    pub conn: u32,
    pub payload: Vec<u8>,
}

/// Read the next frame. End of stream before a header is [`MuxError::Closed`]; in the middle of
/// a frame it is an I/O error. The payload is read in bounded steps, so a header that claims
/// more than arrives costs no more memory than what arrived.
pub fn read_frame(r: &mut impl Read) -> Result<Frame, MuxError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Err(MuxError::Closed),
            // The peer closed with our data unread: gone all the same.
            Err(e) if got == 0 && e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(MuxError::Closed);
            }
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(MuxError::Oversized { conn, len });
    }
    let mut payload = Vec::new();
    let n = r.take(len as u64).read_to_end(&mut payload)?;
    if n < len {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(Frame { conn, payload })
}

/// `data` on connection `conn` as frames of at most [`WRITE_CHUNK`] bytes.
pub fn encode_frames(conn: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + HEADER_LEN * (data.len() / WRITE_CHUNK + 1));
    for chunk in data.chunks(WRITE_CHUNK) {
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

/// Write `data` on connection `conn` (the caller serialises writers).
pub fn write_frames(w: &mut impl Write, conn: u32, data: &[u8]) -> io::Result<()> {
    w.write_all(&encode_frames(conn, data))?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(conn: u32, len: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = conn.to_be_bytes().to_vec();
        v.extend(len.to_be_bytes());
        v.extend(payload);
        v
    }

    #[test]
    fn frames_round_trip_in_chunks_of_at_most_4096() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let wire = encode_frames(RUNTIME_SERVICE_CONN, &data);
        let mut r = &wire[..];
        let mut back = Vec::new();
        let mut sizes = Vec::new();
        while !r.is_empty() {
            let f = read_frame(&mut r).unwrap();
            assert_eq!(f.conn, RUNTIME_SERVICE_CONN);
            sizes.push(f.payload.len());
            back.extend(f.payload);
        }
        assert_eq!(back, data);
        assert_eq!(sizes, [4096, 4096, 1808]);
        assert!(matches!(read_frame(&mut r), Err(MuxError::Closed)));
    }

    #[test]
    fn header_is_conn_then_length_big_endian() {
        assert_eq!(
            encode_frames(1, b"ab"),
            [0, 0, 0, 1, 0, 0, 0, 2, b'a', b'b']
        );
        assert!(encode_frames(1, b"").is_empty());
    }

    #[test]
    fn oversized_frame_is_refused_before_reading_it() {
        let wire = frame(1, (MAX_PAYLOAD + 1) as u32, b"");
        match read_frame(&mut &wire[..]) {
            Err(MuxError::Oversized { conn: 1, len }) => assert_eq!(len, MAX_PAYLOAD + 1),
            other => panic!("{other:?}"),
        }
        // The largest NRI frame is accepted.
        let big = vec![1u8; MAX_PAYLOAD];
        let wire = frame(2, MAX_PAYLOAD as u32, &big);
        assert_eq!(
            read_frame(&mut &wire[..]).unwrap().payload.len(),
            MAX_PAYLOAD
        );
    }

    #[test]
    fn truncated_frames_are_errors_not_hangs() {
        // Header cut short.
        let wire = [0u8, 0, 0, 1, 0];
        assert!(matches!(read_frame(&mut &wire[..]), Err(MuxError::Io(_))));
        // Payload shorter than claimed: no allocation of the claim, an error.
        let wire = frame(1, 1 << 20, b"abc");
        assert!(matches!(read_frame(&mut &wire[..]), Err(MuxError::Io(_))));
    }

    #[test]
    fn frames_for_any_id_are_read_and_left_to_the_caller() {
        let mut wire = frame(0, 1, b"z");
        wire.extend(frame(77, 0, b""));
        let mut r = &wire[..];
        assert_eq!(
            read_frame(&mut r).unwrap(),
            Frame {
                conn: 0,
                payload: b"z".to_vec()
            }
        );
        assert_eq!(read_frame(&mut r).unwrap().conn, 77);
    }
}
