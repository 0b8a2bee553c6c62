//! Keel: a durable runtime for long-running work on Postgres.
#![forbid(unsafe_code)]

pub mod api;
pub mod cli;
pub mod config;
pub mod console;
pub mod domain;
pub mod jobs;
pub mod queue;
pub mod rpc;
pub mod scheduler;
pub mod store;
pub mod telemetry;
