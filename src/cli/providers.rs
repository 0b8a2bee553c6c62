//! `keel providers …` and `keel secrets status`: provider presets, their templates and
//! checks, and whether a secret reference resolves (`api/providers.rs`).

use clap::{Args, Subcommand};
use keel_client::{Client, Error, ProviderDraft, ProviderPatch, ProviderTemplate, ProviderView};

use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, or_dash, time};
use crate::cli::watch::Outcome;

#[derive(Debug, Subcommand)]
pub(crate) enum ProviderCommand {
    List {
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        id: String,
    },
    /// Creates a preset. Secrets are named by reference (`--api-key-ref env:NAME`), never
    /// given.
    Create(CreateProvider),
    /// Request bodies for `providers create`, one per supported vendor.
    Templates {
        #[command(flatten)]
        page: PageArgs,
    },
    /// Changes the given fields of a preset; the others stay.
    Update(UpdateProvider),
    /// Deletes a preset that no media job names.
    Delete {
        id: String,
    },
    /// Checks the preset can be used; `--live` also makes one tiny billed call.
    Check {
        id: String,
        #[arg(long)]
        live: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct UpdateProvider {
    id: String,
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    base_url: Option<String>,
    #[arg(long)]
    display_name: Option<String>,
    /// `env:NAME`, `file:/absolute/path` or `keychain:NAME`.
    #[arg(long)]
    api_key_ref: Option<String>,
    /// Removes the preset's secret reference.
    #[arg(long, conflicts_with = "api_key_ref")]
    no_api_key_ref: bool,
    /// A capability; repeat for several (replaces the preset's list).
    #[arg(long = "capability")]
    capabilities: Vec<String>,
    /// `true` or `false`.
    #[arg(long)]
    enabled: Option<bool>,
}

impl UpdateProvider {
    fn patch(&self) -> ProviderPatch {
        let api_key_ref = if self.no_api_key_ref {
            Some(None)
        } else {
            self.api_key_ref.clone().map(Some)
        };
        ProviderPatch {
            model: self.model.clone(),
            base_url: self.base_url.clone(),
            display_name: self.display_name.clone(),
            api_key_ref,
            capabilities: (!self.capabilities.is_empty()).then(|| self.capabilities.clone()),
            enabled: self.enabled,
            ..ProviderPatch::default()
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct CreateProvider {
    /// `openai-images`, `seedream` or `seedance` for media presets; any slug for chat ones.
    #[arg(long)]
    kind: String,
    #[arg(long)]
    model: String,
    /// `media-job`, `openai-completions`, `openai-responses` or `anthropic-messages`.
    #[arg(long)]
    api: String,
    #[arg(long)]
    base_url: String,
    /// `env:NAME`, `file:/absolute/path` or `keychain:NAME`.
    #[arg(long)]
    api_key_ref: Option<String>,
    /// A slug; default: the kind.
    #[arg(long)]
    provider_id: Option<String>,
    #[arg(long)]
    display_name: Option<String>,
    /// A capability (`chat`, `tool_call`, `image_generate`, …); repeat for several.
    #[arg(long = "capability")]
    capabilities: Vec<String>,
    /// An input kind (`text`, `image`); repeat for several.
    #[arg(long = "input")]
    input: Vec<String>,
    /// Create it enabled (presets are created disabled otherwise).
    #[arg(long)]
    enabled: bool,
    /// Print only the new preset's id.
    #[arg(long, short)]
    quiet: bool,
}

impl CreateProvider {
    fn draft(self) -> ProviderDraft {
        ProviderDraft {
            kind: self.kind,
            display_name: self.display_name,
            provider_id: self.provider_id,
            model: self.model,
            api: self.api,
            base_url: self.base_url,
            api_key_ref: self.api_key_ref,
            headers: Default::default(),
            secret_header_refs: Default::default(),
            capabilities: self.capabilities,
            input: self.input,
            compat: Default::default(),
            enabled: self.enabled,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum SecretCommand {
    /// `env:NAME`, `file:/absolute/path` or `keychain:NAME`, as the secret policy allows.
    Status {
        reference: String,
        /// What it is for (`provider_api_key`, `github_token`, …).
        #[arg(long)]
        purpose: Option<String>,
    },
}

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: ProviderCommand,
) -> Result<Outcome, Error> {
    let done = match command {
        ProviderCommand::List { page } => list(client, format, &page).await,
        ProviderCommand::Show { id } => output::show(format, client.get_provider(&id), |p| {
            provider_fields(&p.data)
        })
        .await
        .map(drop),
        ProviderCommand::Create(args) => {
            let quiet = args.quiet;
            let draft = args.draft();
            let call = client.create_provider(&draft);
            output::show_or_id(
                format,
                quiet,
                call,
                |p| p.data.id.clone(),
                |p| provider_fields(&p.data),
            )
            .await
            .map(drop)
        }
        ProviderCommand::Templates { page } => templates(client, format, &page).await,
        ProviderCommand::Update(args) => {
            let call = client.patch_provider(&args.id, &args.patch());
            output::show(format, call, |p| provider_fields(&p.data))
                .await
                .map(drop)
        }
        ProviderCommand::Delete { id } => {
            client.delete_provider(&id).await?;
            if format == Format::Table {
                println!("deleted the provider preset {id}");
            }
            Ok(())
        }
        ProviderCommand::Check { id, live } => return check(client, format, &id, live).await,
    };
    done.map(|()| Outcome::Done)
}

async fn list(client: &Client, format: Format, page: &PageArgs) -> Result<(), Error> {
    let headers = ["ID", "KIND", "API", "MODEL", "ENABLED", "KEY", "NAME"];
    output::list(
        format,
        page,
        client.list_providers(),
        &headers,
        |p: &ProviderView| {
            let cells = [&p.id, &p.kind, &p.api, &p.model];
            let mut row: Vec<String> = cells.into_iter().cloned().collect();
            let key = if p.api_key_configured {
                "configured"
            } else {
                "missing"
            };
            row.extend([p.enabled.to_string(), key.into(), p.display_name.clone()]);
            row
        },
    )
    .await
}

async fn templates(client: &Client, format: Format, page: &PageArgs) -> Result<(), Error> {
    let headers = ["TEMPLATE", "KIND", "API", "MODEL", "NAME"];
    output::list(
        format,
        page,
        client.list_templates(),
        &headers,
        |t: &ProviderTemplate| {
            let cells = [&t.template_id, &t.kind, &t.api, &t.model, &t.display_name];
            cells.into_iter().map(|c| c.to_string()).collect()
        },
    )
    .await
}

/// Ends failed (exit 1) when the preset cannot be used, so a script can tell.
async fn check(client: &Client, format: Format, id: &str, live: bool) -> Result<Outcome, Error> {
    let checked = output::show(format, client.check_provider(id, live), |c| {
        let c = &c.data;
        Table::fields(&[
            ("ok", c.ok.to_string()),
            ("code", c.code.clone()),
            ("message", c.message.clone()),
            ("live", c.live.to_string()),
            ("checked at", time(&c.checked_at)),
        ])
    })
    .await?;
    Ok(match checked.data.ok {
        true => Outcome::Done,
        false => Outcome::Failed,
    })
}

pub(super) async fn secrets(
    client: &Client,
    format: Format,
    command: SecretCommand,
) -> Result<(), Error> {
    let SecretCommand::Status { reference, purpose } = command;
    let call = client.secret_status(&reference, purpose.as_deref());
    output::show(format, call, |s| {
        let s = &s.data;
        Table::fields(&[
            ("ref", s.r#ref.clone()),
            ("kind", s.kind.clone()),
            ("configured", s.configured.to_string()),
            ("error", or_dash(s.error_code.as_ref())),
            ("message", or_dash(s.message.as_ref())),
        ])
    })
    .await
    .map(drop)
}

/// A preset's fields: its secret by reference and whether it resolves, never a value.
fn provider_fields(p: &ProviderView) -> Table {
    Table::fields(&[
        ("id", p.id.clone()),
        ("name", p.display_name.clone()),
        ("kind", p.kind.clone()),
        ("api", p.api.clone()),
        ("base url", p.base_url.clone()),
        ("model", p.model.clone()),
        ("capabilities", p.capabilities.join(", ")),
        ("enabled", p.enabled.to_string()),
        ("key ref", or_dash(p.api_key_ref.as_ref())),
        ("key configured", p.api_key_configured.to_string()),
    ])
}
