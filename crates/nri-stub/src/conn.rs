//! One live NRI connection: a reader thread demultiplexes the socket ([`crate::mux`]); requests
//! the runtime sends on the plugin connection are each served on their own thread (one slow or
//! failing request never holds up the next), and answers to the plugin's own calls on the
//! runtime connection are handed to the waiting caller. Writes are serialised by a lock and
//! bounded in time, so a runtime that stops reading ends the connection instead of stalling it.

use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use prost::Message;

use crate::api::ttrpc as pb;
use crate::mux::{self, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::ttrpc::{self, Decoder, Event, code};

/// Requests served at once; more are answered RESOURCE_EXHAUSTED at once rather than queued.
pub const MAX_IN_FLIGHT: usize = 64;
/// A write that does not complete in this time ends the connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A served method's failure: a gRPC status code and a one-line message.
pub type Status = (i32, String);

/// What serves the requests of the plugin connection: (service, method, payload) → response
/// payload or status.
pub type Serve = Arc<dyn Fn(&str, &str, &[u8]) -> Result<Vec<u8>, Status> + Send + Sync>;

/// Why a call to the runtime failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CallError {
    #[error("connection closed")]
    Closed,
    #[error("no answer in {0:?}")]
    Timeout(Duration),
    #[error("runtime answered code {code}: {message}")]
    Status { code: i32, message: String },
    #[error("malformed answer: {0}")]
    Malformed(String),
}

type Reply = Result<pb::Response, CallError>;

/// The shared half of a connection: writer, pending calls, counters.
pub struct Conn {
    writer: Mutex<UnixStream>,
    pending: Mutex<HashMap<u32, mpsc::Sender<Reply>>>,
    next_stream: AtomicU32,
    closed: AtomicBool,
    in_flight: AtomicUsize,
    /// The threads requests are served on ([`crate::workers`]).
    workers: Arc<crate::workers::Workers>,
}

impl Conn {
    /// Wrap a connected socket; returns the connection and the stream its reader thread reads.
    pub fn new(stream: UnixStream) -> io::Result<(Arc<Conn>, UnixStream)> {
        let writer = stream.try_clone()?;
        writer.set_write_timeout(Some(WRITE_TIMEOUT))?;
        let conn = Conn {
            writer: Mutex::new(writer),
            pending: Mutex::new(HashMap::new()),
            next_stream: AtomicU32::new(1),
            closed: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            workers: crate::workers::Workers::new("nri-request"),
        };
        Ok((Arc::new(conn), stream))
    }

    /// End the connection: the reader sees end of stream, waiting calls fail.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Ok(w) = self.writer.lock() {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Send one ttrpc message on sub-connection `conn_id`; a failed write ends the connection.
    fn send(&self, conn_id: u32, message: &[u8]) -> io::Result<()> {
        let r = match self.writer.lock() {
            Ok(mut w) => mux::write_frames(&mut *w, conn_id, message),
            Err(_) => Err(io::Error::other("writer lock poisoned")),
        };
        if r.is_err() {
            self.shutdown();
        }
        r
    }

