//! `keel console`: a sign-in code of the console's (`api/console/`), as a link.

use keel_client::{Client, Error};

use crate::cli::output;
use crate::cli::output::{Format, time};

/// `keel console`: the console's sign-in link on stdout (for `xdg-open "$(keel console)"`),
/// or with `--output json` the API's answer, its code, as sent.
pub(super) async fn sign_in(client: &Client, format: Format) -> Result<(), Error> {
    let (answer, raw) = client.console_sign_in_code().fetch().await?;
    if format == Format::Json {
        output::print_raw(&raw);
        return Ok(());
    }
    println!("{}/console#sign-in={}", client.base_url(), answer.data.code);
    eprintln!(
        "Open it in a browser before {} UTC: it signs in once.",
        time(&answer.data.expires_at)
    );
    Ok(())
}
