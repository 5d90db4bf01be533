//! Drives the soak's steady mixed load: a fixed population of users, a batch of whom reconnects
//! every tick while another batch receives a group message, half the population apart, so every
//! user is pushed, reconnected half a rotation later, and pushed again a rotation later.

use std::time::Instant;

use anyhow::ensure;

use crate::Lab;
use crate::lab::names::random_bytes;
use crate::soak::alerts::AlertTally;

/// Holds the load's cursor over the population and what it did so far.
pub struct Load {
    users: usize,
    batch: usize,
    cursor: usize,
    run_tag: String,
    /// Group messages pushed.
    pub pushes: usize,
    /// Users disconnected and connected again.
    pub reconnects: usize,
    /// Reconnects that failed (the user then sits out its pushes until it reconnects).
    pub reconnect_failures: usize,
    /// Push calls that failed.
    pub push_errors: usize,
}

impl Load {
    /// Makes a load over `users` (connected by the caller) in batches of `batch`; `users` must be a
    /// multiple of twice `batch`, so batches never wrap.
    ///
    /// # Errors
    ///
    /// Fails when `users` is not a multiple of twice `batch` (or `batch` is 0), or the kernel's
    /// random bytes cannot be read.
    pub fn new(users: usize, batch: usize) -> anyhow::Result<Self> {
        ensure!(
            batch > 0 && users.is_multiple_of(2 * batch),
            "--users must be a multiple of twice --batch"
        );
        let run_tag = random_bytes::<4>()?
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        Ok(Self {
            users,
            batch,
            cursor: 0,
            run_tag,
            pushes: 0,
            reconnects: 0,
            reconnect_failures: 0,
            push_errors: 0,
        })
    }

    /// Returns the users reconnected, and recipients pushed, per tick.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Returns the seconds between two pushes to one user: what the fold window must stay below for
    /// each misrouted push to print a line of its own.
    pub fn rotation_ticks(&self) -> usize {
        self.users / self.batch
    }

    /// Runs one tick: reconnects the batch half a rotation ahead, then (with `push`) pushes one
    /// group message to the batch at the cursor and notes whom the lab saw it miss.
    ///
    /// # Errors
    ///
    /// Fails when a push fails to reach push or its outcome does not come back.
    pub async fn tick(
        &mut self,
        lab: &mut Lab,
        tally: &mut AlertTally,
        push: bool,
    ) -> anyhow::Result<()> {
        let churn = (self.cursor + self.users / 2) % self.users;
        let leaving: Vec<String> = (churn..churn + self.batch).map(Lab::user_id).collect();
        lab.disconnect_users(&leaving).await;
        lab.connect_users(churn..churn + self.batch, false).await;
        self.reconnects += self.batch;
        self.reconnect_failures += leaving
            .iter()
            .filter(|user| !lab.is_connected(user))
            .count();
        if push {
            let recipients: Vec<String> = (self.cursor..self.cursor + self.batch)
                .map(Lab::user_id)
                .filter(|user| lab.is_connected(user))
                .collect();
            let client_msg_id = format!("soak-{}-{}", self.run_tag, self.pushes);
            let seq = i64::try_from(self.pushes)? + 1;
            let sent_at = Instant::now();
            let outcome = lab.push_message(&client_msg_id, seq, recipients).await?;
            self.pushes += 1;
            self.push_errors += outcome
                .calls
                .iter()
                .filter(|call| call.error.is_some())
                .count();
            let misrouted: Vec<String> = lab.misrouted(&outcome).into_iter().collect();
            tally.expect(&client_msg_id, sent_at, &misrouted);
        }
        self.cursor = (self.cursor + self.batch) % self.users;
        Ok(())
    }
}