    /// A unary call to the runtime's service; the response payload.
    pub fn call(
        &self,
        service: &str,
        method: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let id = self.next_stream.fetch_add(2, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        self.pending
            .lock()
            .map_err(|_| CallError::Closed)?
            .insert(id, tx);
        // The reader may have ended (and cleared `pending`) before the insert.
        if self.is_closed() {
            self.forget(id);
            return Err(CallError::Closed);
        }
        let req = pb::Request {
            service: service.to_string(),
            method: method.to_string(),
            payload,
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            metadata: Vec::new(),
        };
        let msg = ttrpc::encode(id, ttrpc::TYPE_REQUEST, 0, &req.encode_to_vec())
            .map_err(|e| CallError::Malformed(e.to_string()))?;
        if self.send(RUNTIME_SERVICE_CONN, &msg).is_err() {
            self.forget(id);
            return Err(CallError::Closed);
        }
        let reply = match rx.recv_timeout(timeout) {
            Ok(r) => r?,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.forget(id);
                return Err(CallError::Timeout(timeout));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(CallError::Closed),
        };
        match reply.status {
            Some(s) if s.code != code::OK => Err(CallError::Status {
                code: s.code,
                message: s.message,
            }),
            _ => Ok(reply.payload),
        }
    }

    fn forget(&self, id: u32) {
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&id);
        }
    }

    /// Read the socket until it ends; serve requests with `serve`. Returns why it ended. Marks
    /// the connection closed and fails every waiting call.
    pub fn run_reader(self: &Arc<Self>, mut stream: UnixStream, serve: Serve) -> MuxError {
        let mut server = Decoder::default();
        let mut client = Decoder::default();
        let why = loop {
            let frame = match mux::read_frame(&mut stream) {
                Ok(f) => f,
                Err(e) => break e,
            };
            match frame.conn {
                PLUGIN_SERVICE_CONN => {
                    for ev in server.push(&frame.payload) {
                        self.on_request(ev, &serve);
                    }
                }
                RUNTIME_SERVICE_CONN => {
                    for ev in client.push(&frame.payload) {
                        self.on_response(ev);
                    }
                }
                other => {
                    tracing::debug!(conn = other, "NRI frame for an unknown connection dropped")
                }
            }
        };
        self.shutdown();
        if let Ok(mut p) = self.pending.lock() {
            p.clear();
        }
        why
    }

    fn reply(&self, message: &[u8]) {
        if let Err(e) = self.send(PLUGIN_SERVICE_CONN, message) {
            tracing::warn!(error = %e, "NRI: answer not sent; connection ended");
        }
    }

    /// A message on the plugin connection: a request to serve, or something to refuse.
    fn on_request(self: &Arc<Self>, ev: Event, serve: &Serve) {
        let (header, data) = match ev {
            Event::Oversized { header } => {
                let why = format!(
                    "request of {} bytes exceeds ttrpc's {}-byte maximum",
                    header.length,
                    ttrpc::MAX_DATA
                );
                tracing::warn!(stream = header.stream_id, "NRI: {why}");
                if header.kind == ttrpc::TYPE_REQUEST {
                    let resp =
                        ttrpc::error_response(header.stream_id, code::RESOURCE_EXHAUSTED, &why);
                    self.reply(&resp);
                }
                return;
            }
            Event::Message { header, data } => (header, data),
        };
        if header.kind != ttrpc::TYPE_REQUEST {
            tracing::debug!(
                stream = header.stream_id,
                kind = header.kind,
                "NRI: non-request message on the plugin connection ignored"
            );
            return;
        }
        let sid = header.stream_id;
        if sid % 2 != 1 {
            let resp = ttrpc::error_response(
                sid,
                code::INVALID_ARGUMENT,
                "stream id must be odd for client initiated streams",
            );
            self.reply(&resp);
            return;
        }
        let req = match pb::Request::decode(data.as_slice()) {
            Ok(r) => r,
            Err(e) => {
                let resp = ttrpc::error_response(
                    sid,
                    code::INVALID_ARGUMENT,
                    &format!("unmarshal request error: {e}"),
                );
                self.reply(&resp);
                return;
            }
        };
        if self.in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let why = format!("more than {MAX_IN_FLIGHT} requests in flight");
            tracing::warn!(method = %req.method, "NRI: {why}");
            self.reply(&ttrpc::error_response(sid, code::RESOURCE_EXHAUSTED, &why));
            return;
        }
        let me = Arc::clone(self);
        let serve = Arc::clone(serve);
        let spawned = self.workers.run(move || {
            let resp = serve_one(&serve, sid, &req);
            me.reply(&resp);
            me.in_flight.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(e) = spawned {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let why = format!("cannot start a thread for the request: {e}");
            self.reply(&ttrpc::error_response(sid, code::RESOURCE_EXHAUSTED, &why));
        }
    }

    /// A message on the runtime connection: the answer to one of our calls.
    fn on_response(&self, ev: Event) {
        let (sid, reply) = match ev {
            Event::Oversized { header } => (
                header.stream_id,
                Err(CallError::Malformed(format!(
                    "answer of {} bytes",
                    header.length
                ))),
            ),
            Event::Message { header, data } if header.kind == ttrpc::TYPE_RESPONSE => (
                header.stream_id,
                pb::Response::decode(data.as_slice())
                    .map_err(|e| CallError::Malformed(e.to_string())),
            ),
            Event::Message { header, .. } => {
                tracing::debug!(
                    stream = header.stream_id,
                    kind = header.kind,
                    "NRI: non-response message on the runtime connection ignored"
                );
                return;
            }
        };
        let waiter = self.pending.lock().ok().and_then(|mut p| p.remove(&sid));
        match waiter {
            Some(tx) => {
                let _ = tx.send(reply);
            }
            None => tracing::debug!(stream = sid, "NRI: answer to no pending call ignored"),
        }
    }
}

