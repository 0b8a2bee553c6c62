//! Keel's integration tests, one binary: a module per area, the shared harness in
//! [`support`]. One throwaway PostgreSQL cluster serves the whole run, a database per test.

mod support;

mod agent_lineage;
mod agent_loop;
mod agent_tools;
mod api;
mod approvals;
mod auth;
mod cli;
mod client_redirects;
mod console;
mod console_api;
mod content_store;
mod deploy;
mod external_actions;
mod external_hooks;
mod external_work;
mod failover;
mod fairness;
mod feed;
mod history_retention;
mod hostile_runs;
mod kubernetes;
mod layout;
mod media;
mod openapi;
mod partition;
mod processes;
mod providers_live;
mod queue;
mod remote_db;
mod repo_workspaces;
mod restart;
mod roles;
mod rpc;
mod run_writes;
mod sandbox;
mod schedules;
mod secrets;
mod telemetry;
mod tenancy;
mod tenancy_http;
mod usage;
mod vendor_calls;
mod workspaces;
