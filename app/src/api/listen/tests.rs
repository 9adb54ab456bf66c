//! The listener on its own (a fake worker behind [`Ask`]), with raw HTTP
//! on loopback: what the gate answers before a body is read, the bound
//! on waiting requests, keep-alive, a streamed turn's chunked body, and
//! the shutdown order. The daemon end to end is app/tests/{access,
//! serve,streaming}.rs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::*;
use crate::access::Token;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TOKEN: &str = "0123456789abcdef0123";

/// Every wait here gives up after this.
const PATIENCE: Duration = Duration::from_secs(10);

/// A listener on loopback whose gate takes [`TOKEN`] and bodies up to
/// `max_body_bytes`, handing requests to `ask`.
fn listener(ask: Ask, max_body_bytes: u64) -> Result<Listener, ListenError> {
    let bound = Listener::bind(SocketAddr::from(([127, 0, 0, 1], 0)), Exposure::Loopback)?;
    let gate = Gate::new(Token::new(TOKEN), bound.addr(), max_body_bytes);
    bound.serve(gate, Progress::quiet(), ask)
}

/// A worker that answers every request at once with `{"ok": true}`,
/// counting them.
fn answering(count: Arc<AtomicUsize>) -> Ask {
    Arc::new(move |envelope: Envelope| {
        count.fetch_add(1, Ordering::SeqCst);
        let _ = envelope.reply.send(Ok(json!({"ok": true})));
        Ok(())
    })
}

/// A worker that keeps every request unanswered until the test says.
fn holding(held: Arc<Mutex<Vec<Envelope>>>) -> Ask {
    Arc::new(move |envelope: Envelope| {
        held.lock().map_err(|_| WorkerGone)?.push(envelope);
        Ok(())
    })
}

