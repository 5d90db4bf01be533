//! Connects the lab's clients: users that connect through the proxy with the OpenIM SDK's query and
//! note when each pushed message arrives on their WebSocket.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures_util::StreamExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::lab::names::random_bytes;
use crate::lab::stack::AddressFamily;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Maps (user id, clientMsgID) to when the message arrived.
pub type Arrivals = Arc<Mutex<HashMap<(String, String), Instant>>>;

/// Holds a connected user; dropping it closes the WebSocket.
pub struct Client {
    pub user_id: String,
    /// The credential this client sent in its upgrade query.
    pub token: String,
    /// The task reading the user's WebSocket; `None` when a client program holds the
    /// connection (see [`crate::lab::external::ExternalUsers`]).
    reader: Option<JoinHandle<()>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(reader) = &self.reader {
            reader.abort();
        }
    }
}

impl Client {
    /// Returns a user whose WebSocket a client program holds.
    pub fn external(user_id: String, token: String) -> Self {
        Self {
            user_id,
            token,
            reader: None,
        }
    }
}

/// Returns a fresh secret-looking JWT-shaped token (random; never logged or written by the lab, and
/// kept in memory only so tests can prove no observer output contains it).
///
/// # Errors
///
/// Fails when the kernel's random bytes cannot be read.
pub fn token() -> anyhow::Result<String> {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = URL_SAFE_NO_PAD.encode(random_bytes::<48>()?);
    let signature = URL_SAFE_NO_PAD.encode(random_bytes::<32>()?);
    Ok(format!("{header}.{claims}.{signature}"))
}

fn operation_id() -> anyhow::Result<String> {
    Ok(random_bytes::<8>()?
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

/// Returns the upgrade URL the SDK opens, with the user's query.
///
/// # Errors
///
/// Fails when the kernel's random bytes (for the operation id) cannot be read.
pub fn upgrade_url(
    proxy: SocketAddr,
    user_id: &str,
    token: &str,
    platform_id: i32,
) -> anyhow::Result<String> {
    Ok(format!(
        "ws://{proxy}/?sendID={user_id}&token={token}&platformID={platform_id}&operationID={}&isBackground=false",
        operation_id()?
    ))
}

/// Opens a TCP connection to an IPv4 `address`: from an IPv4 socket, or from an IPv6 one to the
/// IPv4-mapped address.
///
/// # Errors
///
/// Fails when the socket cannot be made or the connect fails.
pub async fn connect_tcp(address: SocketAddr, family: AddressFamily) -> std::io::Result<TcpStream> {
    match (family, address) {
        (AddressFamily::DualStack, SocketAddr::V4(v4)) => {
            let mapped = SocketAddr::from((v4.ip().to_ipv6_mapped(), v4.port()));
            TcpSocket::new_v6()?.connect(mapped).await
        }
        _ => TcpStream::connect(address).await,
    }
}

/// Opens the user's WebSocket through the proxy at `proxy`, as the SDK does.
///
/// # Errors
///
/// Fails when the token or URL cannot be made, the TCP connect or WebSocket handshake fails, or it
/// does not complete in time.
pub async fn connect(
    proxy: SocketAddr,
    user_id: &str,
    platform_id: i32,
    family: AddressFamily,
    arrivals: Arrivals,
) -> anyhow::Result<Client> {
    let token = token()?;
    let request = upgrade_url(proxy, user_id, &token, platform_id)?.into_client_request()?;
    let open = async {
        let stream = connect_tcp(proxy, family).await?;
        stream.set_nodelay(true)?;
        let (websocket, _) = tokio_tungstenite::client_async(request, stream).await?;
        anyhow::Ok(websocket)
    };
    let mut websocket = tokio::time::timeout(CONNECT_TIMEOUT, open)
        .await
        .context("WebSocket connect timed out")??;
    let owner = user_id.to_owned();
    let reader = tokio::spawn(async move {
        while let Some(Ok(message)) = websocket.next().await {
            let Message::Text(text) = message else {
                continue;
            };
            let arrived = Instant::now();
            let Ok(frame) = serde_json::from_str::<serde_json::Value>(text.as_str()) else {
                continue;
            };
            if let Some(client_msg_id) = frame["clientMsgID"].as_str()
                && let Ok(mut arrivals) = arrivals.lock()
            {
                arrivals
                    .entry((owner.clone(), client_msg_id.to_owned()))
                    .or_insert(arrived);
            }
        }
    });
    Ok(Client {
        user_id: user_id.to_owned(),
        token,
        reader: Some(reader),
    })
}
