//! Schedules: a task's one trigger, `once` at an instant or `cron` in an IANA time zone.
//! This module owns their validation and every time computation: when a schedule next
//! fires, and which instant an overdue firing stands for. All of it is pure and takes `now`
//! as an argument, so tests drive the clock (DST days included) instead of waiting for it.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
pub use keel_api_types::ScheduleDraft;

use crate::domain::Invalid;

const MAX_EXPRESSION_BYTES: usize = 256;
const MONTH_NAMES: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAY_NAMES: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// What makes a schedule fire.
#[derive(Debug, Clone)]
pub(crate) enum Trigger {
    /// Once, at this instant.
    Once { run_at: DateTime<Utc> },
    /// At every time the five-field expression names, on the zone's wall clock.
    Cron { expression: String, cron: Box<Cron> },
}

/// A valid schedule definition: its trigger and the zone it is read in.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    pub(crate) trigger: Trigger,
    pub(crate) timezone: Tz,
}

/// A validated `PUT` body.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub(crate) schedule: Schedule,
    pub(crate) enabled: bool,
    pub(crate) expected_revision: Option<i64>,
}

/// What one dispatch of a due schedule does: the occurrence it records and where the
/// schedule goes next (`None`: it is spent and becomes disabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Firing {
    pub(crate) scheduled_for: DateTime<Utc>,
    pub(crate) next_run_at: Option<DateTime<Utc>>,
}

impl NewSchedule {
    pub fn parse(draft: ScheduleDraft, now: DateTime<Utc>) -> Result<NewSchedule, Invalid> {
        let kind = required("kind", draft.kind.as_deref())?;
        let enabled = draft
            .enabled
            .ok_or_else(|| Invalid::new("enabled", "is required (true or false)"))?;
        let timezone = parse_timezone(required("timezone", draft.timezone.as_deref())?)?;
        let trigger = match kind {
            "once" => {
                refuse("cron_expression", &draft.cron_expression, "once")?;
                let run_at = parse_run_at(required("run_at", draft.run_at.as_deref())?, now)?;
                Trigger::Once { run_at }
            }
            "cron" => {
                refuse("run_at", &draft.run_at, "cron")?;
                let expression = required("cron_expression", draft.cron_expression.as_deref())?;
                parse_cron(expression, timezone, now)?
            }
            other => {
                return Err(Invalid::new(
                    "kind",
                    format!("unknown kind '{other}' (expected once or cron)"),
                ));
            }
        };
        let expected_revision = match draft.revision {
            Some(revision) if revision < 1 => {
                return Err(Invalid::new(
                    "revision",
                    "must be a revision read from the schedule (1 or more)",
                ));
            }
            other => other,
        };
        Ok(NewSchedule {
            schedule: Schedule { trigger, timezone },
            enabled,
            expected_revision,
        })
    }

    /// The `next_run_at` this definition starts with: none while paused, else the first
    /// firing after `now` (so re-enabling a cron never fires the past).
    pub(crate) fn next_run_at(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.enabled
            .then(|| self.schedule.next_after(now))
            .flatten()
    }
}

impl Schedule {
    /// Rebuilds a stored schedule. Stored rows were validated when written; this fails only
    /// if the cron parser changed its mind about an expression since.
    pub(crate) fn from_stored(
        timezone: &str,
        run_at: Option<DateTime<Utc>>,
        cron_expression: Option<&str>,
    ) -> Result<Schedule, Invalid> {
        let timezone = parse_timezone(timezone)?;
        let trigger = match (run_at, cron_expression) {
            (Some(run_at), None) => Trigger::Once { run_at },
            (None, Some(expression)) => Trigger::Cron {
                expression: expression.to_string(),
                cron: Box::new(parse_cron_syntax(expression)?),
            },
            _ => {
                return Err(Invalid::new(
                    "kind",
                    "a schedule has exactly one of run_at and cron_expression",
                ));
            }
        };
        Ok(Schedule { trigger, timezone })
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self.trigger {
            Trigger::Once { .. } => "once",
            Trigger::Cron { .. } => "cron",
        }
    }