fn held_len(held: &Mutex<Vec<Envelope>>) -> usize {
    held.lock().map(|h| h.len()).unwrap_or(0)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> TestResult {
    let started = Instant::now();
    while !cond() {
        if started.elapsed() > PATIENCE {
            return Err(format!("timed out waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// `head` (request line and headers, no blank line) with the right Host
/// and the token.
fn authorized(addr: SocketAddr, request_line: &str) -> String {
    format!("{request_line}\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}")
}

/// One response as read off the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// Lower-cased names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client connection.
struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(PATIENCE))?;
        Ok(Client {
            reader: BufReader::new(stream),
        })
    }

    fn send(&mut self, head: &str, body: &[u8]) -> std::io::Result<()> {
        let stream = self.reader.get_mut();
        stream.write_all(format!("{head}\r\n\r\n").as_bytes())?;
        stream.write_all(body)?;
        stream.flush()
    }

    /// One response: its head, and its body by `Content-Length` or
    /// chunked framing (the chunks' bytes joined; the terminal chunk
    /// must come).
    fn answer(&mut self) -> Result<Answer, Box<dyn std::error::Error>> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status line: {line:?}"))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let Some((name, value)) = line.trim_end().split_once(':') else {
                break;
            };
            headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
        }
        let mut answer = Answer {
            status,
            headers,
            body: Vec::new(),
        };
        if answer.header("transfer-encoding") == Some("chunked") {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim(), 16)?;
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                answer.body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(length) = answer.header("content-length") {
            let mut body = vec![0; length.parse()?];
            self.reader.read_exact(&mut body)?;
            answer.body = body;
        }
        Ok(answer)
    }

    /// Whether the server closed the connection (EOF, or a reset: a
    /// server that answered before reading the body may reset).
    fn closed_by_server(&mut self) -> bool {
        let mut rest = Vec::new();
        match self.reader.read_to_end(&mut rest) {
            Ok(_) => rest.is_empty(),
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[test]
fn a_refusal_comes_before_the_body_is_read_and_closes_the_connection() -> TestResult {
    let asked = Arc::new(AtomicUsize::new(0));
    let api = listener(answering(asked.clone()), 100)?;
    let addr = api.addr();
    let post = |auth: bool, length: usize| {
        let head = if auth {
            authorized(addr, "POST /agents HTTP/1.1")
        } else {
            format!("POST /agents HTTP/1.1\r\nHost: {addr}")
        };
        format!("{head}\r\nContent-Type: application/json\r\nContent-Length: {length}")
    };
    // (declared length, token?) → status; not a byte of the body is sent,
    // so an answer at all proves it came before the body was read.
    for (length, auth, want) in [(10, false, 401), (101, true, 413), (1 << 30, true, 413)] {
        let started = Instant::now();
        let mut client = Client::connect(addr)?;
        client.send(&post(auth, length), b"")?;
        let answer = client.answer()?;
        assert_eq!(answer.status, want, "{}", answer.text());
        assert_eq!(answer.header("connection"), Some("close"), "{answer:?}");
        assert_eq!(
            answer.header("content-type"),
            Some("application/json"),
            "{answer:?}"
        );
        assert!(
            client.closed_by_server(),
            "the connection stayed open after a refusal"
        );
        assert!(started.elapsed() < PATIENCE / 2, "{:?}", started.elapsed());
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "a refused request reached the worker"
    );
    Ok(())
}

#[test]
fn a_chunked_body_is_cut_at_the_limit() -> TestResult {
    let asked = Arc::new(AtomicUsize::new(0));
    let api = listener(answering(asked.clone()), 100)?;
    let mut client = Client::connect(api.addr())?;
    let head = authorized(api.addr(), "POST /agents HTTP/1.1");
    let chunk = [b'x'; 60];
    let mut body = Vec::new();
    for _ in 0..2 {
        body.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        body.extend_from_slice(&chunk);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    client.send(
        &format!("{head}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"),
        &body,
    )?;
    let answer = client.answer()?;
    assert_eq!(answer.status, 413, "{}", answer.text());
    assert_eq!(answer.header("connection"), Some("close"));
    assert_eq!(asked.load(Ordering::SeqCst), 0);
    Ok(())
}

#[test]
fn an_answered_request_keeps_its_connection_for_the_next() -> TestResult {
    let asked = Arc::new(AtomicUsize::new(0));
    let api = listener(answering(asked.clone()), 100)?;
    let mut client = Client::connect(api.addr())?;
    for _ in 0..3 {
        client.send(&authorized(api.addr(), "GET /status HTTP/1.1"), b"")?;
        let answer = client.answer()?;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("connection"), None, "{answer:?}");
        assert_eq!(
            serde_json::from_slice::<Value>(&answer.body)?,
            json!({"ok": true})
        );
    }
    // A request the router refuses (its body was read: the connection
    // is kept) never reaches the worker.
    let head = authorized(api.addr(), "POST /agents HTTP/1.1");
    client.send(
        &format!("{head}\r\nContent-Type: application/json\r\nContent-Length: 4"),
        b"nope",
    )?;
    let answer = client.answer()?;
    assert_eq!(answer.status, 400, "{}", answer.text());
    client.send(&authorized(api.addr(), "GET /status HTTP/1.1"), b"")?;
    assert_eq!(client.answer()?.status, 200);
    assert_eq!(asked.load(Ordering::SeqCst), 4);
    Ok(())
}

#[test]
fn past_the_waiting_bound_a_request_is_answered_503_at_once() -> TestResult {
    let held = Arc::new(Mutex::new(Vec::new()));
    let api = listener(holding(held.clone()), 100)?;
    let mut waiting = Vec::new();
    for _ in 0..MAX_WAITING_REQUESTS {
        let mut client = Client::connect(api.addr())?;
        client.send(&authorized(api.addr(), "GET /status HTTP/1.1"), b"")?;
        waiting.push(client);
    }
    wait_for("every request to reach the worker", || {
        held_len(&held) == MAX_WAITING_REQUESTS
    })?;
    let mut late = Client::connect(api.addr())?;
    late.send(&authorized(api.addr(), "GET /status HTTP/1.1"), b"")?;
    let answer = late.answer()?;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert!(answer.text().contains("too many requests"), "{}", answer.text());
    assert_eq!(
        held_len(&held),
        MAX_WAITING_REQUESTS,
        "the 503 reached the worker"
    );
    // Answered, the waiting ones free their slots.
    for envelope in held.lock().map_err(|_| "poisoned")?.drain(..) {
        let _ = envelope.reply.send(Ok(json!({"ok": true})));
    }
    for client in &mut waiting {
        assert_eq!(client.answer()?.status, 200);
    }
    let mut again = Client::connect(api.addr())?;
    again.send(&authorized(api.addr(), "GET /status HTTP/1.1"), b"")?;
    wait_for("the next request to reach the worker", || held_len(&held) == 1)?;
    // Dropped unanswered (503): the listener's drop has nothing to wait for.
    held.lock().map_err(|_| "poisoned")?.clear();
    assert_eq!(again.answer()?.status, 503);
    Ok(())
}

#[test]
fn a_request_the_worker_drops_unanswered_is_503_and_its_outcome_unknown() -> TestResult {
    let api = listener(Arc::new(|_envelope: Envelope| Ok(())), 100)?;
    let mut client = Client::connect(api.addr())?;
    client.send(&authorized(api.addr(), "GET /status HTTP/1.1"), b"")?;
    let answer = client.answer()?;
    assert_eq!(answer.status, 503);
    assert!(answer.text().contains("outcome is unknown"), "{}", answer.text());
    let gone = listener(Arc::new(|_envelope: Envelope| Err(WorkerGone)), 100)?;
    let mut client = Client::connect(gone.addr())?;
    client.send(&authorized(gone.addr(), "GET /status HTTP/1.1"), b"")?;
    let answer = client.answer()?;
    assert_eq!(answer.status, 503);
    assert!(answer.text().contains("shutting down"), "{}", answer.text());
    Ok(())
}

#[test]
fn a_streamed_turn_is_a_chunked_body_that_ends_with_its_end_event() -> TestResult {
    // The agent's view is refused (no subscription: no steps), the turn
    // answered once the test says: the stream's head comes first.
    let held = Arc::new(Mutex::new(Vec::new()));
    let ask: Ask = {
        let held = held.clone();
        Arc::new(move |envelope: Envelope| {
            if matches!(envelope.request, Request::View(_)) {
                let _ = envelope.reply.send(Err(OpError::NotFound("no agent a".into())));
                return Ok(());
            }
            held.lock().map_err(|_| WorkerGone)?.push(envelope);
            Ok(())
        })
    };
    let api = listener(ask, 100)?;
    let mut client = Client::connect(api.addr())?;
    let head = authorized(api.addr(), "POST /agents/a/turn?stream=1 HTTP/1.1");
    let body = br#"{"prompt":"hi"}"#;
    client.send(
        &format!(
            "{head}\r\nContent-Type: application/json\r\nContent-Length: {}",
            body.len()
        ),
        body,
    )?;
    wait_for("the turn to reach the worker", || held_len(&held) == 1)?;
    for envelope in held.lock().map_err(|_| "poisoned")?.drain(..) {
        let _ = envelope.reply.send(Ok(json!({"response": "hello"})));
    }
    let answer = client.answer()?;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("transfer-encoding"), Some("chunked"), "{answer:?}");
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    assert_eq!(answer.header("cache-control"), Some("no-cache"));
    let end = json!({"status": 200, "body": {"response": "hello"}});
    assert_eq!(answer.text(), crate::api::stream::event_text("end", &end));
    // The connection is kept for the next request.
    client.send(&authorized(api.addr(), "GET /nope HTTP/1.1"), b"")?;
    assert_eq!(client.answer()?.status, 404);
    Ok(())
}

#[test]
fn shutdown_stops_accepting_and_lets_the_request_in_hand_finish() -> TestResult {
    let held = Arc::new(Mutex::new(Vec::new()));
    let api = listener(holding(held.clone()), 100)?;
    let addr = api.addr();
    let mut in_hand = Client::connect(addr)?;
    in_hand.send(&authorized(addr, "GET /status HTTP/1.1"), b"")?;
    // Connected, idle: closed at once by the shutdown.
    let mut idle = Client::connect(addr)?;
    wait_for("the request to reach the worker", || held_len(&held) == 1)?;
    let shutdown = std::thread::spawn(move || {
        let started = Instant::now();
        api.shutdown(PATIENCE);
        started.elapsed()
    });
    wait_for("the listener to stop accepting", || {
        TcpStream::connect(addr).is_err()
    })?;
    assert!(idle.closed_by_server(), "an idle connection stayed open");
    assert!(!shutdown.is_finished(), "shutdown did not wait for the request");
    for envelope in held.lock().map_err(|_| "poisoned")?.drain(..) {
        let _ = envelope.reply.send(Ok(json!({"ok": true})));
    }
    let answer = in_hand.answer()?;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let took = shutdown.join().map_err(|_| "shutdown panicked")?;
    assert!(took < PATIENCE, "shutdown waited out its grace: {took:?}");
    Ok(())
}

#[test]
fn shutdown_cuts_what_outlasts_its_grace() -> TestResult {
    let held = Arc::new(Mutex::new(Vec::new()));
    let api = listener(holding(held.clone()), 100)?;
    let mut stuck = Client::connect(api.addr())?;
    stuck.send(&authorized(api.addr(), "GET /status HTTP/1.1"), b"")?;
    wait_for("the request to reach the worker", || held_len(&held) == 1)?;
    let started = Instant::now();
    api.shutdown(Duration::from_millis(200));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(stuck.closed_by_server(), "the connection outlived the runtime");
    Ok(())
}

#[test]
fn a_non_loopback_address_needs_its_exposure_said() {
    let any = SocketAddr::from(([0, 0, 0, 0], 0));
    assert!(matches!(
        Listener::bind(any, Exposure::Loopback),
        Err(ListenError::NotLoopback { .. })
    ));
}
