//! The HTTP side of `rredcot serve`: hyper serves the connections on a small tokio runtime of its
//! own thread, reads each request whole and hands it to the model thread, which answers it when
//! its batch is generated, or streams the answer as server-sent events while it decodes.
//!
//! Every connection is a task of its own, so a client that keeps idle keep-alive connections open
//! (a pooled HTTP client, as the judge's and OpenAI's are) never holds up another connection's
//! request. tiny_http, used before, served connections from a thread pool that could leave a new
//! connection queued, unread, while every pool thread waited on an idle one: the request "never
//! reached the server's loop" until some other connection closed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::mpsc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as HttpBody, Bytes, Frame, Incoming as Body, SizeHint};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc as events, oneshot};

/// A request read whole, waiting for its answer.
pub struct Incoming {
    pub method: Method,
    /// The URL's path, without the query.
    pub path: String,
    /// The body, or why it could not be read (too large, the client went away).
    pub body: Result<Vec<u8>, String>,
    /// When its last byte arrived.
    pub received: Instant,
    answer: oneshot::Sender<Answer>,
}

/// What the model thread answers a request with.
enum Answer {
    /// Status and a whole JSON body.
    Whole(u16, String),
    /// Server-sent events, as the model thread writes them through an [`EventSink`].
    Events(events::UnboundedReceiver<Bytes>),
}

impl Incoming {
    /// Answers with a JSON body. The client may be gone (timed out): nothing to do about it.
    pub fn respond(self, status: u16, json: &serde_json::Value) {
        let _ = self.answer.send(Answer::Whole(status, json.to_string()));
    }

    /// Whether the client has gone: its connection closed before the answer (hyper drops a
    /// request's task when its connection closes, and with it the answer's receiver).
    pub fn is_gone(&self) -> bool {
        self.answer.is_closed()
    }

    /// Answers 200 with a stream of server-sent events (`text/event-stream`): the headers go out
    /// now, each event when it is sent through the returned sink, and the stream ends when the
    /// sink is dropped.
    pub fn respond_events(self) -> EventSink {
        let (tx, rx) = events::unbounded_channel();
        let _ = self.answer.send(Answer::Events(rx));
        EventSink { tx }
    }
}

/// The model thread's end of a streamed answer.
pub struct EventSink {
    tx: events::UnboundedSender<Bytes>,
}

impl EventSink {
    /// Sends one event, `data: JSON` (OpenAI's framing); false when the client has gone.
    pub fn send(&self, json: &serde_json::Value) -> bool {
        self.tx.send(Bytes::from(format!("data: {json}\n\n"))).is_ok()
    }

    /// Whether the client has gone (its connection closed).
    pub fn is_gone(&self) -> bool {
        self.tx.is_closed()
    }

    /// Ends the stream with OpenAI's last event, `data: [DONE]`.
    pub fn done(self) {
        let _ = self.tx.send(Bytes::from_static(b"data: [DONE]\n\n"));
    }
}

/// A response body: a whole one (its length known, so it goes out with `Content-Length`), or the
/// events the model thread sends until it drops its sink (chunked).
enum ReplyBody {
    Whole(Option<Bytes>),
    Events(events::UnboundedReceiver<Bytes>),
}

impl HttpBody for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ReplyBody::Whole(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ReplyBody::Events(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, ReplyBody::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReplyBody::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            ReplyBody::Events(_) => SizeHint::default(),
        }
    }
}

/// The listening side: requests come out of it in arrival order.
pub struct Front {
    requests: mpsc::Receiver<Incoming>,
    addr: SocketAddr,
}

impl Front {
    /// Listens on `host:port` (`port` 0 picks a free one) with `max_body` bytes the most a request
    /// body may have.
    pub fn bind(host: &str, port: u16, max_body: usize) -> Result<Front> {
        let listener = std::net::TcpListener::bind((host, port)).with_context(|| format!("cannot listen on {host}:{port}"))?;
        let addr = listener.local_addr().context("the listening address")?;
        listener.set_nonblocking(true).context("a non-blocking listener")?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().context("the HTTP runtime")?;
        let (tx, requests) = mpsc::channel();
        std::thread::Builder::new()
            .name("serve-http".into())
            .spawn(move || runtime.block_on(accept_loop(listener, tx, max_body)))
            .context("starting the HTTP thread")?;
        Ok(Front { requests, addr })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next request; blocks until one comes.
    pub fn recv(&self) -> Result<Incoming> {
        self.requests.recv().map_err(|_| anyhow!("the HTTP thread stopped"))
    }

    /// The next request if one comes within `wait` (`Duration::ZERO`: if one has come).
    pub fn recv_timeout(&self, wait: Duration) -> Result<Option<Incoming>> {
        match self.requests.recv_timeout(wait) {
            Ok(r) => Ok(Some(r)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(anyhow!("the HTTP thread stopped")),
        }
    }
}

async fn accept_loop(listener: std::net::TcpListener, tx: mpsc::Sender<Incoming>, max_body: usize) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!("serving the listener: {e}"),
    };
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of file descriptors and the like: the connections already open go on; wait a
            // little rather than spin.
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let tx = tx.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| pass_on(req, tx.clone(), max_body));
            if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
}

