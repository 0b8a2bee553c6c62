//! Provider presets: reusable, non-secret configuration of model and media vendors
//! (`presets`, `store`), the secret references they name (`secrets`) and a chat preset
//! resolved for calls (`chat`). Elsewhere: the routes in `api/providers.rs`; the contract
//! in `api-types/src/provider.rs`; the vendors' clients in `workers/src/agent/provider/`
//! and `workers/src/media/`.

pub(crate) mod chat;
mod presets;
pub mod secrets;
mod store;

pub(crate) use presets::{Api, check_tenants_use};
pub use presets::{ProviderFields, ProviderHosts, ProviderSpec};
pub(crate) use store::{LockMode, lock, query_providers, record_check};
pub use store::{ProviderRecord, create, delete, get, list, update};