    /// The first firing strictly after `after`, or None when there is none.
    pub(crate) fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.trigger {
            Trigger::Once { run_at } => (*run_at > after).then_some(*run_at),
            Trigger::Cron { cron, .. } => cron
                .find_next_occurrence(&after.with_timezone(&self.timezone), false)
                .ok()
                .map(|next| next.with_timezone(&Utc)),
        }
    }

    /// Fires a schedule that was due at `due` (its stored `next_run_at`, at or before
    /// `now`). A `once` fires for its instant and is spent. A `cron` that missed several
    /// times (the runtime was down) fires once, for the latest missed time: there is no
    /// backfill. Its next time is the first one after `now`.
    pub(crate) fn fire(&self, due: DateTime<Utc>, now: DateTime<Utc>) -> Firing {
        match &self.trigger {
            Trigger::Once { .. } => Firing {
                scheduled_for: due,
                next_run_at: None,
            },
            Trigger::Cron { cron, .. } => {
                let latest_missed = cron
                    .find_previous_occurrence(&now.with_timezone(&self.timezone), true)
                    .map(|time| time.with_timezone(&Utc))
                    .unwrap_or(due);
                Firing {
                    scheduled_for: latest_missed.max(due),
                    next_run_at: self.next_after(now),
                }
            }
        }
    }
}

fn parse_timezone(name: &str) -> Result<Tz, Invalid> {
    // `Local` means "this process's zone", which differs between replicas.
    if name.eq_ignore_ascii_case("local") {
        return Err(Invalid::new(
            "timezone",
            "'Local' is not accepted: name an IANA zone such as Europe/Madrid or UTC",
        ));
    }
    Tz::from_str(name).map_err(|_| {
        Invalid::new(
            "timezone",
            format!(
                "unknown time zone '{name}' (expected an IANA name such as Europe/Madrid or UTC)"
            ),
        )
    })
}

fn parse_run_at(value: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, Invalid> {
    let run_at = DateTime::parse_from_rfc3339(value)
        .map_err(|_| {
            Invalid::new(
                "run_at",
                format!("'{value}' is not an RFC 3339 timestamp (such as 2026-07-21T07:00:00Z)"),
            )
        })?
        .with_timezone(&Utc);
    if run_at <= now {
        return Err(Invalid::new(
            "run_at",
            format!("must be in the future ({value} has passed)"),
        ));
    }
    Ok(run_at)
}

/// A standard five-field expression that fires at least once more after `now` in `zone`.
fn parse_cron(expression: &str, zone: Tz, now: DateTime<Utc>) -> Result<Trigger, Invalid> {
    let expression = expression.trim();
    if expression.len() > MAX_EXPRESSION_BYTES {
        return Err(Invalid::new(
            "cron_expression",
            format!("is longer than {MAX_EXPRESSION_BYTES} bytes"),
        ));
    }
    let trigger = Trigger::Cron {
        expression: expression.to_string(),
        cron: Box::new(parse_cron_syntax(expression)?),
    };
    let schedule = Schedule {
        trigger,
        timezone: zone,
    };
    if schedule.next_after(now).is_none() {
        return Err(Invalid::new(
            "cron_expression",
            format!("'{expression}' never fires (no such date follows now)"),
        ));
    }
    Ok(schedule.trigger)
}

fn parse_cron_syntax(expression: &str) -> Result<Cron, Invalid> {
    // croner expands descriptors even when told to take five fields only.
    if expression.starts_with('@') {
        return Err(Invalid::new(
            "cron_expression",
            format!(
                "descriptors such as '{expression}' are not accepted: write the five fields \
                 (for @daily, '0 0 * * *')"
            ),
        ));
    }
    let fields: Vec<&str> = expression.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(Invalid::new(
            "cron_expression",
            format!(
                "must have five fields (minute hour day-of-month month day-of-week), not {}; \
                 seconds and years are not accepted",
                fields.len()
            ),
        ));
    }
    for (position, field) in fields.iter().enumerate() {
        check_standard_field(position, field)?;
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(expression)
        .map_err(|e| {
            Invalid::new(
                "cron_expression",
                format!("'{expression}' is not a valid cron expression: {e}"),
            )
        })
}

/// Refuses croner's extensions (`L`, `W`, `#`, `?`, a leading `+`) so an expression means
/// the same to Keel as to any standard cron: each field is a list of `*`, numbers and
/// ranges with optional steps; months and weekdays may use their three-letter names.
fn check_standard_field(position: usize, field: &str) -> Result<(), Invalid> {
    const FIELD_NAMES: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];
    let names: &[&str] = match position {
        3 => &MONTH_NAMES,
        4 => &DAY_NAMES,
        _ => &[],
    };
    let token_ok = |token: &str| {
        token == "*"
            || (!token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()))
            || names.iter().any(|name| name.eq_ignore_ascii_case(token))
    };
    if field.split([',', '-', '/']).all(token_ok) {
        return Ok(());
    }
    Err(Invalid::new(
        "cron_expression",
        format!(
            "the {} field '{field}' is not standard cron (use *, numbers, ranges a-b, \
             steps /n and lists a,b)",
            FIELD_NAMES[position]
        ),
    ))
}

