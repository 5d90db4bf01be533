//! The msggateway pod: WebSocket server on :80 that registers `sendID`/`platformID` sessions, and
//! the gRPC `OpenIMServer.msggateway.msgGateway` service on :88 with 3.5.1's push semantics: a
//! user is delivered to only if it has a session on *this* gateway.

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
use crate::proto::msggateway::msg_gateway_server::{MsgGateway, MsgGatewayServer};
use crate::proto::msggateway::{
    OnlineBatchPushOneMsgReq, OnlineBatchPushOneMsgResp, OnlinePushMsgReq, OnlinePushMsgResp,
    SingleMsgToUserPlatform, SingleMsgToUserResults,
};
use crate::proto::sdkws::MsgData;

pub const WEBSOCKET_PORT: u16 = 80;
pub const GRPC_PORT: u16 = 88;

/// OpenIM's ResultCode for a platform connection the message was written to.
const RESULT_OK: i64 = 0;
/// OpenIM's ResultCode for a failed write.
const RESULT_WRITE_FAILED: i64 = -2;

/// One client WebSocket: a user on one platform.
struct Session {
    id: u64,
    platform_id: i32,
    frames: mpsc::UnboundedSender<Message>,
}

#[derive(Clone, Default)]
struct Sessions {
    by_user: Arc<Mutex<HashMap<String, Vec<Session>>>>,
    next_id: Arc<AtomicU64>,
}

impl Sessions {
    fn open(&self, user_id: &str, platform_id: i32) -> (u64, mpsc::UnboundedReceiver<Message>) {
        let (frames, receiver) = mpsc::unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut by_user) = self.by_user.lock() {
            by_user
                .entry(user_id.to_owned())
                .or_default()
                .push(Session {
                    id,
                    platform_id,
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

    /// Writes the message to every connection of the user here; `None` if it has none.
    fn deliver(&self, user_id: &str, frame: &str) -> Option<Vec<SingleMsgToUserPlatform>> {
        let by_user = self.by_user.lock().ok()?;
        let sessions = by_user.get(user_id)?;
        Some(
            sessions
                .iter()
                .map(|session| {
                    let written = session.frames.send(Message::text(frame)).is_ok();
                    SingleMsgToUserPlatform {
                        result_code: if written {
                            RESULT_OK
                        } else {
                            RESULT_WRITE_FAILED
                        },
                        recv_id: user_id.to_owned(),
                        recv_platform_id: session.platform_id,
                    }
                })
                .collect(),
        )
    }
}

#[derive(clap::Args, Debug)]
pub struct GatewayArgs {
    /// The StatefulSet ordinal of this gateway (for logs only: the gateway does not know rings).
    #[arg(long)]
    pub index: usize,
}

pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let sessions = Sessions::default();
    let websocket = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], WEBSOCKET_PORT)))
        .await
        .context("bind WebSocket port 80")?;
    let grpc = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], GRPC_PORT)))
        .await
        .context("bind gRPC port 88")?;
    emit(&PodEvent::Ready);

    let grpc_server = tonic::transport::Server::builder()
        .layer(tower::util::MapRequestLayer::new(remember_authority))
        .add_service(MsgGatewayServer::new(GatewayService {
            sessions: sessions.clone(),
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

/// The HTTP/2 `:authority` of a call, kept for the handler (tonic hides pseudo-headers).
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

/// What the gateway learned from a client's upgrade request.
struct Upgrade {
    user_id: String,
    platform_id: i32,
    host: String,
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
    let host = request
        .headers()
        .get(http::header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Ok(Upgrade {
        user_id,
        platform_id,
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
        host,
    }) = upgrade
    else {
        return;
    };
    let (session_id, mut frames) = sessions.open(&user_id, platform_id);
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
}

impl GatewayService {
    /// 3.5.1 semantics for one recipient: not connected here → an entry with only `userID`.
    fn push_to(&self, user_id: &str, frame: &str) -> SingleMsgToUserResults {
        match self.sessions.deliver(user_id, frame) {
            Some(resp) => SingleMsgToUserResults {
                user_id: user_id.to_owned(),
                online_push: resp
                    .iter()
                    .any(|platform| platform.result_code == RESULT_OK),
                resp,
            },
            None => SingleMsgToUserResults {
                user_id: user_id.to_owned(),
                ..Default::default()
            },
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
        let results: Vec<SingleMsgToUserResults> = request
            .push_to_user_ids
            .iter()
            .map(|user_id| self.push_to(user_id, &frame))
            .collect();
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

/// The frame a client receives: ids only; the body stays opaque (the lab never inspects it).
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
mod tests {
    use super::*;

    fn batch(users: &[&str]) -> GrpcRequest<OnlineBatchPushOneMsgReq> {
        GrpcRequest::new(OnlineBatchPushOneMsgReq {
            msg_data: Some(MsgData {
                client_msg_id: "m1".to_owned(),
                seq: 1,
                ..Default::default()
            }),
            push_to_user_ids: users.iter().map(|user| (*user).to_owned()).collect(),
        })
    }

    #[tokio::test]
    async fn delivers_only_to_users_connected_here() {
        let sessions = Sessions::default();
        let (_, mut android) = sessions.open("alice", 2);
        let (_, mut web) = sessions.open("alice", 5);
        let service = GatewayService {
            sessions: sessions.clone(),
        };
        let results = service
            .super_group_online_batch_push_one_msg(batch(&["alice", "bob"]))
            .await
            .expect("push answered")
            .into_inner()
            .single_push_result;
        assert_eq!(results.len(), 2);
        assert!(results[0].online_push);
        let platforms: Vec<i32> = results[0].resp.iter().map(|r| r.recv_platform_id).collect();
        assert_eq!(platforms, [2, 5]);
        assert!(results[0].resp.iter().all(|r| r.result_code == RESULT_OK));
        // Not connected here: only the user id, as 3.5.1 answers.
        assert_eq!(
            results[1],
            SingleMsgToUserResults {
                user_id: "bob".to_owned(),
                ..Default::default()
            }
        );
        for frames in [&mut android, &mut web] {
            let frame = frames.try_recv().expect("frame written");
            assert!(
                frame
                    .to_text()
                    .expect("text")
                    .contains("\"clientMsgID\":\"m1\"")
            );
        }
    }
}
