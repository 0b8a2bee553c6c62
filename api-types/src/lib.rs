//! Keel's wire contract: the request bodies the HTTP API accepts, the resources it answers
//! with, the closed sets they use (statuses, kinds, decisions), and the list, object and
//! error envelopes. The server's handlers take and return these types and its OpenAPI
//! document is derived from them, so a Rust client built on this crate (`keel-client`)
//! cannot drift from the server.
//!
//! The closed sets that carry domain logic keep it here, with the enum:
//! [`RunStatus::can_become`] and [`MediaJobStatus::can_become`] stay the one place deciding
//! their state machines' transitions (inherent impls must live in the crate that defines
//! the type, and splitting the enum from its rules would let a second copy of them grow).
//! The rules are pure, so clients get them too, for example to tell a terminal status.
//!
//! What is not here: the server's validation of a request (`NewTask::parse` and friends
//! turn a draft into a domain value), and the external-work types, which are still
//! changing in the server.
//!
//! Features: `sqlx` derives `sqlx::FromRow` on the resources the server reads straight
//! from PostgreSQL. Row fields the API never renders (`#[serde(skip)]`) exist only for
//! that reading and are always `None` or empty in a client.

mod approval;
mod envelope;
mod event;
mod media;
mod provider;
mod run;
mod schedule;
mod system;
mod task;

pub use approval::*;
pub use envelope::*;
pub use event::*;
pub use media::*;
pub use provider::*;
pub use run::*;
pub use schedule::*;
pub use system::*;
pub use task::*;
