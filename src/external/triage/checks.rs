//! What GitHub says failed on a head, read with `GET`s only: the failed workflow runs of the
//! head and their failed jobs, then the head's failed check runs that are no job (an Actions
//! job is a check run with the job's id), and a job's log, its tail kept and redacted.

use keel_api_types::CheckKind;
use keel_workers::media::Secret;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::external::github::{rate_limited, request};
use crate::external::tracker::{Pause, Poller, Tracker};

/// The conclusions that count as a failure.
const FAILED: [&str; 3] = ["failure", "timed_out", "startup_failure"];
/// The most of a job's log kept: its end, where the error usually is.
pub(crate) const MAX_LOG_BYTES: usize = 64 * 1024;
/// The most of a log read before its end is kept (a runaway log is cut, not read whole).
const MAX_LOG_READ_BYTES: usize = 32 * 1024 * 1024;

/// One failing check of a head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failing {
    pub(crate) kind: CheckKind,
    /// A job's is its workflow's name, then its own: `CI / test`.
    pub(crate) name: String,
    pub(crate) id: i64,
    pub(crate) conclusion: String,
    pub(crate) details_url: Option<String>,
    /// A check run's output title and summary.
    pub(crate) summary: Option<String>,
}

/// How GitHub is read: the tracker's endpoint and repository, with the token.
pub(crate) struct Reader<'a> {
    pub(crate) poller: &'a Poller,
    pub(crate) tracker: &'a Tracker,
    pub(crate) token: Option<&'a Secret>,
}

impl Reader<'_> {
    /// The head's failing jobs, then its failing check runs that are no job; at most
    /// `limit`, one per name.
    pub(crate) async fn failing(
        &self,
        head_sha: &str,
        limit: usize,
    ) -> Result<Vec<Failing>, Pause> {
        let mut failing: Vec<Failing> = Vec::new();
        let runs = self
            .json(&format!("/actions/runs?head_sha={head_sha}&per_page=100"))
            .await?;
        for run in array(&runs, "workflow_runs").iter().filter(|r| failed(r)) {
            let workflow = run["name"].as_str().unwrap_or("workflow");
            let run_id = run["id"].as_i64().unwrap_or_default();
            let jobs = self
                .json(&format!(
                    "/actions/runs/{run_id}/jobs?filter=latest&per_page=100"
                ))
                .await?;
            for job in array(&jobs, "jobs").iter().filter(|j| failed(j)) {
                let name = format!("{workflow} / {}", job["name"].as_str().unwrap_or("job"));
                failing.push(entry(CheckKind::WorkflowJob, name, job, None));
            }
        }
        let checks = self
            .json(&format!(
                "/commits/{head_sha}/check-runs?filter=latest&per_page=100"
            ))
            .await?;
        for check in array(&checks, "check_runs").iter().filter(|c| failed(c)) {
            let id = check["id"].as_i64().unwrap_or_default();
            if failing.iter().any(|f| f.id == id) {
                continue;
            }
            let name = check["name"].as_str().unwrap_or("check").to_string();
            let output = &check["output"];
            let summary = [&output["title"], &output["summary"]]
                .iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join("\n");
            let summary = Some(summary).filter(|s| !s.is_empty());
            failing.push(entry(CheckKind::CheckRun, name, check, summary));
        }
        let mut seen = std::collections::BTreeSet::new();
        failing.retain(|f| seen.insert(f.name.clone()));
        failing.truncate(limit);
        Ok(failing)
    }

    /// A job's log, its last [`MAX_LOG_BYTES`] (GitHub answers with a redirect to the log,
    /// which is followed without the token), each line redacted.
    pub(crate) async fn job_log(&self, job_id: i64) -> Result<String, Pause> {
        let path = format!("/actions/jobs/{job_id}/logs");
        let mut response = self.get(&path).await?;
        let mut tail: Vec<u8> = Vec::new();
        let mut read = 0;
        while read < MAX_LOG_READ_BYTES {
            let chunk = response
                .chunk()
                .await
                .map_err(|e| unreachable(format!("GET {path} failed: {}", e.without_url())))?;
            let Some(chunk) = chunk else { break };
            read += chunk.len();
            tail.extend_from_slice(&chunk);
            if tail.len() > 2 * MAX_LOG_BYTES {
                tail.drain(..tail.len() - MAX_LOG_BYTES);
            }
        }
        let start = tail.len().saturating_sub(MAX_LOG_BYTES);
        let text = String::from_utf8_lossy(&tail[start..]);
        Ok(redacted(&text, self.token))
    }

    /// A repository GET's JSON.
    async fn json(&self, path: &str) -> Result<Value, Pause> {
        let response = self.get(path).await?;
        response.json::<Value>().await.map_err(|e| Pause {
            code: "tracker_error",
            message: format!("GitHub's answer to GET {} is not JSON: {e}", strip(path)),
            until: None,
        })
    }

    /// `GET {endpoint}/repos/{repository}{path}`, successful, or why it is not.
    async fn get(&self, path: &str) -> Result<reqwest::Response, Pause> {
        let base = self.tracker.endpoint.trim_end_matches('/');
        let repository = self.tracker.repository.as_deref().unwrap_or_default();
        let url = format!("{base}/repos/{repository}{path}");
        let response = request(self.poller, Method::GET, &url, self.token)
            .send()
            .await
            .map_err(|e| unreachable(format!("GET {} failed: {}", strip(path), e.without_url())))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let until = rate_limited(status, response.headers(), chrono::Utc::now());
        let limited = until.is_some()
            && matches!(
                status,
                StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
            );
        Err(Pause {
            code: if limited {
                "rate_limited"
            } else {
                "tracker_error"
            },
            message: format!("GitHub answered GET {} with {status}", strip(path)),
            until,
        })
    }
}

