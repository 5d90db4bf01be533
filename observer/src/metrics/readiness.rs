//! Says whether the observer can see traffic yet, which `/readyz` answers.

use std::sync::atomic::{AtomicBool, Ordering};

/// Records whether the observer can see traffic yet: `/readyz` answers 200 only once it can.
#[derive(Debug, Default)]
pub struct Readiness {
    attached: AtomicBool,
    /// With `--kube`: set until the pod list has loaded, then cleared.
    waiting_for_pods: AtomicBool,
}

impl Readiness {
    /// Says that every program is attached.
    pub fn set_attached(&self) {
        self.attached.store(true, Ordering::Release);
    }

    /// Says whether the pod list is still to load (`--kube`).
    pub fn set_waiting_for_pods(&self, waiting: bool) {
        self.waiting_for_pods.store(waiting, Ordering::Release);
    }

    /// Tells whether every program is attached and, with `--kube`, the pod list has loaded.
    pub fn is_ready(&self) -> bool {
        self.attached.load(Ordering::Acquire) && !self.waiting_for_pods.load(Ordering::Acquire)
    }
}