/// Reads a request's body, hands the request to the model thread and waits for its answer.
async fn pass_on(req: Request<Body>, tx: mpsc::Sender<Incoming>, max_body: usize) -> Result<Response<ReplyBody>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let body = match Limited::new(req.into_body(), max_body).collect().await {
        Ok(b) => Ok(b.to_bytes().to_vec()),
        Err(e) => Err(if e.is::<http_body_util::LengthLimitError>() { format!("the body is over {max_body} bytes") } else { e.to_string() }),
    };
    let (answer, answered) = oneshot::channel();
    let sent = tx.send(Incoming { method, path, body, received: Instant::now(), answer });
    let answer = match (sent, answered.await) {
        (Ok(()), Ok(a)) => a,
        // The model thread is gone (the server is stopping).
        _ => Answer::Whole(503, serde_json::json!({ "error": { "message": "the server is stopping", "type": "server_error", "code": 503 } }).to_string()),
    };
    let resp = match answer {
        Answer::Whole(status, json) => {
            let mut resp = Response::new(ReplyBody::Whole(Some(Bytes::from(json))));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            resp
        }
        Answer::Events(rx) => {
            let mut resp = Response::new(ReplyBody::Events(rx));
            resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            resp.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            resp
        }
    };
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    use std::sync::{Arc, Barrier};

    /// Sends one request on a kept-alive connection and reads its answer: (status, body).
    fn exchange(reader: &mut BufReader<TcpStream>, body: &str) -> std::io::Result<(u16, String)> {
        write!(reader.get_mut(), "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}", body.len())?;
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut len = 0;
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            if h == "\r\n" || h.is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut b = vec![0; len];
        reader.read_exact(&mut b)?;
        Ok((status, String::from_utf8_lossy(&b).into_owned()))
    }

    /// Many clients open kept-alive connections at once, and the server answers only when every
    /// request of a round has arrived (as a batch would): each must reach it while the others'
    /// connections stay open. tiny_http's pool left one connection unread in most such trials.
    #[test]
    fn every_request_of_simultaneous_keep_alive_connections_arrives() {
        const CLIENTS: usize = 16;
        const ROUNDS: usize = 2;
        for trial in 0..8 {
            let front = Front::bind("127.0.0.1", 0, 1 << 10).unwrap();
            let addr = front.addr();
            let start = Arc::new(Barrier::new(CLIENTS));
            let clients: Vec<_> = (0..CLIENTS)
                .map(|c| {
                    let start = start.clone();
                    std::thread::spawn(move || {
                        start.wait();
                        let stream = TcpStream::connect(addr).unwrap();
                        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                        let mut reader = BufReader::new(stream);
                        (0..ROUNDS).map(|r| exchange(&mut reader, &format!("{c}/{r}")).unwrap()).collect::<Vec<_>>()
                    })
                })
                .collect();
            for round in 0..ROUNDS {
                let mut batch = Vec::new();
                while batch.len() < CLIENTS {
                    let r = front.recv_timeout(Duration::from_secs(10)).unwrap();
                    let r = r.unwrap_or_else(|| panic!("trial {trial} round {round}: {} of {CLIENTS} requests arrived", batch.len()));
                    batch.push(r);
                }
                for r in batch {
                    assert_eq!((r.method.clone(), r.path.as_str()), (Method::POST, "/v1/completions"));
                    let body = String::from_utf8(r.body.clone().unwrap()).unwrap();
                    r.respond(200, &serde_json::json!({ "echo": body }));
                }
            }
            for (c, client) in clients.into_iter().enumerate() {
                let answers = client.join().unwrap();
                let want: Vec<(u16, String)> = (0..ROUNDS).map(|r| (200, format!("{{\"echo\":\"{c}/{r}\"}}"))).collect();
                assert_eq!(answers, want, "trial {trial}: client {c}");
            }
        }
    }

    /// Reads a response's status line and headers: (status, lower-cased header lines).
    fn head(reader: &mut BufReader<TcpStream>) -> (u16, Vec<String>) {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            if h == "\r\n" || h.is_empty() {
                return (status, headers);
            }
            headers.push(h.trim().to_ascii_lowercase());
        }
    }

    /// Reads one chunk of a chunked body (empty: the body ended).
    fn chunk(reader: &mut BufReader<TcpStream>) -> String {
        let mut size = String::new();
        reader.read_line(&mut size).unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        let mut b = vec![0; n + 2];
        reader.read_exact(&mut b).unwrap();
        String::from_utf8(b[..n].to_vec()).unwrap()
    }

    /// A streamed answer goes out event by event while the model thread still holds its sink (the
    /// client reads the first event before the second is written), as `text/event-stream`
    /// chunks ending with `[DONE]`; once the client has gone, sending says so.
    #[test]
    fn events_reach_the_client_as_they_are_sent_and_a_gone_client_is_noticed() {
        let front = Front::bind("127.0.0.1", 0, 1 << 10).unwrap();
        let addr = front.addr();
        let (got_first, first_seen) = mpsc::channel();
        let client = std::thread::spawn(move || {
            let stream = TcpStream::connect(addr).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut reader = BufReader::new(stream);
            write!(reader.get_mut(), "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{{}}").unwrap();
            let (status, headers) = head(&mut reader);
            let first = chunk(&mut reader);
            got_first.send(()).unwrap();
            let rest: Vec<String> = std::iter::from_fn(|| Some(chunk(&mut reader)).filter(|c| !c.is_empty())).collect();
            (status, headers, first, rest)
        });
        let r = front.recv_timeout(Duration::from_secs(10)).unwrap().expect("the request arrives");
        let sink = r.respond_events();
        assert!(sink.send(&serde_json::json!({ "n": 1 })));
        first_seen.recv_timeout(Duration::from_secs(10)).expect("the first event arrives before the second is sent");
        assert!(sink.send(&serde_json::json!({ "n": 2 })));
        sink.done();
        let (status, headers, first, rest) = client.join().unwrap();
        assert_eq!(status, 200);
        assert!(headers.contains(&"content-type: text/event-stream".to_string()) && headers.contains(&"transfer-encoding: chunked".to_string()), "{headers:?}");
        assert_eq!((first.as_str(), rest), ("data: {\"n\":1}\n\n", vec!["data: {\"n\":2}\n\n".to_string(), "data: [DONE]\n\n".to_string()]));

        // A client that hangs up mid-stream.
        let client = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{{}}").unwrap();
            let mut reader = BufReader::new(stream);
            head(&mut reader);
            chunk(&mut reader);
        });
        let r = front.recv_timeout(Duration::from_secs(10)).unwrap().expect("the request arrives");
        let sink = r.respond_events();
        assert!(sink.send(&serde_json::json!({ "n": 1 })));
        client.join().unwrap();
        let gone = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            !sink.send(&serde_json::json!({ "more": "x".repeat(1000) }))
        });
        assert!(gone, "sending to a client that hung up keeps succeeding");
    }

    /// A client that closes its connection while its request waits for an answer (a timeout) is
    /// seen gone, so its rows stop decoding; one that waits is not.
    #[test]
    fn a_request_whose_client_hung_up_is_seen_gone() {
        let front = Front::bind("127.0.0.1", 0, 1 << 10).unwrap();
        let addr = front.addr();
        let ask = || {
            let mut stream = TcpStream::connect(addr).unwrap();
            write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{{}}").unwrap();
            stream
        };
        let (waiting, leaving) = (ask(), ask());
        let a = front.recv_timeout(Duration::from_secs(10)).unwrap().expect("a request arrives");
        let b = front.recv_timeout(Duration::from_secs(10)).unwrap().expect("a request arrives");
        assert!(!a.is_gone() && !b.is_gone());
        drop(leaving);
        let t = Instant::now();
        while !(a.is_gone() || b.is_gone()) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(a.is_gone() != b.is_gone(), "exactly the request whose client hung up is gone");
        drop(waiting);
    }

    #[test]
    fn a_body_over_the_limit_reaches_the_loop_as_an_error_and_a_taken_port_is_told() {
        let front = Front::bind("127.0.0.1", 0, 8).unwrap();
        let addr = front.addr();
        assert_ne!(addr.port(), 0);
        let client = std::thread::spawn(move || exchange(&mut BufReader::new(TcpStream::connect(addr).unwrap()), "0123456789").unwrap());
        let r = front.recv_timeout(Duration::from_secs(10)).unwrap().expect("the request arrives");
        assert_eq!(r.body.clone().unwrap_err(), "the body is over 8 bytes");
        r.respond(400, &serde_json::json!({ "error": { "message": "too large" } }));
        assert_eq!(client.join().unwrap(), (400, r#"{"error":{"message":"too large"}}"#.to_string()));

        let taken = Front::bind("127.0.0.1", addr.port(), 8).err().expect("the port is taken");
        assert!(taken.to_string().contains(&format!("cannot listen on 127.0.0.1:{}", addr.port())), "{taken:#}");
    }
}
