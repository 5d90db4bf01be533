//! Runs the msggateway-proxy pod: accepts client WebSockets on its own port (10002), hashes
//! `sendID` over its member list and relays the client to `ws://<member><original path and query>`
//! with `Host: <member>`.
//!
//! Restarts (scale-out) follow a graceful drain: on SIGTERM the proxy closes its listener, says
//! so, and keeps relaying the connections it has; the lab then starts the next proxy process in
//! the same pod, which binds :80 anew. Existing WebSockets stay on the gateways they were
//! placed on, as they do when a real proxy pod is replaced while clients stay connected.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use observer::openim::hashring::{
    MemberTemplate, PROXY_MEMBER_TEMPLATE, PUSH_MEMBER_TEMPLATE, Ring,
};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::lab::ProxyMode;
use crate::lab::control::{PodEvent, emit};
use crate::lab::gateway::WEBSOCKET_PORT;
use crate::lab::names::{GatewayDeployment, NameTable, split_port};

/// Numbers the port where clients reach the proxy. Not a gateway port: the observer watches gateway
/// ports only, and a client's upgrade to the proxy is no placement on a gateway.
pub const PROXY_PORT: u16 = 10002;
const HEAD_LIMIT: usize = 16 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
const DIAL_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(clap::Args, Debug, Clone)]
pub struct ProxyArgs {
    #[arg(long, value_enum)]
    pub mode: ProxyMode,
    #[command(flatten)]
    pub gateways: GatewayDeployment,
}

/// Says which gateway the proxy picks for a user and how it dials it.
#[derive(Debug, Clone)]
pub struct Route {
    /// The ring member the user hashes to.
    pub member: String,
    /// The WebSocket URL authority (`host` or `host:port`); also the `Host` header.
    pub dial: String,
}

/// Picks a user's gateway as the proxy does: a ring over its members, dialled as `mode` says.
pub struct Router {
    mode: ProxyMode,
    ring: Ring,
}

impl Router {
    /// Builds the ring over `replicas` members of `template`.
    ///
    /// # Errors
    ///
    /// Fails when `template` is not a member template.
    pub fn new(
        mode: ProxyMode,
        instance: &str,
        namespace: &str,
        replicas: usize,
    ) -> anyhow::Result<Self> {
        let template = match mode {
            ProxyMode::V351 => PROXY_MEMBER_TEMPLATE,
            ProxyMode::ReportFix | ProxyMode::Correct => PUSH_MEMBER_TEMPLATE,
        };
        let members = MemberTemplate::parse(template)?.members(instance, namespace, replicas);
        Ok(Self {
            mode,
            ring: Ring::new(members),
        })
    }

    /// Returns the gateway the proxy picks for `user_id`, and how it dials it.
    ///
    /// # Errors
    ///
    /// Fails when the ring is empty or the member's port is not a number.
    pub fn route(&self, user_id: &str) -> anyhow::Result<Route> {
        let member = self.ring.get(user_id)?.to_owned();
        let dial = match self.mode {
            // 3.5.1 and the report's fix dial the member string as it is.
            ProxyMode::V351 | ProxyMode::ReportFix => member.clone(),
            // The correct fix hashes on `…:88` but dials the WebSocket port.
            ProxyMode::Correct => split_port(&member, WEBSOCKET_PORT)?.0.to_owned(),
        };
        Ok(Route { member, dial })
    }
}

/// Serves the proxy pod until SIGTERM, relaying each client to its gateway.
///
/// # Errors
///
/// Fails when the router or name table cannot be built, or the proxy port or SIGTERM handler cannot
/// be set up.
pub async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let router = std::sync::Arc::new(Router::new(
        args.mode,
        &args.gateways.instance,
        &args.gateways.namespace,
        args.gateways.replicas,
    )?);
    let names = std::sync::Arc::new(NameTable::parse_arg(&args.gateways.names)?);
    let listener = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], PROXY_PORT)))
        .await
        .context("bind the proxy port")?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    emit(&PodEvent::Ready);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    // As Go's net package does for every TCP connection.
                    let _ = client.set_nodelay(true);
                    tokio::spawn(serve_client(client, router.clone(), names.clone()));
                }
                Err(error) => eprintln!("msggw-proxy: accept: {error}"),
            },
            _ = terminate.recv() => break,
        }
    }
    drop(listener);
    emit(&PodEvent::ListenerClosed);
    // Draining: relays are tasks of this runtime; the lab kills this process at the end.
    std::future::pending::<()>().await;
    Ok(())
}

