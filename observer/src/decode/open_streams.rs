//! Holds a connection's open HTTP/2 streams by id, in id order: a handful at a time (at most
//! `Limits::max_streams`).
//!
//! A sorted `Vec` rather than a `BTreeMap`: a push connection usually carries one call at a time,
//! and a `BTreeMap` allocates a node for eleven streams each time it goes from empty to one
//! stream and frees it when the call ends: once per push call, the decoder's largest allocation.
//! The `Vec` keeps its capacity across calls.

/// Holds a connection's open streams by id, in id order.
#[derive(Clone, Debug)]
pub struct OpenStreams<T> {
    by_id: Vec<(u32, T)>,
}

impl<T> Default for OpenStreams<T> {
    fn default() -> Self {
        Self { by_id: Vec::new() }
    }
}

impl<T> OpenStreams<T> {
    /// Counts the open streams.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Says whether no stream is open.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Closes every stream.
    pub fn clear(&mut self) {
        self.by_id.clear();
    }

    fn position(&self, stream_id: u32) -> Result<usize, usize> {
        self.by_id.binary_search_by_key(&stream_id, |(id, _)| *id)
    }

    /// Says whether `stream_id` is open.
    pub fn contains(&self, stream_id: u32) -> bool {
        self.position(stream_id).is_ok()
    }

    /// Returns `stream_id`'s state, if it is open.
    pub fn get(&self, stream_id: u32) -> Option<&T> {
        let index = self.position(stream_id).ok()?;
        Some(&self.by_id[index].1)
    }

    /// Returns `stream_id`'s state mutably, if it is open.
    pub fn get_mut(&mut self, stream_id: u32) -> Option<&mut T> {
        let index = self.position(stream_id).ok()?;
        Some(&mut self.by_id[index].1)
    }

    /// Opens `stream_id`, or replaces its state if it is open.
    pub fn insert(&mut self, stream_id: u32, stream: T) {
        match self.position(stream_id) {
            Ok(index) => self.by_id[index].1 = stream,
            Err(index) => self.by_id.insert(index, (stream_id, stream)),
        }
    }

    /// Closes `stream_id`, returning its state if it was open.
    pub fn remove(&mut self, stream_id: u32) -> Option<T> {
        let index = self.position(stream_id).ok()?;
        Some(self.by_id.remove(index).1)
    }

    /// Iterates over the open streams in id order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.by_id.iter().map(|(id, stream)| (*id, stream))
    }

    /// Iterates mutably over the open streams in id order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.by_id.iter_mut().map(|(id, stream)| (*id, stream))
    }
}

#[cfg(test)]
mod tests;
