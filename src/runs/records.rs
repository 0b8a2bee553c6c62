//! The two macros that read [`RunRecord`](keel_api_types::RunRecord)s, for every module of
//! `runs` (declared first, so the others see them).

/// `query_as!` of [`RunRecord`]s: `$before` (a `WITH …` or nothing), then the run's
/// columns (`status` as a [`RunStatus`]), then `$after` (its `FROM …`, literals joined
/// with `+`).
macro_rules! query_runs {
    ($before:literal, $after:literal $(+ $more:literal)* $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            RunRecord,
            $before
                + r#"SELECT id, task_id, number, status AS "status: RunStatus", attempt,
                       worker_id, exit_code, last_error, retried_from_run_id,
                       resumed_from_run_id, checkpoint, prior_cost_micros_usd,
                       total_cost_micros_usd, model_call_count, abandoned_model_calls, model,
                       provider, workspace_run_id, schedule_id, schedule_occurrence_id,
                       scheduled_for, created_at, started_at, finished_at, updated_at,
                       lineage_kind, from_model_call_index, conversation_base, requested_by,
                       answer, terminal_code AS "terminal_code: keel_api_types::TerminalCode" "#
                + $after
                $(+ $more)*
            $(, $arg)*
        )
    };
}

/// The [`RunRecord`] of a `query!` row that selects its columns (`status` as a
/// [`RunStatus`]) besides others, which stay readable on the row.
macro_rules! run_record {
    ($row:ident) => {
        RunRecord {
            id: $row.id,
            task_id: $row.task_id,
            number: $row.number,
            status: $row.status,
            attempt: $row.attempt,
            worker_id: $row.worker_id,
            exit_code: $row.exit_code,
            last_error: $row.last_error,
            retried_from_run_id: $row.retried_from_run_id,
            resumed_from_run_id: $row.resumed_from_run_id,
            checkpoint: $row.checkpoint,
            prior_cost_micros_usd: $row.prior_cost_micros_usd,
            total_cost_micros_usd: $row.total_cost_micros_usd,
            model_call_count: $row.model_call_count,
            abandoned_model_calls: $row.abandoned_model_calls,
            model: $row.model,
            provider: $row.provider,
            lineage_kind: $row.lineage_kind,
            from_model_call_index: $row.from_model_call_index,
            answer: $row.answer,
            terminal_code: $row.terminal_code,
            conversation_base: $row.conversation_base,
            workspace_run_id: $row.workspace_run_id,
            schedule_id: $row.schedule_id,
            schedule_occurrence_id: $row.schedule_occurrence_id,
            scheduled_for: $row.scheduled_for,
            requested_by: $row.requested_by,
            created_at: $row.created_at,
            started_at: $row.started_at,
            finished_at: $row.finished_at,
            updated_at: $row.updated_at,
        }
    };
}
