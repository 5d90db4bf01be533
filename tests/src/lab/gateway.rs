//! Runs the msggateway pod: a WebSocket server on :80 that registers `sendID`/`platformID`
//! sessions, and the gRPC `msgGateway` service on :88 under the release's package name
//! (`OpenIMServer.*` for 3.5 and 3.6, `openim.*` later) with upstream's push semantics: a user is
//! delivered to only if it has a session on *this* gateway, and the answer lists what
//! `hub_server.go` lists.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status};

use crate::lab::control::{PodEvent, emit};
use crate::lab::release::{OpenImRelease, SERVICE_3_5};
use crate::proto::msggateway::msg_gateway_server::{MsgGateway, MsgGatewayServer};
use crate::proto::msggateway::{
    OnlineBatchPushOneMsgReq, OnlineBatchPushOneMsgResp, OnlinePushMsgReq, OnlinePushMsgResp,
    SingleMsgToUserPlatform, SingleMsgToUserResults,
};
use crate::proto::sdkws::MsgData;

/// Numbers the gateway's WebSocket port.
pub const WEBSOCKET_PORT: u16 = 80;
/// Numbers the gateway's gRPC port.
pub const GRPC_PORT: u16 = 88;

/// Holds OpenIM's ResultCode for a platform connection the message was written to.
const RESULT_OK: i64 = 0;
/// Holds OpenIM's ResultCode for a failed write.
const RESULT_WRITE_FAILED: i64 = -2;
/// Holds OpenIM's ResultCode for an iOS client in the background, which is not written to.
const RESULT_IOS_BACKGROUND: i64 = -3;
/// Numbers OpenIM's platform ids of the push terminals, the only ones a successful write is listed
/// for (`pushTerminal` in `hub_server.go`).
const IOS: i32 = 1;
const ANDROID: i32 = 2;

/// Holds one client WebSocket: a user on one platform.
struct Session {
    id: u64,
    platform_id: i32,
    /// The upgrade's `isBackground`.
    background: bool,
    frames: mpsc::UnboundedSender<Message>,
}

/// Holds what the gateway tells push about one user: the platform entries and `onlinePush`.
#[derive(Default)]
struct Delivery {
    resp: Vec<SingleMsgToUserPlatform>,
    online_push: bool,
}

#[derive(Clone, Default)]
struct Sessions {
    by_user: Arc<Mutex<HashMap<String, Vec<Session>>>>,
    next_id: Arc<AtomicU64>,
}

impl Sessions {
    fn open(
        &self,
        user_id: &str,
        platform_id: i32,
        background: bool,
    ) -> (u64, mpsc::UnboundedReceiver<Message>) {
        let (frames, receiver) = mpsc::unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut by_user) = self.by_user.lock() {
            by_user
                .entry(user_id.to_owned())
                .or_default()
                .push(Session {
                    id,
                    platform_id,
                    background,
                    frames,
                });
        }
        (id, receiver)
    }

    fn close(&self, user_id: &str, id: u64) {
        if let Ok(mut by_user) = self.by_user.lock()
            && let Some(sessions) = by_user.get_mut(user_id)
        {
            sessions.retain(|session| session.id != id);
            if sessions.is_empty() {
                by_user.remove(user_id);
            }
        }
    }

    /// Writes the message to every connection of the user here, answering as upstream's
    /// `SuperGroupOnlineBatchPushOneMsg` does; `None` if the user has no connection here.
    fn deliver(&self, user_id: &str, frame: &str) -> Option<Delivery> {
        let by_user = self.by_user.lock().ok()?;
        let sessions = by_user.get(user_id)?;
        let mut delivery = Delivery::default();
        for session in sessions {
            let entry = |result_code| SingleMsgToUserPlatform {
                result_code,
                recv_id: user_id.to_owned(),
                recv_platform_id: session.platform_id,
            };
            if session.background && session.platform_id == IOS {
                delivery.resp.push(entry(RESULT_IOS_BACKGROUND));
            } else if session.frames.send(Message::text(frame)).is_err() {
                delivery.resp.push(entry(RESULT_WRITE_FAILED));
            } else if [IOS, ANDROID].contains(&session.platform_id) {
                delivery.online_push = true;
                delivery.resp.push(entry(RESULT_OK));
            }
        }
        Some(delivery)
    }
}

#[derive(clap::Args, Debug)]
pub struct GatewayArgs {
    /// The StatefulSet ordinal of this gateway (for logs only: the gateway does not know rings).
    #[arg(long)]
    pub index: usize,
    /// The release whose service name and answer order the gateway follows.
    #[arg(long, value_enum, default_value = "3.5")]
    pub openim: OpenImRelease,
}

