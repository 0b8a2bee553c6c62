//! The cap on the event streams one identity holds open. Each open stream reads the
//! database whenever a commit wakes it, so a member holding hundreds of them slows every
//! tenant's requests. A stream takes a slot when it opens and gives it back when it is
//! dropped, however it ends: its run ended, the server is shutting down, or the client went
//! away (hyper notices the connection's end while it waits for the stream's next frame, and
//! drops the response).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::api::ApiError;
use crate::domain::Caller;

/// The open streams of each identity (workspace and actor) on this API process.
pub(crate) struct StreamSlots {
    max: usize,
    open: Mutex<HashMap<(String, String), usize>>,
}

/// One open stream's slot, given back when dropped.
pub(crate) struct StreamSlot {
    slots: Arc<StreamSlots>,
    identity: (String, String),
}

impl StreamSlots {
    pub(crate) fn new(max: usize) -> Arc<StreamSlots> {
        Arc::new(StreamSlots {
            max,
            open: Mutex::default(),
        })
    }

    /// A slot for one more of the caller's streams, or 429 when it holds `max` already.
    pub(crate) fn take(self: &Arc<Self>, caller: &Caller) -> Result<StreamSlot, ApiError> {
        let identity = caller.identity();
        let mut open = self.open.lock().expect("never poisoned");
        let held = open.entry(identity.clone()).or_default();
        if *held >= self.max {
            return Err(ApiError::TooManyStreams { max: self.max });
        }
        *held += 1;
        Ok(StreamSlot {
            slots: self.clone(),
            identity,
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().expect("never poisoned");
        if let Some(held) = open.get_mut(&self.identity) {
            *held -= 1;
            // Forgotten at zero, so the map holds only identities with streams open.
            if *held == 0 {
                open.remove(&self.identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_identity_holds_up_to_max_and_a_dropped_slot_is_free_again() {
        let slots = StreamSlots::new(2);
        let local = Caller::local();
        let first = slots.take(&local).unwrap();
        let _second = slots.take(&local).unwrap();
        assert!(matches!(
            slots.take(&local),
            Err(ApiError::TooManyStreams { max: 2 })
        ));
        let mut other = Caller::local();
        other.actor_id = "someone".into();
        let theirs = slots.take(&other).unwrap();
        drop(first);
        let _again = slots.take(&local).unwrap();
        drop(theirs);
        assert_eq!(
            slots.open.lock().unwrap().len(),
            1,
            "an identity at zero is forgotten"
        );
    }
}
