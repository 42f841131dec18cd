//! The HTTP side of `rredcot serve`: hyper serves the connections on a small tokio runtime of its
//! own thread, reads each request whole and hands it to the model thread, which answers it when
//! its batch is generated.
//!
//! Every connection is a task of its own, so a client that keeps idle keep-alive connections open
//! (a pooled HTTP client, as the judge's and OpenAI's are) never holds up another connection's
//! request. tiny_http, used before, served connections from a thread pool that could leave a new
//! connection queued, unread, while every pool thread waited on an idle one: the request "never
//! reached the server's loop" until some other connection closed.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming as Body};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

/// A request read whole, waiting for its answer.
pub struct Incoming {
    pub method: Method,
    /// The URL's path, without the query.
    pub path: String,
    /// The body, or why it could not be read (too large, the client went away).
    pub body: Result<Vec<u8>, String>,
    /// When its last byte arrived.
    pub received: Instant,
    answer: oneshot::Sender<(u16, String)>,
}

impl Incoming {
    /// Answers with a JSON body. The client may be gone (timed out): nothing to do about it.
    pub fn respond(self, status: u16, json: &serde_json::Value) {
        let _ = self.answer.send((status, json.to_string()));
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
async fn pass_on(req: Request<Body>, tx: mpsc::Sender<Incoming>, max_body: usize) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let body = match Limited::new(req.into_body(), max_body).collect().await {
        Ok(b) => Ok(b.to_bytes().to_vec()),
        Err(e) => Err(if e.is::<http_body_util::LengthLimitError>() { format!("the body is over {max_body} bytes") } else { e.to_string() }),
    };
    let (answer, answered) = oneshot::channel();
    let sent = tx.send(Incoming { method, path, body, received: Instant::now(), answer });
    let (status, json) = match (sent, answered.await) {
        (Ok(()), Ok(a)) => a,
        // The model thread is gone (the server is stopping).
        _ => (503, serde_json::json!({ "error": { "message": "the server is stopping", "type": "server_error", "code": 503 } }).to_string()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(json)));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
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
