//! The OTLP exporter's HTTP client: ureq (the provider's client, already
//! built) behind `opentelemetry_http::HttpClient`.
//!
//! Invariant: a request never takes longer than the configured timeout
//! (connect to the last byte of the answer, ureq's global timeout), and
//! an answer body is read to at most [`MAX_ANSWER_BYTES`]. It runs only on
//! the batch span processor's export thread, never on a turn's.

use std::io::Read;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use opentelemetry_http::{HttpClient, HttpError};

/// An OTLP answer is a small `ExportTraceServiceResponse`; more is a
/// misdirected endpoint (an HTML page), read no further.
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// A blocking client with a total timeout per request.
#[derive(Debug, Clone)]
pub struct UreqClient {
    timeout: Duration,
}

impl UreqClient {
    pub fn new(timeout: Duration) -> UreqClient {
        UreqClient { timeout }
    }
}

#[async_trait::async_trait]
impl HttpClient for UreqClient {
    // Blocking inside `async`: the batch processor drives exports with
    // `futures_executor::block_on` on its own thread, so nothing else
    // shares this executor.
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let url = request.uri().to_string();
        // No redirects: a redirected POST of traces could land elsewhere.
        let agent = crate::http::agent(&url, self.timeout, 0);
        let mut answer = agent.run(request.map(|body| body.to_vec()))?;
        let mut body = Vec::new();
        answer
            .body_mut()
            .as_reader()
            .take(MAX_ANSWER_BYTES)
            .read_to_end(&mut body)?;
        let (parts, _) = answer.into_parts();
        Ok(Response::from_parts(parts, Bytes::from(body)))
    }
}
