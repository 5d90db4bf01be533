use super::*;

#[tokio::test]
async fn serves_metrics_over_http() {
    let listener = bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(Mutex::new(Metrics::default()));
    let server = tokio::spawn(serve(listener, metrics));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(
        response.contains("openim_observer_events_total"),
        "{response}"
    );
    server.abort();
}
async fn get(addr: std::net::SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn the_format_follows_accept_and_readyz_waits_for_attachment() {
    let listener = bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Metrics::default();
    let readiness = metrics.readiness();
    let server = tokio::spawn(serve(listener, Arc::new(Mutex::new(metrics))));
    let openmetrics = get(
        addr,
        "GET /metrics HTTP/1.1\r\nAccept: \
            application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n",
    )
    .await;
    assert!(
        openmetrics.contains(
            "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
        ),
        "{openmetrics}"
    );
    assert!(openmetrics.contains("# TYPE openim_observer_events counter\n"));
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    let text = get(addr, "GET /metrics HTTP/1.1\r\n\r\n").await;
    assert!(
        text.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{text}"
    );
    assert!(text.contains("# TYPE openim_observer_events_total counter\n"));
    assert!(!text.contains("# EOF"), "{text}");
    let readyz = "GET /readyz HTTP/1.1\r\n\r\n";
    assert!(get(addr, readyz).await.starts_with("HTTP/1.1 503"));
    readiness.set_waiting_for_pods(true);
    readiness.set_attached();
    assert!(get(addr, readyz).await.starts_with("HTTP/1.1 503"));
    readiness.set_waiting_for_pods(false);
    assert!(get(addr, readyz).await.starts_with("HTTP/1.1 200"));
    let healthz = get(addr, "GET /healthz HTTP/1.1\r\n\r\n").await;
    assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    server.abort();
}
