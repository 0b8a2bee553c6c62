//! Keel: a durable runtime for long-running work on Postgres.
#![forbid(unsafe_code)]

pub mod agent;
pub mod api;
pub mod approvals;
pub mod artifacts;
pub mod attempt;
pub mod cli;
pub mod config;
pub mod db;
pub mod domain;
pub mod events;
pub mod external;
pub mod jobs;
pub mod maintenance;
pub mod media;
pub mod providers;
pub mod queue;
pub mod quotas;
pub mod rpc;
pub mod runs;
pub mod schedules;
pub mod system;
pub mod tasks;
pub mod telemetry;
pub mod workspaces;
