//! The error codes of the API: what an error envelope's `type` says, and what a refusal,
//! an unresolved secret or an unusable workflow is called wherever it shows (an envelope,
//! a provider check, a run's error). Clients branch on these; the server names each one
//! here and nowhere else.

closed_set! {
    /// An error's stable machine code.
    ErrorCode {
        // Every endpoint's.
        InvalidRequest = "invalid_request",
        Unauthorized = "unauthorized",
        Forbidden = "forbidden",
        NotFound = "not_found",
        Conflict = "conflict",
        RateLimitExceeded = "rate_limit_exceeded",
        InternalError = "internal_error",
        Unavailable = "unavailable",
        // A request the resources cannot carry out as they stand.
        MediaJobNotRunnable = "media_job_not_runnable",
        UnsupportedCapability = "unsupported_capability",
        ProviderDisabled = "provider_disabled",
        ModelNotConfigured = "model_not_configured",
        WorkspaceExpired = "workspace_expired",
        WorkspaceUnavailable = "workspace_unavailable",
        ItemNotClaimed = "item_not_claimed",
        UnsupportedAction = "unsupported_action",
        ActionNotExecutable = "action_not_executable",
        ActionNotCancellable = "action_not_cancellable",
        NothingPushed = "nothing_pushed",
        TriageNotRunnable = "triage_not_runnable",
        // A write past what a run or a workspace may store.
        StorageQuotaExceeded = "storage_quota_exceeded",
        // A preset's secret or host, checked where it is used.
        SecretNotAllowed = "secret_not_allowed",
        SecretNotGranted = "secret_not_granted",
        SecretMissing = "secret_missing",
        SecretStoreUnavailable = "secret_store_unavailable",
        ProviderHostNotAllowed = "provider_host_not_allowed",
        // A WORKFLOW.md that cannot be used.
        MissingWorkflowFile = "missing_workflow_file",
        WorkflowParseError = "workflow_parse_error",
        WorkflowFrontMatterNotAMap = "workflow_front_matter_not_a_map",
        TemplateParseError = "template_parse_error",
        TemplateRenderError = "template_render_error",
    }
}
