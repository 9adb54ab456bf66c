//! The `Idempotency-Key` header carries any call key: a trigger's dedup
//! key or an API work id may hold non-ASCII text or control characters,
//! which a header cannot, so the key's bytes outside visible ASCII (and
//! `%`) go out percent-encoded (`tools::endpoint::header_key`). Found by a
//! review: raw UTF-8 bytes went out (the product's own webhook sink
//! dropped the request: the irreversible call's fate became unknown), and
//! a newline failed every HTTP tool call of the turn with an error that
//! named neither the header nor the key.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

use durable_agent::world::Outbox;
use durable_agent_cli::config::HttpToolConfig;
use durable_agent_cli::tools::HttpOutbox;
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::json;

fn send_email(url: &str) -> HttpToolConfig {
    HttpToolConfig {
        name: "send_email".into(),
        description: "Send an email.".into(),
        method: "POST".into(),
        url: url.into(),
        headers: Default::default(),
        allow_hosts: vec![],
        parameters: json!({"type": "object"}),
        irreversible: true,
        dedup: true,
        timeout_ms: 3_000,
    }
}

/// The key of the first call of a turn fired by the trigger `dedup_key`
/// (as `work_idempotency_key` forms it).
fn trigger_key(dedup_key: &str) -> String {
    format!("trigger:{dedup_key}-r0-c0-be84f7cd7ade07bb@ee23863900000002")
}

/// One request's raw head, answered `200 {"id":"x-1"}`.
/// A server's URL and the request head it will capture.
type Captured = (String, mpsc::Receiver<Vec<u8>>);

fn capture_one() -> Result<Captured, Box<dyn std::error::Error>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/send", listener.local_addr()?);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let _ = s.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\n{\"id\":\"x-1\"}\n",
        );
        let _ = tx.send(head);
    });
    Ok((url, rx))
}

#[test]
fn a_trigger_dedup_key_with_an_accent_gives_a_valid_ascii_idempotency_key(
) -> Result<(), Box<dyn std::error::Error>> {
    let key = trigger_key("rappel-réunion-lundi");
    let (url, head) = capture_one()?;
    let sent = HttpOutbox::new(&send_email(&url)).send(&key, "send_email", &json!({"to": "ada@example.com"}));
    assert!(sent.is_ok(), "{sent:?}");
    let head = head.recv_timeout(Duration::from_secs(5))?;
    let line = head
        .split(|b| *b == b'\n')
        .find(|l| l.to_ascii_lowercase().starts_with(b"idempotency-key:"))
        .ok_or("no Idempotency-Key header")?;
    assert!(
        line.iter().all(|b| b.is_ascii()),
        "the Idempotency-Key carries raw non-ASCII bytes: {:?}",
        String::from_utf8_lossy(line)
    );

    // The product's own stand-in for the email API drops such a request:
    // the irreversible call's fate is unknown (a human must confirm it at
    // an endpoint without dedup), though nothing is wrong with the call.
    let sink = WebhookSink::start("127.0.0.1:0".parse()?, true)?;
    let sent = HttpOutbox::new(&send_email(&sink.url("/send"))).send(
        &key,
        "send_email",
        &json!({"to": "ada@example.com"}),
    );
    assert!(
        sent.is_ok(),
        "webhook-sink: {sent:?} ({} deliveries)",
        sink.deliveries_len()
    );
    Ok(())
}

#[test]
fn a_work_id_with_a_control_character_is_sent_under_its_encoded_key() -> Result<(), Box<dyn std::error::Error>>
{
    // `POST /agents/a/turn {"prompt": "...", "work_id": "order\n42"}` is
    // accepted; every HTTP tool call of that turn must still go out.
    let key = "api:order\n42-r0-c0-be84f7cd7ade07bb@ee23863900000002".to_string();
    let sink = WebhookSink::start("127.0.0.1:0".parse()?, true)?;
    let sent = HttpOutbox::new(&send_email(&sink.url("/send"))).send(
        &key,
        "send_email",
        &json!({"to": "ada@example.com"}),
    );
    assert!(sent.is_ok(), "{sent:?}");
    assert_eq!(sink.deliveries_len(), 1);
    // Sent again (a retry, a resume): the same header, so the endpoint
    // deduplicates it.
    let again = HttpOutbox::new(&send_email(&sink.url("/send"))).send(
        &key,
        "send_email",
        &json!({"to": "ada@example.com"}),
    );
    assert!(again.is_ok(), "{again:?}");
    assert_eq!(
        sink.deliveries_len(),
        1,
        "the same key, encoded the same way, is one delivery"
    );
    Ok(())
}
