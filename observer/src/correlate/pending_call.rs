//! Defines [`PendingCall`], a push call waiting for its gateway's answer: held by
//! [`super::push_calls`] and, in cluster mode, parked by [`super::shared`] for a lookup.

use std::sync::Arc;

use crate::model::{Gateway, MessageIds, Process, UserId};

/// Records a push call as it was asked: when, which method, to which gateway, by which process,
/// for which message and recipients.
#[derive(Clone, Debug)]
pub struct PendingCall {
    pub ts_ns: u64,
    pub method: Arc<str>,
    pub gateway: Gateway,
    pub pusher: Process,
    pub message: MessageIds,
    pub recipients: Vec<UserId>,
}
