//! Schedules: a task's one trigger, `once` at an instant or `cron` in an IANA time zone.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::schema::{KnownFormat, Schema, SchemaFormat};

use crate::schema::{
    Field, NO_NUL, NOT_BLANK, Variant, boolean, integer, one_of_strings, string, tagged_union,
};

/// The time zones a schedule may name: the IANA tz database as `chrono-tz` holds it, which
/// is what the server parses `timezone` with (`Tz::from_str`, exact names). `Local` is not
/// among them.
pub fn time_zones() -> impl Iterator<Item = &'static str> {
    chrono_tz::TZ_VARIANTS.iter().map(|zone| zone.name())
}

/// The body of `PUT /v1/tasks/{id}/schedule`, as the client sent it. The fields are
/// optional here so the server can name the one at fault; the document states the
/// contract, a union on `kind`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleDraft {
    pub kind: Option<String>,
    pub timezone: Option<String>,
    pub enabled: Option<bool>,
    pub run_at: Option<String>,
    pub cron_expression: Option<String>,
    /// The revision the client read; a stale one makes the edit fail instead of
    /// overwriting what a dispatcher or another edit did since.
    pub revision: Option<i64>,
}

/// Longest cron expression (bytes).
const MAX_EXPRESSION_BYTES: usize = 256;

hand_written_schema!(ScheduleDraft, schedule_union);

fn schedule_union(schemas: &mut Vec<(String, RefOr<Schema>)>) -> RefOr<Schema> {
    let common = || -> Vec<Field> {
        let zones: Vec<&str> = time_zones().collect();
        // Generators name enum members after the values, which for zones collide once
        // their punctuation is dropped (`GMT+0`, `GMT-0` and `GMT0`): each gets a name.
        let names: Vec<String> = zones
            .iter()
            .map(|zone| {
                zone.replace('+', "_plus_")
                    .replace('-', "_minus_")
                    .replace('/', "_")
            })
            .collect();
        let names = ExtensionsBuilder::new()
            .add("x-enum-varnames", names)
            .build();
        let timezone = one_of_strings(false, &zones)
            .extensions(Some(names))
            .description(Some(
                "An IANA time zone such as `Europe/Madrid` or `UTC`, as the tz database the \
                 server reads names them (case matters).",
            ));
        let revision = integer(true, 1, i64::MAX).description(Some(
            "The revision the client read; a stale one makes the edit fail (409) instead of \
             overwriting what a dispatcher or another edit did since.",
        ));
        vec![
            ("timezone", true, timezone.into()),
            ("enabled", true, boolean(false).into()),
            ("revision", false, revision.into()),
        ]
    };
    let run_at = string(false, NO_NUL, None)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
        .description(Some(
            "An RFC 3339 instant in the future (422 once it has passed).",
        ));
    let cron = string(false, NOT_BLANK, Some(MAX_EXPRESSION_BYTES)).description(Some(
        "A standard five-field cron expression (minute hour day-of-month month day-of-week, \
         names allowed) that fires at least once more; 422 for one that does not parse.",
    ));
    let variant = |tag, name, description, field: Field| Variant {
        tag,
        name,
        description,
        fields: std::iter::once(field).chain(common()).collect(),
        rules: Vec::new(),
    };
    tagged_union(
        "kind",
        "A task's one trigger, by `kind`.",
        vec![
            variant(
                "once",
                "OnceScheduleDraft",
                "Fire once, at `run_at`.",
                ("run_at", true, run_at.into()),
            ),
            variant(
                "cron",
                "CronScheduleDraft",
                "Fire at every time the expression names, on the zone's wall clock.",
                ("cron_expression", true, cron.into()),
            ),
        ],
        schemas,
    )
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[schema(example = json!({
    "id": "sched_01a22b05d4cc7d6e8f9a0b1c2d3e4f5a", "task_id": "task_01a22b05c3e1734c9d7a0f2b6e41d890",
    "kind": "cron", "timezone": "Europe/Madrid", "run_at": null, "cron_expression": "0 9 * * 1-5",
    "enabled": true, "next_run_at": "2026-12-01T08:00:00Z", "revision": 3,
    "written_by": "alice", "created_at": "2026-11-30T09:00:00Z",
    "updated_at": "2026-11-30T09:00:00Z"
}))]
pub struct ScheduleRecord {
    pub id: String,
    pub task_id: String,
    /// `once` (at `run_at`) or `cron` (at each firing of `cron_expression`).
    #[schema(value_type = ScheduleKind)]
    pub kind: String,
    pub timezone: String,
    pub run_at: Option<DateTime<Utc>>,
    pub cron_expression: Option<String>,
    pub enabled: bool,
    /// Omitted while paused (or spent), as the API promises.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_run_at: Option<DateTime<Utc>>,
    pub revision: i64,
    /// The actor who last wrote the schedule: the requester of every run it starts, so
    /// they cannot approve those runs themselves. Null for a schedule last written before
    /// writers were recorded whose writer the audit trail does not show: its runs are
    /// requested by `system`.
    pub written_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The workspace the schedule (and the runs it creates) belongs to.
    #[serde(skip)]
    pub workspace_id: String,
}

closed_set! {
    /// How a schedule fires.
    ScheduleKind {
        Once = "once",
        Cron = "cron",
    }
}

closed_set! {
    /// What became of one firing: `claimed` by the scheduler, `started` (its run exists),
    /// `skipped` (the task had an active run) or `failed` (the run could not be created).
    OccurrenceStatus {
        Claimed = "claimed",
        Started = "started",
        Skipped = "skipped",
        Failed = "failed",
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct OccurrenceRecord {
    pub id: String,
    pub task_id: String,
    pub schedule_id: String,
    pub scheduled_for: DateTime<Utc>,
    pub status: OccurrenceStatus,
    pub claimed_at: DateTime<Utc>,
    pub run_id: Option<String>,
    pub error: Option<String>,
    pub completed_at: Option<DateTime<Utc>>,
}
