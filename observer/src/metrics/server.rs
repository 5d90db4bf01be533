//! Serves the HTTP endpoint on `--metrics-addr`: `/metrics` in the format the scraper asks for,
//! `/healthz` and `/readyz`, bounded in connections and time, and still answering when the
//! process runs out of file descriptors.

use std::{
    fs::File,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

use super::{Format, Metrics, MetricsError};

/// Binds the metrics address now, so a bad address is a startup error rather than a silent
/// background failure.
///
/// # Errors
///
/// Fails with [`MetricsError::Bind`] when the address cannot be bound (bad address, in use, or not
/// permitted).
pub async fn bind(addr: &str) -> Result<TcpListener, MetricsError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind {
            addr: addr.to_owned(),
            source,
        })
}

/// Bounds the connections served at once: each holds a descriptor, and the endpoint must not be the
/// way a neighbour exhausts the observer's.
const MAX_CONCURRENT_CONNECTIONS: usize = 64;
/// Bounds one connection's whole exchange; a scraper that stalls must not hold its slot longer.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);
/// Bounds, under descriptor exhaustion, how long the one connection the reserve lets in may take.
const RESERVE_DEADLINE: Duration = Duration::from_millis(500);
/// Bounds the pauses after a failed accept, doubling from the first to the last while failures
/// repeat.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Serves `GET /metrics`, `/healthz` (liveness) and `/readyz` (readiness) until the task is
/// dropped.
///
/// A failed `accept` (no descriptor left, in this process or the system) is counted and
/// followed by a pause, so that it cannot spin a core. One descriptor is held in reserve: on
/// exhaustion it is given up to let one waiting connection in and answer it, so probes are
/// still answered while something else holds every descriptor.
pub async fn serve(listener: TcpListener, metrics: Arc<Mutex<Metrics>>) {
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT_CONNECTIONS));
    let mut reserve = File::open("/dev/null").ok();
    let mut backoff = ACCEPT_BACKOFF.0;
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF.0;
                let metrics = Arc::clone(&metrics);
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(CONNECTION_DEADLINE, answer(stream, &metrics)).await;
                    drop(slot);
                });
            }
            Err(error) => {
                if let Ok(metrics) = metrics.lock() {
                    metrics.accept_errors.inc();
                }
                tracing::debug!(%error, "metrics endpoint cannot accept a connection");
                let out_of_descriptors =
                    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                if out_of_descriptors && reserve.take().is_some() {
                    let answer_one = async {
                        if let Ok((stream, _)) = listener.accept().await {
                            let _ = answer(stream, &metrics).await;
                        }
                    };
                    let _ = tokio::time::timeout(RESERVE_DEADLINE, answer_one).await;
                    reserve = File::open("/dev/null").ok();
                }
                drop(slot);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
            }
        }
    }
}

async fn answer(mut stream: TcpStream, metrics: &Mutex<Metrics>) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    // A request head is small; stop reading at 8 KiB whatever the peer sends.
    let (path, format) = loop {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buffer[..read]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&request) {
            Ok(httparse::Status::Complete(_)) => {
                let accept = parsed
                    .headers
                    .iter()
                    .find(|header| header.name.eq_ignore_ascii_case("accept"))
                    .and_then(|header| std::str::from_utf8(header.value).ok());
                break (
                    parsed.path.unwrap_or("/").to_owned(),
                    Format::negotiate(accept),
                );
            }
            Ok(httparse::Status::Partial) if request.len() < 8192 => {}
            _ => return respond(&mut stream, "400 Bad Request", PLAIN, "bad request\n").await,
        }
    };
    match path.as_str() {
        "/metrics" => {
            let body = metrics
                .lock()
                .map(|metrics| metrics.render_as(format))
                .unwrap_or_default();
            respond(&mut stream, "200 OK", format.content_type(), &body).await
        }
        "/healthz" => respond(&mut stream, "200 OK", PLAIN, "ok\n").await,
        "/readyz" => {
            let ready = metrics
                .lock()
                .is_ok_and(|metrics| metrics.readiness.is_ready());
            if ready {
                respond(&mut stream, "200 OK", PLAIN, "ready\n").await
            } else {
                let body = "not ready: programs not attached, or the pod list not loaded\n";
                respond(&mut stream, "503 Service Unavailable", PLAIN, body).await
            }
        }
        _ => respond(&mut stream, "404 Not Found", PLAIN, "try /metrics\n").await,
    }
}

/// Names the content type of the probes' and errors' bodies.
const PLAIN: &str = "text/plain; charset=utf-8";

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: \
        close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests;