/// Peeks at the request target (`/path?query`) of the client's upgrade, read without consuming it
/// so that the WebSocket handshake can still read the request afterwards.
async fn peek_request_target(client: &TcpStream) -> anyhow::Result<String> {
    let mut head = vec![0u8; HEAD_LIMIT];
    let peek = async {
        loop {
            let seen = client.peek(&mut head).await?;
            anyhow::ensure!(seen > 0, "client closed before its request");
            if head[..seen].windows(4).any(|window| window == b"\r\n\r\n") {
                return Ok(seen);
            }
            anyhow::ensure!(seen < HEAD_LIMIT, "request head over {HEAD_LIMIT} bytes");
            // Peeking returns at once while the partial head sits in the buffer: pause briefly.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let seen = tokio::time::timeout(HEAD_TIMEOUT, peek)
        .await
        .context("request head timed out")??;
    let head = std::str::from_utf8(&head[..seen]).context("request head not UTF-8")?;
    let target = head
        .lines()
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .context("no request line")?;
    Ok(target.to_owned())
}

fn send_id_of(target: &str) -> Option<&str> {
    let (_, query) = target.split_once('?')?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("sendID="))
        .filter(|id| !id.is_empty())
}

async fn refuse(mut client: TcpStream, status: &str) {
    let response = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

async fn serve_client(
    client: TcpStream,
    router: std::sync::Arc<Router>,
    names: std::sync::Arc<NameTable>,
) {
    let Ok(target) = peek_request_target(&client).await else {
        return refuse(client, "400 Bad Request").await;
    };
    let Some(user_id) = send_id_of(&target).map(str::to_owned) else {
        return refuse(client, "400 Bad Request").await;
    };
    let Ok(route) = router.route(&user_id) else {
        return refuse(client, "503 Service Unavailable").await;
    };
    let gateway = match dial_gateway(&route, &target, &names).await {
        Ok(gateway) => gateway,
        Err(error) => {
            emit(&PodEvent::RelayFailed {
                user_id,
                member: route.member,
                dialed: route.dial,
                error: format!("{error:#}"),
            });
            return refuse(client, "502 Bad Gateway").await;
        }
    };
    let Ok(client) = tokio_tungstenite::accept_async(client).await else {
        return;
    };
    emit(&PodEvent::RelayOpened {
        user_id,
        member: route.member,
        dialed: route.dial,
    });
    let (client_sink, client_stream) = client.split();
    let (gateway_sink, gateway_stream) = gateway.split();
    // Either side closing ends the relay; dropping both halves closes the other side.
    tokio::select! {
        _ = forward(client_stream, gateway_sink) => {}
        _ = forward(gateway_stream, client_sink) => {}
    }
}

async fn dial_gateway(
    route: &Route,
    target: &str,
    names: &NameTable,
) -> anyhow::Result<tokio_tungstenite::WebSocketStream<TcpStream>> {
    let address = names.resolve(&route.dial, WEBSOCKET_PORT)?;
    // The URL's authority becomes the Host header: exactly the member string as dialed.
    let request = format!("ws://{}{target}", route.dial).into_client_request()?;
    let dial = async {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let (gateway, _) = tokio_tungstenite::client_async(request, stream).await?;
        anyhow::Ok(gateway)
    };
    tokio::time::timeout(DIAL_TIMEOUT, dial)
        .await
        .with_context(|| format!("dial {address} timed out"))?
        .with_context(|| format!("WebSocket upgrade at {address}"))
}

async fn forward(
    mut from: impl Stream<Item = Result<Message, WsError>> + Unpin,
    mut to: impl Sink<Message, Error = WsError> + Unpin,
) {
    while let Some(Ok(message)) = from.next().await {
        let last = message.is_close();
        // Pings are answered by each hop itself.
        if (message.is_text() || message.is_binary() || last) && to.send(message).await.is_err() {
            return;
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