/// Serve one request; a panic in the handler becomes an INTERNAL answer (the runtime must get an
/// answer: without one it waits for its timeout and then drops the plugin).
fn serve_one(serve: &Serve, sid: u32, req: &pb::Request) -> Vec<u8> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve(&req.service, &req.method, &req.payload)
    }));
    match r {
        Ok(Ok(payload)) => ttrpc::ok_response(sid, payload),
        Ok(Err((c, message))) => ttrpc::error_response(sid, c, &message),
        Err(_) => {
            tracing::error!(method = %req.method, "NRI: request handler panicked");
            ttrpc::error_response(
                sid,
                code::INTERNAL,
                "gpufence nri: internal error handling the request",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A connection whose peer is the test: (conn, peer socket, reader thread).
    fn pair(serve: Serve) -> (Arc<Conn>, UnixStream, std::thread::JoinHandle<MuxError>) {
        let (a, b) = UnixStream::pair().unwrap();
        let (conn, r) = Conn::new(a).unwrap();
        let c2 = Arc::clone(&conn);
        let t = std::thread::spawn(move || c2.run_reader(r, serve));
        (conn, b, t)
    }

    fn echo() -> Serve {
        Arc::new(|service: &str, method: &str, payload: &[u8]| match method {
            "Echo" => Ok(payload.to_vec()),
            "Refuse" => Err((code::UNKNOWN, format!("{service}: no"))),
            "Panic" => panic!("handler bug"),
            "Slow" => {
                std::thread::sleep(Duration::from_millis(300));
                Ok(b"slow".to_vec())
            }
            _ => Err((code::UNIMPLEMENTED, method.to_string())),
        })
    }

    /// The next whole ttrpc message the peer receives on `conn_id`.
    fn recv(peer: &mut UnixStream, d: &mut Decoder) -> (ttrpc::Header, Vec<u8>) {
        loop {
            let f = mux::read_frame(peer).unwrap();
            assert!(f.payload.len() <= mux::WRITE_CHUNK);
            if let Some(Event::Message { header, data }) = d.push(&f.payload).into_iter().next() {
                return (header, data);
            }
        }
    }

    fn request(sid: u32, method: &str, payload: &[u8]) -> Vec<u8> {
        let r = pb::Request {
            service: "svc".into(),
            method: method.into(),
            payload: payload.to_vec(),
            ..Default::default()
        };
        let m = ttrpc::encode(sid, ttrpc::TYPE_REQUEST, 0, &r.encode_to_vec()).unwrap();
        mux::encode_frames(PLUGIN_SERVICE_CONN, &m)
    }

    fn status(data: &[u8]) -> (i32, String, Vec<u8>) {
        let r = pb::Response::decode(data).unwrap();
        let s = r.status.unwrap_or_default();
        (s.code, s.message, r.payload)
    }

    #[test]
    fn serves_requests_and_survives_bad_ones() {
        let (_conn, mut peer, _t) = pair(echo());
        let mut d = Decoder::default();
        // Garbage in a well-framed request, an even stream id, then good requests.
        let m = ttrpc::encode(1, ttrpc::TYPE_REQUEST, 0, &[0xff, 0xff, 0xff]).unwrap();
        peer.write_all(&mux::encode_frames(PLUGIN_SERVICE_CONN, &m))
            .unwrap();
        let (h, data) = recv(&mut peer, &mut d);
        assert_eq!((h.stream_id, status(&data).0), (1, code::INVALID_ARGUMENT));
        peer.write_all(&request(2, "Echo", b"x")).unwrap();
        let (h, data) = recv(&mut peer, &mut d);
        assert_eq!((h.stream_id, status(&data).0), (2, code::INVALID_ARGUMENT));
        peer.write_all(&request(3, "Panic", b"")).unwrap();
        let (h, data) = recv(&mut peer, &mut d);
        assert_eq!((h.stream_id, status(&data).0), (3, code::INTERNAL));
        peer.write_all(&request(5, "Refuse", b"")).unwrap();
        let (_, data) = recv(&mut peer, &mut d);
        assert_eq!(status(&data).0, code::UNKNOWN);
        assert_eq!(status(&data).1, "svc: no");
        // A large payload comes back in frames of at most 4096 bytes.
        let big = vec![7u8; 100_000];
        peer.write_all(&request(7, "Echo", &big)).unwrap();
        let (h, data) = recv(&mut peer, &mut d);
        assert_eq!(h.stream_id, 7);
        assert_eq!(status(&data), (0, String::new(), big));
    }

    #[test]
    fn a_slow_request_does_not_hold_up_the_next() {
        let (_conn, mut peer, _t) = pair(echo());
        let mut d = Decoder::default();
        peer.write_all(&request(1, "Slow", b"")).unwrap();
        peer.write_all(&request(3, "Echo", b"fast")).unwrap();
        let (h, _) = recv(&mut peer, &mut d);
        assert_eq!(h.stream_id, 3, "the fast answer comes first");
        let (h, data) = recv(&mut peer, &mut d);
        assert_eq!((h.stream_id, status(&data).2), (1, b"slow".to_vec()));
    }

    #[test]
    fn an_oversized_request_is_refused_and_the_next_is_served() {
        let (_conn, mut peer, _t) = pair(echo());
        let mut d = Decoder::default();
        let len = ttrpc::MAX_DATA + 100;
        let mut m = (len as u32).to_be_bytes().to_vec();
        m.extend(9u32.to_be_bytes());
        m.extend([ttrpc::TYPE_REQUEST, 0]);
        m.extend(vec![0u8; len]);
        // Written by another thread: the reader answers while the rest is still arriving.
        let mut w = peer.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            w.write_all(&mux::encode_frames(PLUGIN_SERVICE_CONN, &m))
                .unwrap();
            w.write_all(&request(11, "Echo", b"after")).unwrap();
        });
        let (h, data) = recv(&mut peer, &mut d);
        assert_eq!(
            (h.stream_id, status(&data).0),
            (9, code::RESOURCE_EXHAUSTED)
        );
        let (h, data) = recv(&mut peer, &mut d);
        assert_eq!((h.stream_id, status(&data).2), (11, b"after".to_vec()));
        writer.join().unwrap();
    }

    #[test]
    fn calls_get_their_answer_by_stream_id_and_fail_when_the_peer_goes() {
        let (conn, mut peer, t) = pair(echo());
        let c2 = Arc::clone(&conn);
        let caller = std::thread::spawn(move || {
            c2.call(
                "nri.Runtime",
                "RegisterPlugin",
                b"req".to_vec(),
                Duration::from_secs(5),
            )
        });
        // The runtime side: read the request, answer it.
        let mut d = Decoder::default();
        let (h, data) = recv(&mut peer, &mut d);
        assert_eq!(h.kind, ttrpc::TYPE_REQUEST);
        assert_eq!(h.stream_id % 2, 1);
        let req = pb::Request::decode(data.as_slice()).unwrap();
        assert_eq!(
            (req.service.as_str(), req.method.as_str()),
            ("nri.Runtime", "RegisterPlugin")
        );
        // An answer to another stream first (ignored), then ours.
        for sid in [h.stream_id + 100, h.stream_id] {
            let m = ttrpc::ok_response(sid, b"ok".to_vec());
            peer.write_all(&mux::encode_frames(RUNTIME_SERVICE_CONN, &m))
                .unwrap();
        }
        assert_eq!(caller.join().unwrap(), Ok(b"ok".to_vec()));
        // An error status reaches the caller.
        let c2 = Arc::clone(&conn);
        let caller = std::thread::spawn(move || c2.call("s", "m", vec![], Duration::from_secs(5)));
        let (h, _) = recv(&mut peer, &mut d);
        let m = ttrpc::error_response(h.stream_id, code::INVALID_ARGUMENT, "bad name");
        peer.write_all(&mux::encode_frames(RUNTIME_SERVICE_CONN, &m))
            .unwrap();
        assert_eq!(
            caller.join().unwrap(),
            Err(CallError::Status {
                code: code::INVALID_ARGUMENT,
                message: "bad name".into()
            })
        );
        // No answer: a timeout; then the peer leaves: the reader ends, calls fail at once.
        assert_eq!(
            conn.call("s", "m", vec![], Duration::from_millis(100)),
            Err(CallError::Timeout(Duration::from_millis(100)))
        );
        drop(peer);
        assert!(matches!(t.join().unwrap(), MuxError::Closed));
        assert_eq!(
            conn.call("s", "m", vec![], Duration::from_secs(5)),
            Err(CallError::Closed)
        );
    }

    #[test]
    fn an_oversized_frame_ends_the_connection() {
        let (conn, mut peer, t) = pair(echo());
        let mut m = PLUGIN_SERVICE_CONN.to_be_bytes().to_vec();
        m.extend(((mux::MAX_PAYLOAD + 1) as u32).to_be_bytes());
        peer.write_all(&m).unwrap();
        assert!(matches!(t.join().unwrap(), MuxError::Oversized { .. }));
        assert!(conn.is_closed());
        let mut rest = Vec::new();
        peer.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }
}
