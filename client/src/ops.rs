//! One method per API operation, each a [`Call`] on its path.

use reqwest::Method;

use crate::call::Call;
use crate::types::*;
use crate::{Client, Error, segment};

/// A source's path, with `rest` (a sub-resource) after it.
fn source_path(source_id: &str, rest: &str) -> String {
    format!("/v1/external-work/sources/{}{rest}", segment(source_id))
}

fn run_path(task_id: &str, run_id: &str) -> String {
    format!("/v1/tasks/{}/runs/{}", segment(task_id), segment(run_id))
}

/// The path of one of a run's `kind` (`steps`, `artifacts`, `patches`), with `rest` after it.
fn run_item(task_id: &str, run_id: &str, kind: &str, id: &str, rest: &str) -> String {
    format!("{}/{kind}/{}{rest}", run_path(task_id, run_id), segment(id))
}

impl Client {
    fn get<T>(&self, path: String) -> Call<'_, T> {
        Call::new(self, Method::GET, path)
    }

    fn post<T>(&self, path: String) -> Call<'_, T> {
        Call::new(self, Method::POST, path)
    }

    fn delete<T>(&self, path: String) -> Call<'_, T> {
        Call::new(self, Method::DELETE, path)
    }

    // Probes and the document.

    /// Liveness of the API's host: it serves HTTP.
    pub fn healthz(&self) -> Call<'_, Health> {
        self.get("/healthz".into())
    }

    /// Readiness of the API's host: its database answers with every migration applied
    /// (503 with the same body, an [`Error::Api`], when not).
    pub fn readyz(&self) -> Call<'_, Readiness> {
        self.get("/readyz".into())
    }

    /// The OpenAPI 3.1 document the server serves.
    pub fn openapi_json(&self) -> Call<'_, serde_json::Value> {
        self.get("/v1/openapi.json".into())
    }

    // Tasks.

    pub fn create_task(&self, draft: &TaskDraft) -> Call<'_, ObjectEnvelope<TaskRecord>> {
        self.post("/v1/tasks".into()).json(draft)
    }

    /// Tasks, newest first; `status` is `not_started` or a run status.
    pub fn list_tasks(&self, status: Option<&str>) -> Call<'_, ListEnvelope<TaskRecord>> {
        self.get("/v1/tasks".into()).query("status", status)
    }

    pub fn get_task(&self, task_id: &str) -> Call<'_, ObjectEnvelope<TaskRecord>> {
        self.get(format!("/v1/tasks/{}", segment(task_id)))
    }

    pub fn delete_task(&self, task_id: &str) -> Call<'_, Deleted> {
        self.delete(format!("/v1/tasks/{}", segment(task_id)))
    }

    /// Creates the task's next run.
    pub fn start_task(
        &self,
        task_id: &str,
        request: &StartRequest,
    ) -> Call<'_, ObjectEnvelope<RunRecord>> {
        self.post(format!("/v1/tasks/{}/start", segment(task_id)))
            .json(request)
    }

    // Runs.

    /// A task's runs, oldest first.
    pub fn list_runs(&self, task_id: &str) -> Call<'_, ListEnvelope<RunRecord>> {
        self.get(format!("/v1/tasks/{}/runs", segment(task_id)))
    }

    /// The runs of every task in the workspace, oldest first; `status` and `task_id` narrow
    /// them.
    pub fn list_workspace_runs(
        &self,
        status: Option<&str>,
        task_id: Option<&str>,
    ) -> Call<'_, ListEnvelope<RunRecord>> {
        self.get("/v1/runs".into())
            .query("status", status)
            .query("task_id", task_id)
    }

    pub fn get_run(&self, task_id: &str, run_id: &str) -> Call<'_, ObjectEnvelope<RunRecord>> {
        self.get(run_path(task_id, run_id))
    }

    pub fn cancel_run(&self, task_id: &str, run_id: &str) -> Call<'_, ObjectEnvelope<RunRecord>> {
        self.post(format!("{}/cancel", run_path(task_id, run_id)))
    }

    /// Starts a run the caller carries out itself; the answer holds its lease token.
    pub fn start_client_run(
        &self,
        task_id: &str,
        request: &ClientRunRequest,
    ) -> Call<'_, ObjectEnvelope<ClientRun>> {
        let path = format!("/v1/tasks/{}/client-runs", segment(task_id));
        Call::new(self, Method::POST, path).json(request)
    }

    /// Records a client-orchestrated run's steps, events and end; renews its lease.
    pub fn append_run_events(
        &self,
        task_id: &str,
        run_id: &str,
        request: &RunEventsRequest,
    ) -> Call<'_, ObjectEnvelope<RunEventsAccepted>> {
        let path = format!("{}/events", run_path(task_id, run_id));
        Call::new(self, Method::POST, path).json(request)
    }

    /// A new run of the task in a fresh workspace.
    pub fn retry_run(
        &self,
        task_id: &str,
        run_id: &str,
        request: &StartRequest,
    ) -> Call<'_, ObjectEnvelope<RunRecord>> {
        self.post(format!("{}/retry", run_path(task_id, run_id)))
            .json(request)
    }

    /// A new run in the finished run's workspace, from its checkpoint.
    pub fn resume_run(
        &self,
        task_id: &str,
        run_id: &str,
        request: &StartRequest,
    ) -> Call<'_, ObjectEnvelope<RunRecord>> {
        self.post(format!("{}/resume", run_path(task_id, run_id)))
            .json(request)
    }

    pub fn list_steps(&self, task_id: &str, run_id: &str) -> Call<'_, ListEnvelope<StepRecord>> {
        self.get(format!("{}/steps", run_path(task_id, run_id)))
    }

    pub fn get_step(
        &self,
        task_id: &str,
        run_id: &str,
        step_id: &str,
    ) -> Call<'_, ObjectEnvelope<StepRecord>> {
        self.get(run_item(task_id, run_id, "steps", step_id, ""))
    }

    /// An agent loop run's transcript: its prompt, model calls, tool calls, approvals and
    /// file changes in order.
    pub fn get_transcript(
        &self,
        task_id: &str,
        run_id: &str,
    ) -> Call<'_, ObjectEnvelope<RunTranscript>> {
        self.get(format!("{}/transcript", run_path(task_id, run_id)))
    }

    /// The prompt layers an agent loop run started from.
    pub fn get_run_context(
        &self,
        task_id: &str,
        run_id: &str,
    ) -> Call<'_, ObjectEnvelope<RunContextPacket>> {
        self.get(format!("{}/context", run_path(task_id, run_id)))
    }

    /// A run's events in order, after `after_sequence`.
    pub fn list_run_events(
        &self,
        task_id: &str,
        run_id: &str,
        after_sequence: Option<i64>,
    ) -> Call<'_, ListEnvelope<EventRecord>> {
        self.get(format!("{}/events", run_path(task_id, run_id)))
            .query("after_sequence", after_sequence)
            .cursor_param("after_sequence")
    }

    pub fn list_artifacts(
        &self,
        task_id: &str,
        run_id: &str,
    ) -> Call<'_, ListEnvelope<ArtifactRecord>> {
        self.get(format!("{}/artifacts", run_path(task_id, run_id)))
    }

    pub fn get_artifact(
        &self,
        task_id: &str,
        run_id: &str,
        artifact_id: &str,
    ) -> Call<'_, ObjectEnvelope<ArtifactRecord>> {
        self.get(run_item(task_id, run_id, "artifacts", artifact_id, ""))
    }

    /// The artifacts of all the task's runs, oldest first.
    pub fn list_task_artifacts(&self, task_id: &str) -> Call<'_, ListEnvelope<ArtifactRecord>> {
        self.get(format!("/v1/tasks/{}/artifacts", segment(task_id)))
    }

    /// An artifact's bytes so far (readable while the run still writes it): see
    /// [`Call::bytes_stream`] and [`Call::tail`].
    pub fn artifact_content(&self, task_id: &str, run_id: &str, artifact_id: &str) -> Call<'_, ()> {
        self.get(run_item(
            task_id,
            run_id,
            "artifacts",
            artifact_id,
            "/content",
        ))
    }

    /// The run a run id names: the API addresses runs under their task, and an operator
    /// often has only the run id.
    pub async fn find_run(&self, run_id: &str) -> Result<ObjectEnvelope<RunRecord>, Error> {
        let task_id = self.task_of("run", run_id).await?;
        self.get_run(&task_id, run_id).await
    }

    /// The task a run or an approval belongs to, read from the audit trail (which records
    /// every entity's creation with its task).
    pub async fn task_of(&self, entity_type: &str, id: &str) -> Result<String, Error> {
        let transitions = self
            .state_transitions(Some(entity_type), Some(id))
            .query("limit", Some(1))
            .await?;
        transitions
            .data
            .into_iter()
            .find_map(|t| t.task_id)
            .ok_or_else(|| Error::Usage(format!("no {entity_type} {id} in this workspace")))
    }

    // Approvals.

    /// Approvals across tasks, oldest first; `status` is `pending`, `approved`, …
    pub fn list_approvals(&self, status: Option<&str>) -> Call<'_, ListEnvelope<ApprovalRecord>> {
        self.get("/v1/approvals".into()).query("status", status)
    }

    pub fn list_task_approvals(
        &self,
        task_id: &str,
        status: Option<&str>,
    ) -> Call<'_, ListEnvelope<ApprovalRecord>> {
        self.get(format!("/v1/tasks/{}/approvals", segment(task_id)))
            .query("status", status)
    }

    /// One run's approvals, oldest first.
    pub fn list_run_approvals(
        &self,
        run_id: &str,
        status: Option<&str>,
    ) -> Call<'_, ListEnvelope<ApprovalRecord>> {
        self.get("/v1/approvals".into())
            .query("run_id", Some(run_id))
            .query("status", status)
    }

    pub fn get_approval(
        &self,
        task_id: &str,
        approval_id: &str,
    ) -> Call<'_, ObjectEnvelope<ApprovalRecord>> {
        self.get(format!(
            "/v1/tasks/{}/approvals/{}",
            segment(task_id),
            segment(approval_id)
        ))
    }

    pub fn resolve_approval(
        &self,
        task_id: &str,
        approval_id: &str,
        request: &ResolveRequest,
    ) -> Call<'_, ObjectEnvelope<Resolution>> {
        let path = format!(
            "/v1/tasks/{}/approvals/{}/resolve",
            segment(task_id),
            segment(approval_id)
        );
        self.post(path).json(request)
    }

    // Schedules.

    /// The workspace's schedules; `task_id` and `enabled` narrow them.
    pub fn list_schedules(
        &self,
        task_id: Option<&str>,
        enabled: Option<bool>,
    ) -> Call<'_, ListEnvelope<ScheduleRecord>> {
        self.get("/v1/task-schedules".into())
            .query("task_id", task_id)
            .query("enabled", enabled)
    }

    pub fn get_schedule(&self, task_id: &str) -> Call<'_, ObjectEnvelope<ScheduleRecord>> {
        self.get(format!("/v1/tasks/{}/schedule", segment(task_id)))
    }

    pub fn put_schedule(
        &self,
        task_id: &str,
        draft: &ScheduleDraft,
    ) -> Call<'_, ObjectEnvelope<ScheduleRecord>> {
        Call::new(
            self,
            Method::PUT,
            format!("/v1/tasks/{}/schedule", segment(task_id)),
        )
        .json(draft)
    }

    pub fn delete_schedule(&self, task_id: &str) -> Call<'_, ()> {
        self.delete(format!("/v1/tasks/{}/schedule", segment(task_id)))
    }

    /// The times the task's schedule fired and what each did.
    pub fn list_occurrences(&self, task_id: &str) -> Call<'_, ListEnvelope<OccurrenceRecord>> {
        self.get(format!(
            "/v1/tasks/{}/schedule/occurrences",
            segment(task_id)
        ))
    }

    // Media jobs.

    /// The workspace's media jobs; `status` and `provider_id` narrow them.
    pub fn list_media_jobs(
        &self,
        status: Option<&str>,
        provider_id: Option<&str>,
    ) -> Call<'_, ListEnvelope<MediaJobRecord>> {
        self.get("/v1/media-jobs".into())
            .query("status", status)
            .query("provider_id", provider_id)
    }

    pub fn create_media_job(
        &self,
        draft: &MediaJobDraft,
    ) -> Call<'_, ObjectEnvelope<MediaJobRecord>> {
        self.post("/v1/media-jobs".into()).json(draft)
    }

    pub fn get_media_job(&self, media_job_id: &str) -> Call<'_, ObjectEnvelope<MediaJobRecord>> {
        self.get(format!("/v1/media-jobs/{}", segment(media_job_id)))
    }

    /// Queues a `queued`, `failed` or `cancelled` job to run.
    pub fn run_media_job(&self, media_job_id: &str) -> Call<'_, ObjectEnvelope<MediaJobRecord>> {
        self.post(format!("/v1/media-jobs/{}/run", segment(media_job_id)))
    }

    pub fn cancel_media_job(&self, media_job_id: &str) -> Call<'_, ObjectEnvelope<MediaJobRecord>> {
        self.post(format!("/v1/media-jobs/{}/cancel", segment(media_job_id)))
    }

    pub fn list_media_artifacts(
        &self,
        media_job_id: &str,
    ) -> Call<'_, ListEnvelope<ArtifactRecord>> {
        self.get(format!(
            "/v1/media-jobs/{}/artifacts",
            segment(media_job_id)
        ))
    }

    /// A media artifact's bytes: see [`Call::bytes_stream`] and [`Call::tail`].
    pub fn media_artifact_content(&self, media_job_id: &str, artifact_id: &str) -> Call<'_, ()> {
        self.get(format!(
            "/v1/media-jobs/{}/artifacts/{}/content",
            segment(media_job_id),
            segment(artifact_id)
        ))
    }

    // Providers.

    pub fn list_providers(&self) -> Call<'_, ListEnvelope<ProviderView>> {
        self.get("/v1/providers".into())
    }

    pub fn get_provider(&self, id: &str) -> Call<'_, ObjectEnvelope<ProviderView>> {
        self.get(format!("/v1/providers/{}", segment(id)))
    }

    /// Checks the preset; `live` also makes one tiny billed call (chat presets only).
    pub fn check_provider(&self, id: &str, live: bool) -> Call<'_, ObjectEnvelope<ProviderCheck>> {
        self.post(format!("/v1/providers/{}/check", segment(id)))
            .query("live", live.then_some(true))
    }

    /// Creates a preset; secrets are named by reference, never sent.
    pub fn create_provider(&self, draft: &ProviderDraft) -> Call<'_, ObjectEnvelope<ProviderView>> {
        self.post("/v1/providers".into()).json(draft)
    }

    /// Changes the preset's given fields; `api_key_ref: Some(None)` removes its reference.
    pub fn patch_provider(
        &self,
        id: &str,
        patch: &ProviderPatch,
    ) -> Call<'_, ObjectEnvelope<ProviderView>> {
        Call::new(
            self,
            Method::PATCH,
            format!("/v1/providers/{}", segment(id)),
        )
        .json_keeping(patch, &["api_key_ref"])
    }

    pub fn delete_provider(&self, id: &str) -> Call<'_, ()> {
        self.delete(format!("/v1/providers/{}", segment(id)))
    }

    /// Whether a secret reference resolves (never its value); `purpose` is what it is for.
    pub fn secret_status(
        &self,
        reference: &str,
        purpose: Option<&str>,
    ) -> Call<'_, ObjectEnvelope<SecretStatus>> {
        self.get("/v1/secrets/status".into())
            .query("ref", Some(reference))
            .query("purpose", purpose)
    }

    /// Request bodies for [`Client::create_provider`], disabled by default.
    pub fn list_templates(&self) -> Call<'_, ListEnvelope<ProviderTemplate>> {
        self.get("/v1/provider-templates".into())
    }

    // External work.

    pub fn render(&self, request: &RenderRequest) -> Call<'_, ObjectEnvelope<Rendered>> {
        self.post("/v1/external-work/render".into()).json(request)
    }

    /// Registers a source (the existing one when its tracker target is registered already).
    pub fn create_source(&self, request: &SourceRequest) -> Call<'_, ObjectEnvelope<SourceRecord>> {
        self.post("/v1/external-work/sources".into()).json(request)
    }

    pub fn list_sources(&self) -> Call<'_, ListEnvelope<SourceRecord>> {
        self.get("/v1/external-work/sources".into())
    }

    pub fn get_source(&self, source_id: &str) -> Call<'_, ObjectEnvelope<SourceRecord>> {
        self.get(source_path(source_id, ""))
    }

    pub fn delete_source(&self, source_id: &str) -> Call<'_, Deleted> {
        self.delete(source_path(source_id, ""))
    }

    pub fn source_status(&self, source_id: &str) -> Call<'_, ObjectEnvelope<SourceStatus>> {
        self.get(source_path(source_id, "/status"))
    }

    pub fn list_items(&self, source_id: &str) -> Call<'_, ListEnvelope<ItemRecord>> {
        self.get(source_path(source_id, "/items"))
    }

    /// The workspace's items across its sources; each filter given narrows the list.
    pub fn list_work_items(&self, filter: &ItemListFilter) -> Call<'_, ListEnvelope<ItemRecord>> {
        self.get("/v1/external-work/items".into())
            .query("source_id", filter.source_id.as_deref())
            .query("state", filter.state.map(ItemState::as_str))
            .query("kind", filter.kind.map(ItemKind::as_str))
    }

    pub fn get_item(&self, item_id: &str) -> Call<'_, ObjectEnvelope<ItemRecord>> {
        self.get(format!("/v1/external-work/items/{}", segment(item_id)))
    }

    /// Polls the source now and answers what the poll did.
    pub fn poll_source(
        &self,
        source_id: &str,
        request: &PollRequest,
    ) -> Call<'_, ObjectEnvelope<PollSummary>> {
        self.post(source_path(source_id, "/poll")).json(request)
    }

    pub fn reconcile_source(&self, source_id: &str) -> Call<'_, ObjectEnvelope<PollSummary>> {
        self.post(source_path(source_id, "/reconcile"))
    }

    pub fn set_background(
        &self,
        source_id: &str,
        request: &BackgroundRequest,
    ) -> Call<'_, ObjectEnvelope<SourceRecord>> {
        self.post(source_path(source_id, "/background"))
            .json(request)
    }

    pub fn import(&self, request: &ImportRequest) -> Call<'_, ObjectEnvelope<Imported>> {
        self.post("/v1/external-work/import".into()).json(request)
    }

    pub fn propose_action(
        &self,
        item_id: &str,
        request: &ActionRequest,
    ) -> Call<'_, ObjectEnvelope<Proposed>> {
        self.post(format!(
            "/v1/external-work/items/{}/actions",
            segment(item_id)
        ))
        .json(request)
    }

    pub fn list_item_actions(&self, item_id: &str) -> Call<'_, ListEnvelope<ActionRecord>> {
        self.get(format!(
            "/v1/external-work/items/{}/actions",
            segment(item_id)
        ))
    }

    pub fn get_action(&self, action_id: &str) -> Call<'_, ObjectEnvelope<ActionRecord>> {
        self.get(format!("/v1/external-work/actions/{}", segment(action_id)))
    }

    /// The workspace's tracker actions; each filter given narrows the list.
    pub fn list_actions(&self, filter: &ActionListFilter) -> Call<'_, ListEnvelope<ActionRecord>> {
        self.get("/v1/external-work/actions".into())
            .query("status", filter.status.map(ActionStatus::as_str))
            .query("kind", filter.kind.map(ActionKind::as_str))
            .query("item_id", filter.item_id.as_deref())
            .query("source_id", filter.source_id.as_deref())
    }

    /// Sends an approved action (its job is queued once, however often this is asked).
    pub fn execute_action(&self, action_id: &str) -> Call<'_, ObjectEnvelope<ActionRecord>> {
        self.post(format!(
            "/v1/external-work/actions/{}/execute",
            segment(action_id)
        ))
    }

    /// Cancels a pending or approved action, rejecting its pending approval.
    pub fn cancel_action(
        &self,
        action_id: &str,
        request: &CancelActionRequest,
    ) -> Call<'_, ObjectEnvelope<ActionRecord>> {
        self.post(format!(
            "/v1/external-work/actions/{}/cancel",
            segment(action_id)
        ))
        .json(request)
    }

    // CI triage.

    /// Triages a pull request item's CI: answers the scan, queued for a worker.
    pub fn triage_item(
        &self,
        item_id: &str,
        request: &TriageRequest,
    ) -> Call<'_, ObjectEnvelope<TriageScan>> {
        self.post(format!(
            "/v1/external-work/items/{}/ci-triage",
            segment(item_id)
        ))
        .json(request)
    }

    pub fn get_triage_scan(&self, scan_id: &str) -> Call<'_, ObjectEnvelope<TriageScan>> {
        self.get(format!(
            "/v1/external-work/ci-triage/scans/{}",
            segment(scan_id)
        ))
    }

    pub fn list_triage(&self, filter: &TriageListFilter) -> Call<'_, ListEnvelope<TriageRecord>> {
        self.get("/v1/external-work/ci-triage".into())
            .query("item_id", filter.item_id.as_deref())
            .query("source_id", filter.source_id.as_deref())
            .query("status", filter.status.map(TriageStatus::as_str))
    }

    pub fn get_triage(&self, triage_id: &str) -> Call<'_, ObjectEnvelope<TriageRecord>> {
        self.get(format!(
            "/v1/external-work/ci-triage/{}",
            segment(triage_id)
        ))
    }

    /// Starts a triage record's fix run (or answers the one it started).
    pub fn start_fix_run(&self, triage_id: &str) -> Call<'_, ObjectEnvelope<FixRun>> {
        self.post(format!(
            "/v1/external-work/ci-triage/{}/run",
            segment(triage_id)
        ))
    }

    // Usage.

    /// Usage totals; `scope` groups them per provider preset or workspace.
    pub fn usage_summary(&self, scope: Option<Grouping>) -> Call<'_, ObjectEnvelope<UsageSummary>> {
        self.get("/v1/usage/summary".into())
            .query("scope", scope.map(Grouping::as_str))
    }

    pub fn usage_events(&self) -> Call<'_, ListEnvelope<UsageEvent>> {
        self.get("/v1/usage/events".into())
    }

    // Agent loop lineage and patches.

    pub fn continue_run(
        &self,
        task_id: &str,
        run_id: &str,
        request: &ContinueRequest,
    ) -> Call<'_, ObjectEnvelope<RunRecord>> {
        self.post(format!("{}/continue", run_path(task_id, run_id)))
            .json(request)
    }

    pub fn retry_from_model_call(
        &self,
        task_id: &str,
        run_id: &str,
        request: &RetryFromModelCallRequest,
    ) -> Call<'_, ObjectEnvelope<RunRecord>> {
        self.post(format!(
            "{}/retry-from-model-call",
            run_path(task_id, run_id)
        ))
        .json(request)
    }

    pub fn list_patches(
        &self,
        task_id: &str,
        run_id: &str,
    ) -> Call<'_, ListEnvelope<PatchSummary>> {
        self.get(format!("{}/patches", run_path(task_id, run_id)))
    }

    /// A patch with the file's content before and after.
    pub fn get_patch(
        &self,
        task_id: &str,
        run_id: &str,
        artifact_id: &str,
    ) -> Call<'_, ObjectEnvelope<PatchDetail>> {
        self.get(run_item(task_id, run_id, "patches", artifact_id, ""))
    }

    /// Puts the file back as it was before the patch.
    pub fn revert_patch(
        &self,
        task_id: &str,
        run_id: &str,
        artifact_id: &str,
    ) -> Call<'_, ObjectEnvelope<PatchDetail>> {
        self.post(run_item(task_id, run_id, "patches", artifact_id, "/revert"))
    }

    /// Writes a proposed patch into its file.
    pub fn apply_patch(
        &self,
        task_id: &str,
        run_id: &str,
        artifact_id: &str,
    ) -> Call<'_, ObjectEnvelope<PatchDetail>> {
        self.post(run_item(task_id, run_id, "patches", artifact_id, "/apply"))
    }

    /// Drops a proposed patch; its file is never touched.
    pub fn discard_patch(
        &self,
        task_id: &str,
        run_id: &str,
        artifact_id: &str,
    ) -> Call<'_, ObjectEnvelope<PatchDetail>> {
        self.post(run_item(
            task_id,
            run_id,
            "patches",
            artifact_id,
            "/discard",
        ))
    }

    // The workspace's feed and audit trail.

    /// The workspace's events in feed order after the cursor `after` (an event's
    /// `cursor`); add `event_type`, `task_id` or `media_job_id` with [`Call::query`].
    pub fn list_feed(&self, after: Option<&str>) -> Call<'_, ListEnvelope<EventRecord>> {
        self.get("/v1/events".into())
            .query("after", after)
            .cursor_param("after")
    }

    /// The audit trail, oldest first: every state change, or one entity's.
    pub fn state_transitions(
        &self,
        entity_type: Option<&str>,
        entity_id: Option<&str>,
    ) -> Call<'_, ListEnvelope<TransitionRecord>> {
        self.get("/v1/state-transitions".into())
            .query("entity_type", entity_type)
            .query("entity_id", entity_id)
    }

    // System.

    /// Queue leases; `status` is `active` (the default), `expired` or `released`.
    pub fn runtime_leases(&self, status: Option<&str>) -> Call<'_, ListEnvelope<LeaseRecord>> {
        self.get("/v1/runtime/leases".into())
            .query("status", status)
    }

    /// Ended attempts per job kind over the last `minutes` (1 to 60, default 15).
    pub fn system_throughput(&self, minutes: Option<i64>) -> Call<'_, ObjectEnvelope<Throughput>> {
        self.get("/v1/system/throughput".into())
            .query("minutes", minutes)
    }

    /// Asks a local-mode host to stop (a local-only action).
    pub fn shutdown(&self) -> Call<'_, ObjectEnvelope<ShutdownAccepted>> {
        self.post("/v1/system/shutdown".into())
    }

    pub fn system_stats(&self) -> Call<'_, ObjectEnvelope<SystemStats>> {
        self.get("/v1/system/stats".into())
    }

    /// This runtime host and the caller.
    pub fn whoami(&self) -> Call<'_, ObjectEnvelope<Session>> {
        self.get("/v1/whoami".into())
    }

    /// The caller's own workspace limits.
    pub fn own_limits(&self) -> Call<'_, ObjectEnvelope<WorkspaceLimits>> {
        self.get("/v1/workspace".into())
    }

    pub fn get_limits(&self, workspace_id: &str) -> Call<'_, ObjectEnvelope<WorkspaceLimits>> {
        self.get(format!("/v1/workspaces/{}/limits", segment(workspace_id)))
    }

    pub fn put_limits(
        &self,
        workspace_id: &str,
        request: &LimitsRequest,
    ) -> Call<'_, ObjectEnvelope<WorkspaceLimits>> {
        let path = format!("/v1/workspaces/{}/limits", segment(workspace_id));
        Call::new(self, Method::PUT, path).json(request)
    }

    /// A workspace's approval policy: its own, or the process setting.
    pub fn get_policy(&self, workspace_id: &str) -> Call<'_, ObjectEnvelope<ApprovalPolicyRecord>> {
        self.get(policy_path(workspace_id))
    }

    /// Sets a workspace's approval policy, whole.
    pub fn put_policy(
        &self,
        workspace_id: &str,
        request: &ApprovalPolicyRequest,
    ) -> Call<'_, ObjectEnvelope<ApprovalPolicyRecord>> {
        Call::new(self, Method::PUT, policy_path(workspace_id)).json(request)
    }

    /// Removes a workspace's own approval policy: the process setting applies again.
    pub fn delete_policy(
        &self,
        workspace_id: &str,
    ) -> Call<'_, ObjectEnvelope<ApprovalPolicyRecord>> {
        self.delete(policy_path(workspace_id))
    }

    // The console (a page for people, outside `/v1` and the OpenAPI document).

    /// A one-time code that signs a browser in to the console within minutes: open
    /// `<base URL>/console#sign-in=<code>` (`keel console` prints it). Local mode with a
    /// runtime token only.
    pub fn console_sign_in_code(&self) -> Call<'_, ObjectEnvelope<ConsoleSignInCode>> {
        self.post("/console/sign-in-codes".into())
    }
}

fn policy_path(workspace_id: &str) -> String {
    format!("/v1/workspaces/{}/approval-policy", segment(workspace_id))
}