fn entry(kind: CheckKind, name: String, value: &Value, summary: Option<String>) -> Failing {
    Failing {
        kind,
        name,
        id: value["id"].as_i64().unwrap_or_default(),
        conclusion: value["conclusion"]
            .as_str()
            .unwrap_or("failure")
            .to_string(),
        details_url: value["html_url"].as_str().map(String::from),
        summary,
    }
}

fn failed(value: &Value) -> bool {
    value["conclusion"]
        .as_str()
        .is_some_and(|c| FAILED.contains(&c))
}

fn array<'v>(value: &'v Value, field: &str) -> &'v [Value] {
    value[field].as_array().map_or(&[], Vec::as_slice)
}

/// A path without its query, for a message.
fn strip(path: &str) -> &str {
    path.split('?').next().unwrap_or(path)
}

fn unreachable(message: String) -> Pause {
    Pause {
        code: "tracker_unreachable",
        message,
        until: None,
    }
}

/// The log with the token, GitHub tokens and credential-looking values hidden.
fn redacted(text: &str, token: Option<&Secret>) -> String {
    const TOKEN_PREFIXES: [&str; 6] = ["ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"];
    let token = token.map(Secret::expose).filter(|t| !t.is_empty());
    text.lines()
        .map(|line| {
            let line = match token {
                Some(token) => line.replace(token, "[redacted]"),
                None => line.to_string(),
            };
            let words = line.split(' ').map(|word| {
                let bare = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_');
                match TOKEN_PREFIXES
                    .iter()
                    .any(|p| bare.starts_with(p) && bare.len() > p.len() + 8)
                {
                    true => word.replace(bare, "[redacted]"),
                    false => word.to_string(),
                }
            });
            crate::approvals::redact(&words.collect::<Vec<_>>().join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_keeps_no_token() {
        let token = Secret::new("s3cr3t-token".to_string());
        let log = "step 1\nusing s3cr3t-token here\nGITHUB_TOKEN=abc123 run\n\
                   leaked ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123 in output\nAuthorization: Bearer xyz";
        let out = redacted(log, Some(&token));
        for secret in [
            "s3cr3t-token",
            "abc123",
            "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123",
            "xyz",
        ] {
            assert!(!out.contains(secret), "{secret} in {out}");
        }
        assert!(out.starts_with("step 1\n"), "{out}");
    }
}