/// Refuses a field that belongs to the other kind, so a typo cannot be ignored.
fn refuse(field: &'static str, value: &Option<String>, kind: &str) -> Result<(), Invalid> {
    match value {
        Some(_) => Err(Invalid::new(
            field,
            format!("is not allowed with kind {kind}"),
        )),
        None => Ok(()),
    }
}

fn required<'a>(field: &'static str, value: Option<&'a str>) -> Result<&'a str, Invalid> {
    match value {
        Some(v) if !v.trim().is_empty() => Ok(v),
        Some(_) => Err(Invalid::new(field, "must not be empty")),
        None => Err(Invalid::new(field, "is required")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn cron(expression: &str, zone: &str) -> Schedule {
        Schedule::from_stored(zone, None, Some(expression)).unwrap()
    }

    fn draft(kind: &str) -> ScheduleDraft {
        ScheduleDraft {
            kind: Some(kind.into()),
            timezone: Some("Europe/Madrid".into()),
            enabled: Some(true),
            ..ScheduleDraft::default()
        }
    }

    fn cron_draft(expression: &str) -> ScheduleDraft {
        ScheduleDraft {
            cron_expression: Some(expression.into()),
            ..draft("cron")
        }
    }

    /// The next `count` firings after `from`.
    fn firings(schedule: &Schedule, from: &str, count: usize) -> Vec<DateTime<Utc>> {
        let mut times = Vec::new();
        let mut cursor = at(from);
        for _ in 0..count {
            cursor = schedule.next_after(cursor).unwrap();
            times.push(cursor);
        }
        times
    }

    const NOW: &str = "2026-06-01T10:00:00Z";

    #[test]
    fn refusals_name_the_field() {
        let now = at(NOW);
        let cases = [
            (ScheduleDraft::default(), "kind"),
            (
                ScheduleDraft {
                    enabled: None,
                    ..cron_draft("* * * * *")
                },
                "enabled",
            ),
            (
                ScheduleDraft {
                    timezone: None,
                    ..cron_draft("* * * * *")
                },
                "timezone",
            ),
            (draft("hourly"), "kind"),
            (draft("once"), "run_at"),
            (draft("cron"), "cron_expression"),
            (
                ScheduleDraft {
                    timezone: Some("Local".into()),
                    ..cron_draft("* * * * *")
                },
                "timezone",
            ),
            (
                ScheduleDraft {
                    timezone: Some("Mars/Olympus".into()),
                    ..cron_draft("* * * * *")
                },
                "timezone",
            ),
            (
                ScheduleDraft {
                    run_at: Some("tomorrow".into()),
                    ..draft("once")
                },
                "run_at",
            ),
            (
                ScheduleDraft {
                    run_at: Some("2026-06-01T09:59:59Z".into()),
                    ..draft("once")
                },
                "run_at",
            ),
            (
                ScheduleDraft {
                    run_at: Some("2026-07-01T00:00:00Z".into()),
                    ..cron_draft("* * * * *")
                },
                "run_at",
            ),
            (
                ScheduleDraft {
                    run_at: Some("2026-07-01T00:00:00Z".into()),
                    cron_expression: Some("* * * * *".into()),
                    ..draft("once")
                },
                "cron_expression",
            ),
            (
                ScheduleDraft {
                    revision: Some(0),
                    ..cron_draft("* * * * *")
                },
                "revision",
            ),
        ];
        for (draft, field) in cases {
            let error = NewSchedule::parse(draft.clone(), now).unwrap_err();
            assert_eq!(error.field, field, "{draft:?}: {error}");
        }
    }

    #[test]
    fn only_standard_five_field_expressions_that_fire_are_accepted() {
        let now = at(NOW);
        let refused = [
            "0 * * * * *",    // seconds
            "0 0 * * * 2027", // a year
            "* * * *",
            "@daily",
            "@hourly",
            "@reboot",
            "0 0 L * *",
            "0 0 15W * *",
            "0 0 * * 5#3",
            "0 0 ? * 1",
            "0 0 1 * +1",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * 13 *",
            "* * * * 8",
            "*/0 * * * *",
            "0 0 31 2 *", // never fires
            "0 0 30 2 *",
            "0 0 31 4,6,9,11 *",
        ];
        for expression in refused {
            let error = NewSchedule::parse(cron_draft(expression), now).unwrap_err();
            assert_eq!(error.field, "cron_expression", "{expression}: {error}");
        }
        let disabled = ScheduleDraft {
            enabled: Some(false),
            ..cron_draft("0 0 31 2 *")
        };
        assert!(
            NewSchedule::parse(disabled, now).is_err(),
            "refused even when disabled"
        );
        let accepted = [
            "* * * * *",
            "*/15 9-17 * * 1-5",
            "0 9 * * MON-FRI",
            "0 0 1 jan,jul *",
            "5,35 */2 1-15 * sun",
            "0 0 29 2 *", // only in leap years, but it does fire
            "0 12 * * 7",
        ];
        for expression in accepted {
            let parsed = NewSchedule::parse(cron_draft(expression), now);
            assert!(parsed.is_ok(), "{expression}: {parsed:?}");
        }
    }

    #[test]
    fn zero_and_seven_are_sunday_and_day_fields_combine_like_vixie_cron() {
        // 2026-06-07 is a Sunday.
        for expression in ["0 12 * * 0", "0 12 * * 7", "0 12 * * SUN"] {
            let schedule = cron(expression, "UTC");
            assert_eq!(
                firings(&schedule, NOW, 1),
                [at("2026-06-07T12:00:00Z")],
                "{expression}"
            );
        }
        // Both day fields restricted: either one matching is enough (the 13th, or a
        // Friday: 2026-06-05 is the first Friday after NOW).
        let schedule = cron("0 0 13 * 5", "UTC");
        assert_eq!(
            firings(&schedule, NOW, 3),
            [
                at("2026-06-05T00:00:00Z"),
                at("2026-06-12T00:00:00Z"),
                at("2026-06-13T00:00:00Z")
            ]
        );
    }

    #[test]
    fn cron_follows_the_zone_wall_clock() {
        // 09:00 in Madrid is 07:00 UTC in summer and 08:00 UTC in winter.
        let schedule = cron("0 9 * * *", "Europe/Madrid");
        assert_eq!(
            firings(&schedule, "2026-10-24T12:00:00Z", 2),
            [at("2026-10-25T08:00:00Z"), at("2026-10-26T08:00:00Z")]
        );
        assert_eq!(
            firings(&schedule, "2026-03-28T12:00:00Z", 2),
            [at("2026-03-29T07:00:00Z"), at("2026-03-30T07:00:00Z")]
        );
    }

    /// Europe/Madrid, 2026-03-29: at 02:00 CET (01:00 UTC) clocks jump to 03:00 CEST.
    #[test]
    fn spring_forward_runs_a_skipped_time_at_the_first_valid_instant() {
        // 02:30 does not exist that night: the job runs at 03:00 CEST, once.
        let daily = cron("30 2 * * *", "Europe/Madrid");
        assert_eq!(
            firings(&daily, "2026-03-28T12:00:00Z", 3),
            [
                at("2026-03-29T01:00:00Z"), // 03:00 CEST
                at("2026-03-30T00:30:00Z"), // 02:30 CEST
                at("2026-03-31T00:30:00Z"),
            ]
        );
        // An interval job simply has no times inside the gap.
        let quarterly = cron("*/30 * * * *", "Europe/Madrid");
        assert_eq!(
            firings(&quarterly, "2026-03-29T00:15:00Z", 3),
            [
                at("2026-03-29T00:30:00Z"), // 01:30 CET
                at("2026-03-29T01:00:00Z"), // 03:00 CEST
                at("2026-03-29T01:30:00Z"), // 03:30 CEST
            ]
        );
    }

    /// Europe/Madrid, 2026-10-25: at 03:00 CEST (01:00 UTC) clocks go back to 02:00 CET.
    #[test]
    fn fall_back_runs_a_repeated_time_once() {
        let daily = cron("30 2 * * *", "Europe/Madrid");
        assert_eq!(
            firings(&daily, "2026-10-24T12:00:00Z", 2),
            [
                at("2026-10-25T00:30:00Z"), // 02:30 CEST, the first of the two
                at("2026-10-26T01:30:00Z"), // 02:30 CET, the next day
            ]
        );
        // Asked from inside the repeated hour (02:10 CET, the second pass), it does not
        // go back to the 02:30 it already ran at.
        assert_eq!(
            firings(&daily, "2026-10-25T01:10:00Z", 1),
            [at("2026-10-26T01:30:00Z")]
        );
        // An interval job follows elapsed time: the repeated hour's times run twice.
        let half_hourly = cron("*/30 * * * *", "Europe/Madrid");
        assert_eq!(
            firings(&half_hourly, "2026-10-24T23:45:00Z", 5),
            [
                at("2026-10-25T00:00:00Z"), // 02:00 CEST
                at("2026-10-25T00:30:00Z"), // 02:30 CEST
                at("2026-10-25T01:00:00Z"), // 02:00 CET
                at("2026-10-25T01:30:00Z"), // 02:30 CET
                at("2026-10-25T02:00:00Z"), // 03:00 CET
            ]
        );
    }

    #[test]
    fn an_overdue_cron_fires_once_for_its_latest_missed_time() {
        let hourly = cron("0 * * * *", "Europe/Madrid");
        let due = at("2026-06-01T10:00:00Z");
        let firing = hourly.fire(due, at("2026-06-01T13:20:00Z"));
        assert_eq!(
            firing,
            Firing {
                scheduled_for: at("2026-06-01T13:00:00Z"),
                next_run_at: Some(at("2026-06-01T14:00:00Z")),
            }
        );
        // On time, it fires for the time it was due.
        let firing = hourly.fire(due, due);
        assert_eq!(firing.scheduled_for, due);
        assert_eq!(firing.next_run_at, Some(at("2026-06-01T11:00:00Z")));
    }

    #[test]
    fn coalescing_across_dst_changes_stays_on_the_wall_clock() {
        let daily = cron("30 2 * * *", "Europe/Madrid");
        // Down from before spring-forward until the next afternoon: the latest missed
        // time is the skipped 02:30, run at 03:00 CEST.
        let firing = daily.fire(at("2026-03-28T01:30:00Z"), at("2026-03-29T12:00:00Z"));
        assert_eq!(firing.scheduled_for, at("2026-03-29T01:00:00Z"));
        assert_eq!(firing.next_run_at, Some(at("2026-03-30T00:30:00Z")));
        // Down across fall-back: the latest missed time is the one 02:30 of that day.
        let firing = daily.fire(at("2026-10-24T00:30:00Z"), at("2026-10-25T01:40:00Z"));
        assert_eq!(firing.scheduled_for, at("2026-10-25T00:30:00Z"));
        assert_eq!(firing.next_run_at, Some(at("2026-10-26T01:30:00Z")));
    }

    #[test]
    fn a_once_schedule_fires_for_its_instant_and_is_spent() {
        let now = at(NOW);
        let once = |run_at: &str| ScheduleDraft {
            run_at: Some(run_at.into()),
            ..draft("once")
        };
        let error = NewSchedule::parse(once("2026-06-01T12:00:00+02:00"), now).unwrap_err();
        assert_eq!(error.field, "run_at", "now is not in the future");
        let new = NewSchedule::parse(once("2026-06-01T12:30:00+02:00"), now).unwrap();
        let run_at = at("2026-06-01T10:30:00Z");
        assert_eq!(new.next_run_at(now), Some(run_at));
        // Three days late, it still fires once, for its instant, and is spent.
        let firing = new.schedule.fire(run_at, now + chrono::Duration::days(3));
        assert_eq!(
            firing,
            Firing {
                scheduled_for: run_at,
                next_run_at: None
            }
        );
    }

    #[test]
    fn a_paused_schedule_has_no_next_time_and_resumes_from_now() {
        let now = at(NOW);
        let paused = NewSchedule::parse(
            ScheduleDraft {
                enabled: Some(false),
                ..cron_draft("0 * * * *")
            },
            now,
        )
        .unwrap();
        assert_eq!(paused.next_run_at(now), None);
        let later = at("2026-06-03T17:42:00Z");
        let resumed = NewSchedule::parse(cron_draft("0 * * * *"), later).unwrap();
        assert_eq!(resumed.next_run_at(later), Some(at("2026-06-03T18:00:00Z")));
    }
}
