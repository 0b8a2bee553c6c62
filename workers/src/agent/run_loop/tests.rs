//! The loop against a scripted model, fake tools and an in-memory context.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::*;
use crate::agent::Usage;
use crate::{ArtifactHandle, OutputStream, StepHandle, StepResult};

/// Answers with the next scripted response and records the conversations it was sent.
#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Result<ModelResponse, ProviderError>>>,
    received: Mutex<Vec<Vec<Message>>>,
}

impl Script {
    fn new(answers: Vec<Result<ModelResponse, ProviderError>>) -> Script {
        Script {
            answers: Mutex::new(answers.into()),
            received: Mutex::default(),
        }
    }

    fn calls(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    fn last_received(&self) -> Vec<Message> {
        self.received.lock().unwrap().last().cloned().unwrap()
    }
}

impl Model for Script {
    async fn complete(
        &self,
        messages: &[Message],
        _tools: &[ToolSpec],
        on_delta: &mut (dyn FnMut(&str) + Send),
        _cancel: &CancellationToken,
    ) -> Result<Answer, ProviderError> {
        self.received.lock().unwrap().push(messages.to_vec());
        let answer = self.answers.lock().unwrap().pop_front().expect("scripted");
        if let Ok(ModelResponse {
            message:
                Message::Assistant {
                    content: Some(text),
                    ..
                },
            ..
        }) = &answer
        {
            on_delta(text);
        }
        answer.map(|response| Answer {
            response,
            retries: 0,
            route: Route {
                provider: "script".into(),
                model: "scripted".into(),
            },
            failed_over: Vec::new(),
        })
    }
}

fn text(content: &str) -> Result<ModelResponse, ProviderError> {
    Ok(response(Some(content), vec![]))
}

fn tools(calls: &[(&str, &str)]) -> Result<ModelResponse, ProviderError> {
    let calls = calls
        .iter()
        .map(|(id, name)| ToolCall {
            id: id.to_string(),
            name: name.to_string(),
            arguments: "{}".into(),
        })
        .collect();
    Ok(response(None, calls))
}

fn response(content: Option<&str>, tool_calls: Vec<ToolCall>) -> ModelResponse {
    ModelResponse {
        message: Message::Assistant {
            thinking: Vec::new(),
            content: content.map(str::to_string),
            tool_calls,
        },
        usage: Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            cached_tokens: 0,
        },
        model: "test-model".into(),
        finish_reason: Some("stop".into()),
    }
}

/// Tools that answer with their name and remember what they ran.
#[derive(Default)]
struct Tools {
    ran: Mutex<Vec<String>>,
}

impl Toolbox for Tools {
    fn specs(&self) -> Vec<ToolSpec> {
        Vec::new()
    }

    fn summarize(&self, call: &ToolCall) -> String {
        format!("{}: a call", call.name)
    }

    async fn call(
        &self,
        call: &ToolCall,
        _: Option<&[String]>,
        _cancel: &CancellationToken,
    ) -> ToolResult {
        self.ran.lock().unwrap().push(call.id.clone());
        ToolResult {
            content: format!("ran {}", call.name),
            is_error: false,
            patches: Vec::new(),
            blocked: None,
        }
    }
}

impl Tools {
    fn ran(&self) -> Vec<String> {
        self.ran.lock().unwrap().clone()
    }
}

/// Records what the loop persists; each model call costs `cost`.
#[derive(Default)]
struct Ledger {
    cancel: CancellationToken,
    cost: Option<i64>,
    model_calls: Mutex<Vec<u32>>,
    tool_results: Mutex<Vec<(String, String)>>,
    saved: Mutex<Vec<Message>>,
    deltas: Mutex<Vec<(u32, String)>>,
    /// What the policy in force decides, as an operator last set it.
    policy: Mutex<ToolPolicy>,
}

impl RunContext for Ledger {
    fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    async fn clear_ahead(&self) -> Result<(), ContextError> {
        Ok(())
    }

    async fn start_step(&self, _: &str, _: serde_json::Value) -> Result<StepHandle, ContextError> {
        unreachable!("the loop records steps through the agent calls")
    }

    async fn finish_step(&self, _: &StepHandle, _: StepResult) -> Result<(), ContextError> {
        unreachable!("the loop records steps through the agent calls")
    }

    async fn open_output(&self, _: OutputStream) -> Result<ArtifactHandle, ContextError> {
        unreachable!("the loop writes no output artifacts")
    }

    async fn append_output(&self, _: &ArtifactHandle, _: &[u8]) -> Result<(), ContextError> {
        unreachable!("the loop writes no output artifacts")
    }

    async fn close_output(&self, _: &ArtifactHandle) -> Result<(), ContextError> {
        unreachable!("the loop writes no output artifacts")
    }
}

impl AgentContext for Ledger {
    async fn start_model_call(&self, _: u32) -> Result<(), ContextError> {
        Ok(())
    }

    async fn record_model_call(&self, call: &ModelCall) -> Result<Option<i64>, ContextError> {
        self.model_calls.lock().unwrap().push(call.index);
        Ok(self.cost)
    }

