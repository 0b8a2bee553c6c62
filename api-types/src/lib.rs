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
//! turn a draft into a domain value) and logic that needs the server (extension traits
//! there, such as `TaskRecordExt`).
//!
//! Features: `sqlx` derives `sqlx::FromRow` on the resources the server reads straight
//! from PostgreSQL. Row fields the API never renders (`#[serde(skip)]`) exist only for
//! that reading and are always `None` or empty in a client.

/// The schema impls of a request body whose document schema is hand-written: `build`
/// returns the schema and registers the components it refers to.
macro_rules! hand_written_schema {
    ($type:ident, $build:path) => {
        impl utoipa::PartialSchema for $type {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                $build(&mut Vec::new())
            }
        }

        impl utoipa::ToSchema for $type {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($type))
            }

            fn schemas(
                schemas: &mut Vec<(
                    String,
                    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
                )>,
            ) {
                $build(schemas);
            }
        }
    };
}

/// A closed set of names: the enum, its wire names, `ALL`, `as_str` and `parse`.
macro_rules! closed_set {
    ($(#[$meta:meta])* $name:ident { $($(#[$variant_meta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash,
            serde::Serialize, serde::Deserialize, utoipa::ToSchema,
        )]
        // The wire names are the variants' in snake_case (a `rename` from a macro
        // fragment is lost on utoipa); the tests check them against `as_str`.
        #[serde(rename_all = "snake_case")]
        // A text column; an unknown value is a decode error, never a panic.
        #[cfg_attr(feature = "sqlx", derive(sqlx::Type))]
        #[cfg_attr(feature = "sqlx", sqlx(type_name = "text", rename_all = "snake_case"))]
        pub enum $name {
            $($(#[$variant_meta])* $variant,)+
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;

            fn from_str(value: &str) -> Result<$name, String> {
                $name::parse(value).ok_or_else(|| {
                    format!("'{value}' is not one of {}", $name::names())
                })
            }
        }

        impl $name {
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            pub fn parse(value: &str) -> Option<$name> {
                $name::ALL.into_iter().find(|v| v.as_str() == value)
            }

            /// The names, for messages: `a, b or c`.
            pub fn names() -> String {
                let names: Vec<&str> = $name::ALL.iter().map(|v| v.as_str()).collect();
                match names.split_last() {
                    Some((last, [])) => last.to_string(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                }
            }
        }
    };
}

mod activity;
mod approval;
mod client_run;
mod envelope;
mod error_code;
mod event;
mod external;
mod mcp;
mod media;
mod policy;
mod provider;
mod run;
mod runtime;
mod schedule;
pub mod schema;
mod sets;
mod system;
mod task;
mod transcript;
mod triage;

pub use activity::*;
pub use approval::*;
pub use client_run::*;
pub use envelope::*;
pub use error_code::ErrorCode;
pub use event::*;
pub use external::*;
pub use mcp::*;
pub use media::*;
pub use policy::*;
pub use provider::*;
pub use run::*;
pub use runtime::*;
pub use schedule::*;
pub use sets::*;
pub use system::*;
pub use task::*;
pub use transcript::*;
pub use triage::*;
