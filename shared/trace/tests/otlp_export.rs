//! The OTLP exporter's HTTP path against a real loopback HTTP server: a span of Sluice's is
//! POSTed as OTLP http/protobuf to the configured endpoint's `/v1/traces` by the exporter's own
//! HTTP client (the workspace's reqwest), and [`shutdown`] sends what was batched. The full
//! path through a real OpenTelemetry Collector is `tests/tests/traces.rs`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

use sluice_trace::export::{endpoint, layer, shutdown};
use tracing_subscriber::layer::SubscriberExt;

/// One request the server got.
#[derive(Debug)]
struct Received {
    request_line: String,
    content_type: Option<String>,
    body: Vec<u8>,
}

/// Answers every request `200 OK` and reports it; runs until the test process ends.
fn start_server() -> (String, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port is free");
    let address = listener
        .local_addr()
        .expect("a bound listener has an address");
    let (sender, received) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut content_type = None;
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.trim_end().split_once(':') {
                    match name.to_ascii_lowercase().as_str() {
                        "content-type" => content_type = Some(value.trim().to_owned()),
                        "content-length" => length = value.trim().parse().unwrap_or(0),
                        _ => {}
                    }
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let _ = reader
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = sender.send(Received {
                request_line: request_line.trim_end().to_owned(),
                content_type,
                body,
            });
        }
    });
    (format!("http://{address}"), received)
}

#[test]
fn a_span_is_posted_as_otlp_protobuf_to_the_configured_endpoint() {
    let (url, received) = start_server();
    let endpoint = endpoint(Some(&url)).expect("a configured endpoint is used");
    let layer = layer(&endpoint, "sluice-trace-test").expect("the exporter is built");
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!(target: "sluice_trace_test", "exported_span_name");
        span.in_scope(|| tracing::info!(target: "sluice_trace_test", "inside"));
    });
    shutdown();

    // Not a timing assertion: a bound on how long a broken exporter can hang the test.
    let request = received
        .recv_timeout(Duration::from_secs(60))
        .expect("the exporter sent the batch at shutdown");
    assert_eq!(request.request_line, "POST /v1/traces HTTP/1.1");
    assert_eq!(
        request.content_type.as_deref(),
        Some("application/x-protobuf")
    );
    let contains = |needle: &[u8]| request.body.windows(needle.len()).any(|w| w == needle);
    assert!(
        contains(b"exported_span_name"),
        "the span's name is in the payload"
    );
    assert!(
        contains(b"sluice-trace-test"),
        "the service name is in the payload"
    );
}
