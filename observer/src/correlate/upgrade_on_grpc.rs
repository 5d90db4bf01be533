//! Reports the WebSocket upgrades the proxy sent to a gRPC port: one `ws_upgrade_on_grpc_port` per
//! gateway port and proxy, folded, naming the users it tried to place and what the port answered.

use std::{collections::HashMap, net::IpAddr};

use crate::{
    alert::{Alert, AlertBody, FoldWindows},
    model::{ConnectionId, Gateway, Process},
    openim::diagnosis,
};

use super::FoldKey;

/// Bounds the users named in one alert.
const MAX_USERS_NAMED: usize = 100;

/// Describes a WebSocket upgrade request seen on a gRPC port.
pub struct Request {
    pub connection: ConnectionId,
    pub ts_ns: u64,
    pub user: Option<String>,
    pub gateway: Gateway,
    pub proxy: Process,
}

/// Raises `ws_upgrade_on_grpc_port`, and remembers each such connection until it closes so that
/// its answer finds the alert.
#[derive(Default)]
pub struct UpgradesOnGrpc {
    /// Each such connection's alert key, until it closes, so its answer finds the alert.
    keys_by_connection: HashMap<ConnectionId, (IpAddr, u16, u32)>,
}

impl UpgradesOnGrpc {
    /// Raises `ws_upgrade_on_grpc_port` for a WebSocket upgrade seen on a gRPC port, or folds it
    /// into the alert already raised for its gateway port and proxy.
    pub fn requested(
        &mut self,
        request: Request,
        folds: &mut FoldWindows<FoldKey>,
        alerts: &mut Vec<Alert>,
    ) {
        let Request {
            connection,
            ts_ns,
            user,
            gateway,
            proxy,
        } = request;
        self.keys_by_connection
            .insert(connection, (gateway.ip, gateway.port, proxy.pid));
        let key = FoldKey::UpgradeOnGrpc {
            gateway: gateway.ip,
            port: gateway.port,
            proxy_pid: proxy.pid,
        };
        if folds.repeat(&key, ts_ns) {
            if let Some(AlertBody::WsUpgradeOnGrpcPort { users, .. }) = folds.summary_mut(&key)
                && let Some(user) = user
                && !users.contains(&user)
                && users.len() < MAX_USERS_NAMED
            {
                users.push(user);
            }
            return;
        }
        let diagnosis =
            diagnosis::ws_upgrade_on_grpc_port(user.as_deref(), gateway.ip, gateway.port);
        let alert = Alert::new(
            ts_ns,
            AlertBody::WsUpgradeOnGrpcPort {
                gateway: gateway.into(),
                users: user.into_iter().collect(),
                proxy: proxy.into(),
                answer_status: None,
                count: 1,
                window_secs: folds.window_secs(),
                diagnosis,
            },
        );
        folds.first(key, alert, alerts);
    }

    /// Records that the gRPC port answered such an upgrade in HTTP/1: its status goes into the
    /// alert.
    pub fn answered(
        &self,
        connection: ConnectionId,
        status: u16,
        folds: &mut FoldWindows<FoldKey>,
    ) {
        let Some(&(gateway, port, proxy_pid)) = self.keys_by_connection.get(&connection) else {
            return;
        };
        let key = FoldKey::UpgradeOnGrpc {
            gateway,
            port,
            proxy_pid,
        };
        if let Some(AlertBody::WsUpgradeOnGrpcPort { answer_status, .. }) = folds.summary_mut(&key)
        {
            *answer_status = Some(status);
        }
    }

    /// Returns the connections whose upgrade is remembered until they close.
    pub fn connections(&self) -> impl Iterator<Item = ConnectionId> + '_ {
        self.keys_by_connection.keys().copied()
    }

    /// Forgets the upgrade on `connection`, which closed.
    pub fn closed(&mut self, connection: ConnectionId) {
        self.keys_by_connection.remove(&connection);
    }
}

#[cfg(test)]
mod tests;