/// Serves a gateway pod: its WebSocket port and its gRPC service, until the gRPC server ends.
///
/// # Errors
///
/// Fails when a port cannot be bound or the gRPC server fails.
pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let sessions = Sessions::default();
    let websocket = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], WEBSOCKET_PORT)))
        .await
        .context("bind WebSocket port 80")?;
    let grpc = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], GRPC_PORT)))
        .await
        .context("bind gRPC port 88")?;
    emit(&PodEvent::Ready);

    let release = args.openim;
    let grpc_server = tonic::transport::Server::builder()
        .layer(tower::util::MapRequestLayer::new(remember_authority))
        .layer(tower::util::MapRequestLayer::new(move |request| {
            serve_release_service(release, request)
        }))
        .add_service(MsgGatewayServer::new(GatewayService {
            sessions: sessions.clone(),
            release,
        }))
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true)),
        );
    let websocket_server = async {
        loop {
            match websocket.accept().await {
                Ok((stream, _)) => {
                    // Go (the real gateway) sets TCP_NODELAY on every TCP connection.
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(serve_websocket(stream, sessions.clone()));
                }
                Err(error) => eprintln!("msggateway {}: accept: {error}", args.index),
            }
        }
    };
    tokio::select! {
        served = grpc_server => served.context("gRPC server"),
        () = websocket_server => Ok(()),
    }
}

/// Holds the HTTP/2 `:authority` of a call, kept for the handler (tonic hides pseudo-headers).
#[derive(Clone)]
struct Authority(String);

fn remember_authority(
    mut request: http::Request<tonic::body::Body>,
) -> http::Request<tonic::body::Body> {
    let authority = request
        .uri()
        .authority()
        .map(|authority| authority.to_string())
        .unwrap_or_default();
    request.extensions_mut().insert(Authority(authority));
    request
}

/// Serves the release's service name only: a call under it is routed to the generated service
/// (which carries 3.5's name), a call under the generated name when the release renamed it is
/// left to fail as unimplemented, as a real gateway of that release would.
fn serve_release_service(
    release: OpenImRelease,
    mut request: http::Request<tonic::body::Body>,
) -> http::Request<tonic::body::Body> {
    let served = release.service();
    if served == SERVICE_3_5 {
        return request;
    }
    let path = request.uri().path();
    let renamed = if let Some(method) = path.strip_prefix(&format!("/{served}/")) {
        format!("/{SERVICE_3_5}/{method}")
    } else if path.starts_with(&format!("/{SERVICE_3_5}/")) {
        format!("/unserved{path}")
    } else {
        return request;
    };
    let mut parts = request.uri().clone().into_parts();
    parts.path_and_query = renamed.parse().ok();
    if let Ok(uri) = http::Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
    request
}

/// Holds what the gateway learned from a client's upgrade request.
struct Upgrade {
    user_id: String,
    platform_id: i32,
    background: bool,
    host: String,
}

/// Parses a bool as Go's `strconv.ParseBool` does, as the gateway reads `isBackground`: anything
/// else is an error, which the lab reads as false.
fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn read_upgrade(request: &Request) -> Result<Upgrade, String> {
    let query = request.uri().query().unwrap_or_default();
    let param = |name: &str| {
        query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            (key == name).then(|| value.to_owned())
        })
    };
    let user_id = param("sendID")
        .filter(|id| !id.is_empty())
        .ok_or("no sendID")?;
    let platform_id = param("platformID")
        .and_then(|id| id.parse().ok())
        .ok_or("no platformID")?;
    param("token")
        .filter(|token| !token.is_empty())
        .ok_or("no token")?;
    let background = param("isBackground")
        .and_then(|value| parse_go_bool(&value))
        .unwrap_or(false);
    let host = request
        .headers()
        .get(http::header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Ok(Upgrade {
        user_id,
        platform_id,
        background,
        host,
    })
}