    async fn record_tool_result(
        &self,
        call: &ToolCall,
        result: &ToolResult,
    ) -> Result<(), ContextError> {
        let row = (call.id.clone(), result.content.clone());
        self.tool_results.lock().unwrap().push(row);
        Ok(())
    }

    async fn save_conversation(&self, messages: &[Message]) -> Result<(), ContextError> {
        *self.saved.lock().unwrap() = messages.to_vec();
        Ok(())
    }

    async fn tool_policy(&self, _: &[ToolCall]) -> Result<ToolPolicy, ContextError> {
        Ok(self.policy.lock().unwrap().clone())
    }

    fn model_delta(&self, index: u32, text: &str) {
        self.deltas.lock().unwrap().push((index, text.to_string()));
    }
}

fn plan(messages: Vec<Message>) -> AgentPlan {
    AgentPlan {
        messages,
        model_calls: 0,
        prior_model_calls: 0,
        max_model_calls: None,
        gated_tools: Vec::new(),
        approval: None,
        budget: Budget::default(),
        deadline: None,
    }
}

fn user(content: &str) -> Message {
    Message::User {
        content: content.into(),
    }
}

fn failure(outcome: LoopOutcome) -> String {
    match outcome {
        LoopOutcome::Ended(Outcome::Failed { error, .. }) => error,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_conversation_runs_to_the_models_answer_persisting_every_turn() {
    let model = Script::new(vec![
        tools(&[("c1", "read_file"), ("c2", "grep")]),
        text("all done"),
    ]);
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    let outcome = run(&plan(vec![user("look")]), &model, &toolbox, &ctx).await;
    assert_eq!(outcome, Outcome::Completed { exit_code: None }.into());
    assert_eq!(toolbox.ran(), ["c1", "c2"]);
    assert_eq!(*ctx.model_calls.lock().unwrap(), [1, 2]);
    assert_eq!(ctx.tool_results.lock().unwrap().len(), 2);
    // The second call saw both tool results, after the response that asked for them.
    let second = model.last_received();
    assert_eq!(second.len(), 4);
    assert!(
        matches!(&second[3], Message::Tool { tool_call_id, content, .. }
        if tool_call_id == "c2" && content == "ran grep")
    );
    let saved = ctx.saved.lock().unwrap().clone();
    assert_eq!(saved.len(), 5);
    assert!(finished(&saved));
    assert_eq!(*ctx.deltas.lock().unwrap(), [(2, "all done".to_string())]);
}

#[tokio::test]
async fn a_gated_call_stops_the_loop_for_an_approval_without_running_anything() {
    let model = Script::new(vec![tools(&[("c1", "read_file"), ("c2", "shell_exec")])]);
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    let mut plan = plan(vec![user("go")]);
    plan.gated_tools = vec!["shell_exec".into()];
    let outcome = run(&plan, &model, &toolbox, &ctx).await;
    let LoopOutcome::AwaitingApproval { summary, .. } = outcome else {
        panic!("expected to wait, got {outcome:?}");
    };
    // The approval covers the whole response, the ungated call too.
    assert_eq!(summary, ["read_file: a call", "shell_exec: a call"]);
    assert!(toolbox.ran().is_empty());
    assert_eq!(ctx.saved.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn the_policy_in_force_asks_or_denies_each_call_when_it_is_answered() {
    let model = Script::new(vec![
        tools(&[("c1", "shell_exec"), ("c2", "read_file")]),
        text("done"),
    ]);
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    *ctx.policy.lock().unwrap() = ToolPolicy {
        decisions: vec![ToolDecision::Ask, ToolDecision::Allow],
        write_paths: None,
    };
    let outcome = run(&plan(vec![user("go")]), &model, &toolbox, &ctx).await;
    assert!(
        matches!(outcome, LoopOutcome::AwaitingApproval { .. }),
        "{outcome:?}"
    );
    assert!(toolbox.ran().is_empty());
    // The operator denies shell_exec meanwhile: the next attempt refuses that call as the
    // policy's and runs the other, without an approval.
    let conversation = ctx.saved.lock().unwrap().clone();
    *ctx.policy.lock().unwrap() = ToolPolicy {
        decisions: vec![
            ToolDecision::Deny("denied here".into()),
            ToolDecision::Allow,
        ],
        write_paths: None,
    };
    let mut again = plan(conversation);
    again.model_calls = 1;
    let outcome = run(&again, &model, &toolbox, &ctx).await;
    assert_eq!(outcome, Outcome::Completed { exit_code: None }.into());
    assert_eq!(toolbox.ran(), ["c2"]);
    let results = ctx.tool_results.lock().unwrap().clone();
    assert_eq!(results[0], ("c1".to_string(), "denied here".to_string()));
}

/// A conversation whose last response asks for tool calls nobody answered yet.
fn pending(calls: &[(&str, &str)]) -> Vec<Message> {
    let asked = tools(calls).unwrap().message;
    vec![user("go"), asked]
}

#[tokio::test]
async fn an_approved_bundle_is_dispatched_without_calling_the_model_again() {
    let model = Script::new(vec![text("done")]);
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    let mut plan = plan(pending(&[("c1", "shell_exec")]));
    plan.gated_tools = vec!["shell_exec".into()];
    plan.approval = Some(ApprovalDecision::Approved);
    plan.model_calls = 1;
    let outcome = run(&plan, &model, &toolbox, &ctx).await;
    assert_eq!(outcome, Outcome::Completed { exit_code: None }.into());
    assert_eq!(toolbox.ran(), ["c1"]);
    // One call only: the one after the tool result, numbered after the persisted one.
    assert_eq!(model.calls(), 1);
    assert_eq!(*ctx.model_calls.lock().unwrap(), [2]);
}

#[tokio::test]
async fn the_approval_covers_only_the_bundle_it_was_given_for() {
    let model = Script::new(vec![tools(&[("c2", "shell_exec")])]);
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    let mut plan = plan(pending(&[("c1", "shell_exec")]));
    plan.gated_tools = vec!["shell_exec".into()];
    plan.approval = Some(ApprovalDecision::Approved);
    let outcome = run(&plan, &model, &toolbox, &ctx).await;
    assert!(matches!(outcome, LoopOutcome::AwaitingApproval { .. }));
    assert_eq!(toolbox.ran(), ["c1"]);
}

#[tokio::test]
async fn a_refused_bundle_returns_refusals_to_the_model() {
    let model = Script::new(vec![text("understood")]);
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    let mut plan = plan(pending(&[("c1", "shell_exec")]));
    plan.gated_tools = vec!["shell_exec".into()];
    plan.approval = Some(ApprovalDecision::Refused);
    let outcome = run(&plan, &model, &toolbox, &ctx).await;
    assert_eq!(outcome, Outcome::Completed { exit_code: None }.into());
    assert!(toolbox.ran().is_empty());
    let seen = model.last_received();
    assert!(matches!(&seen[2], Message::Tool { content, .. } if content.contains("rejected")));
}

#[tokio::test]
async fn a_taken_over_bundle_runs_only_its_unanswered_calls() {
    let model = Script::new(vec![text("done")]);
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    let mut messages = pending(&[("c1", "read_file"), ("c2", "grep")]);
    messages.push(Message::Tool {
        tool_call_id: "c1".into(),
        name: "read_file".into(),
        content: "persisted before the crash".into(),
    });
    let outcome = run(&plan(messages), &model, &toolbox, &ctx).await;
    assert_eq!(outcome, Outcome::Completed { exit_code: None }.into());
    assert_eq!(toolbox.ran(), ["c2"]);
}

#[tokio::test]
async fn the_budget_stops_a_call_before_it_is_made() {
    let model = Script::new(vec![tools(&[("c1", "read_file")]), text("unused")]);
    let (toolbox, mut ctx) = (Tools::default(), Ledger::default());
    ctx.cost = Some(700);
    let mut plan = plan(vec![user("go")]);
    plan.budget = Budget {
        limit_micros: 1000,
        spent_micros: 300,
        input_micros_per_token: None,
    };
    let error = failure(run(&plan, &model, &toolbox, &ctx).await);
    assert!(error.starts_with("budget_exceeded:"), "{error}");
    assert!(error.contains("1000 micro-USD, 1000 are spent"), "{error}");
    assert_eq!(model.calls(), 1);
    // The estimate of the prompt alone can forbid the first call.
    plan.budget = Budget {
        limit_micros: 100,
        spent_micros: 0,
        input_micros_per_token: Some(1.0),
    };
    plan.messages = vec![user(&"x".repeat(400))];
    let error = failure(run(&plan, &Script::default(), &toolbox, &ctx).await);
    assert!(error.contains("about 100 more"), "{error}");
}

#[tokio::test]
async fn max_model_calls_counts_the_runs_before_this_one() {
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    let mut plan = plan(vec![user("go")]);
    plan.prior_model_calls = 2;
    plan.max_model_calls = Some(2);
    let error = failure(run(&plan, &Script::default(), &toolbox, &ctx).await);
    assert!(error.starts_with("max_model_calls_reached:"), "{error}");
}

#[tokio::test]
async fn provider_failures_fail_the_run_with_their_message() {
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    let fatal = Script::new(vec![Err(ProviderError::Fatal {
        status: Some(400),
        message: "max_tokens is too large".into(),
    })]);
    let error = failure(run(&plan(vec![user("go")]), &fatal, &toolbox, &ctx).await);
    assert_eq!(error, "provider_error: max_tokens is too large");
    let interrupted = Script::new(vec![Err(ProviderError::Interrupted)]);
    let outcome = run(&plan(vec![user("go")]), &interrupted, &toolbox, &ctx).await;
    assert_eq!(outcome, Outcome::Interrupted.into());
}

#[tokio::test]
async fn a_past_deadline_stops_the_loop() {
    let (toolbox, ctx) = (Tools::default(), Ledger::default());
    let mut plan = plan(vec![user("go")]);
    plan.deadline = Some(tokio::time::Instant::now());
    let error = failure(run(&plan, &Script::default(), &toolbox, &ctx).await);
    assert!(error.starts_with("timeout:"), "{error}");
}
