//! `keel whoami` and `keel shutdown`: this runtime host and the caller, and stopping the
//! host (`api/runtime.rs`).

use keel_client::{Client, Error};

use crate::cli::output;
use crate::cli::output::{Format, Table};

pub(super) async fn whoami(client: &Client, format: Format) -> Result<(), Error> {
    output::show(format, client.whoami(), |s| {
        let s = &s.data;
        Table::fields(&[
            ("role", s.role.clone()),
            ("actor", s.actor_id.clone()),
            ("workspace", s.workspace.clone()),
            ("may approve own", s.may_approve_own.to_string()),
            ("runtime host", s.runtime_host.label.clone()),
            ("operator access", s.runtime_host.operator_access.clone()),
        ])
    })
    .await
    .map(drop)
}

pub(super) async fn shutdown(client: &Client, format: Format) -> Result<(), Error> {
    output::show(format, client.shutdown(), |s| {
        Table::fields(&[("status", s.data.status.clone())])
    })
    .await
    .map(drop)
}