async fn serve_websocket(stream: TcpStream, sessions: Sessions) {
    let mut upgrade = None;
    #[expect(
        clippy::result_large_err,
        reason = "tungstenite's handshake callback fixes the error type"
    )]
    let accept = |request: &Request, response: Response| match read_upgrade(request) {
        Ok(found) => {
            upgrade = Some(found);
            Ok(response)
        }
        Err(reason) => {
            let mut refusal = ErrorResponse::new(Some(reason));
            *refusal.status_mut() = http::StatusCode::BAD_REQUEST;
            Err(refusal)
        }
    };
    let Ok(websocket) = tokio_tungstenite::accept_hdr_async(stream, accept).await else {
        return;
    };
    let Some(Upgrade {
        user_id,
        platform_id,
        background,
        host,
    }) = upgrade
    else {
        return;
    };
    let (session_id, mut frames) = sessions.open(&user_id, platform_id, background);
    emit(&PodEvent::SessionOpened {
        user_id: user_id.clone(),
        platform_id,
        host,
    });
    let (mut sink, mut incoming) = websocket.split();
    loop {
        tokio::select! {
            frame = frames.recv() => match frame {
                Some(frame) => if sink.send(frame).await.is_err() { break },
                None => break,
            },
            received = incoming.next() => match received {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
        }
    }
    sessions.close(&user_id, session_id);
    emit(&PodEvent::SessionClosed {
        user_id,
        platform_id,
    });
}

struct GatewayService {
    sessions: Sessions,
    release: OpenImRelease,
}

impl GatewayService {
    /// Returns upstream's answer for one recipient: not connected here → an entry with only
    /// `userID`; otherwise what [`Sessions::deliver`] lists.
    fn push_to(&self, user_id: &str, frame: &str) -> SingleMsgToUserResults {
        let delivery = self.sessions.deliver(user_id, frame).unwrap_or_default();
        SingleMsgToUserResults {
            user_id: user_id.to_owned(),
            resp: delivery.resp,
            online_push: delivery.online_push,
        }
    }

    fn batch_push(
        &self,
        method: &str,
        request: GrpcRequest<OnlineBatchPushOneMsgReq>,
    ) -> Result<GrpcResponse<OnlineBatchPushOneMsgResp>, Status> {
        let authority = authority_of(&request);
        let request = request.into_inner();
        let frame = client_frame(request.msg_data.as_ref())?;
        let mut results: Vec<SingleMsgToUserResults> = request
            .push_to_user_ids
            .iter()
            .map(|user_id| self.push_to(user_id, &frame))
            .collect();
        if self.release.reorders_answers() {
            results.reverse();
        }
        emit(&PodEvent::PushServed {
            method: method.to_owned(),
            authority,
            users: results.len(),
            delivered: results.iter().filter(|result| result.online_push).count(),
        });
        Ok(GrpcResponse::new(OnlineBatchPushOneMsgResp {
            single_push_result: results,
        }))
    }
}

fn authority_of<T>(request: &GrpcRequest<T>) -> String {
    request
        .extensions()
        .get::<Authority>()
        .map(|Authority(authority)| authority.clone())
        .unwrap_or_default()
}

/// Builds the frame a client receives: ids only; the body stays opaque (the lab never inspects it).
fn client_frame(msg_data: Option<&MsgData>) -> Result<String, Status> {
    let msg = msg_data.ok_or_else(|| Status::invalid_argument("msgData missing"))?;
    Ok(serde_json::json!({
        "clientMsgID": msg.client_msg_id,
        "seq": msg.seq,
        "sendID": msg.send_id,
        "contentLength": msg.content.len(),
    })
    .to_string())
}

#[tonic::async_trait]
impl MsgGateway for GatewayService {
    async fn online_push_msg(
        &self,
        request: GrpcRequest<OnlinePushMsgReq>,
    ) -> Result<GrpcResponse<OnlinePushMsgResp>, Status> {
        let authority = authority_of(&request);
        let request = request.into_inner();
        let frame = client_frame(request.msg_data.as_ref())?;
        let result = self.push_to(&request.push_to_user_id, &frame);
        emit(&PodEvent::PushServed {
            method: "OnlinePushMsg".to_owned(),
            authority,
            users: 1,
            delivered: usize::from(result.online_push),
        });
        Ok(GrpcResponse::new(OnlinePushMsgResp { resp: result.resp }))
    }

    async fn online_batch_push_one_msg(
        &self,
        request: GrpcRequest<OnlineBatchPushOneMsgReq>,
    ) -> Result<GrpcResponse<OnlineBatchPushOneMsgResp>, Status> {
        self.batch_push("OnlineBatchPushOneMsg", request)
    }

    async fn super_group_online_batch_push_one_msg(
        &self,
        request: GrpcRequest<OnlineBatchPushOneMsgReq>,
    ) -> Result<GrpcResponse<OnlineBatchPushOneMsgResp>, Status> {
        self.batch_push("SuperGroupOnlineBatchPushOneMsg", request)
    }
}

#[cfg(test)]
mod tests;
