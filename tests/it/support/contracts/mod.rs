//! The tracker contracts Keel's requests are checked against, each read from the package
//! its vendor publishes: GitHub's REST description and the schema Linear's SDK is
//! generated from.

mod github;
mod linear;

pub use github::assert_github_conforms;
pub use linear::assert_linear_conforms;
