//! Closed sets the API filters by: each one query parameter's values.

closed_set! {
    /// What the audit trail records the state changes of.
    EntityType {
        Task = "task",
        Run = "run",
        Approval = "approval",
        MediaJob = "media_job",
        Schedule = "schedule",
        /// A workspace's approval policy, set or reset by an operator.
        ApprovalPolicy = "approval_policy",
    }
}

closed_set! {
    /// The order a list is read in: `asc`, oldest first (the default), or `desc`, newest
    /// first; its cursor pages on in the same order.
    ListOrder {
        Asc = "asc",
        Desc = "desc",
    }
}

closed_set! {
    /// Which queue leases to list: live ones (`active`, or `expired` and not yet taken
    /// over) or ended ones (`released`).
    LeaseStatus {
        Active = "active",
        Expired = "expired",
        Released = "released",
    }
}

closed_set! {
    /// What a secret reference is for.
    SecretPurpose {
        ProviderApiKey = "provider_api_key",
        GithubToken = "github_token",
        LinearToken = "linear_token",
        WebhookSecret = "webhook_secret",
        CustomHeader = "custom_header",
        AutomationToken = "automation_token",
    }
}

closed_set! {
    /// How the usage summary groups its rows: `global` (the totals only), per `provider`
    /// preset, or per `workspace`.
    Grouping {
        Global = "global",
        Provider = "provider",
        Workspace = "workspace",
    }
}

closed_set! {
    /// What a media job does.
    MediaOperation {
        ImageGenerate = "image_generate",
        ImageEdit = "image_edit",
        VideoGenerate = "video_generate",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each set's `as_str` is its serde name and its schema's, and `parse` reads it back.
    macro_rules! assert_names {
        ($($set:ty),+) => {$(
            let schema = serde_json::to_value(<$set as utoipa::PartialSchema>::schema()).unwrap();
            let names: Vec<&str> = <$set>::ALL.iter().map(|v| v.as_str()).collect();
            assert_eq!(schema["enum"], serde_json::json!(names), "{}", stringify!($set));
            for value in <$set>::ALL {
                assert_eq!(serde_json::to_value(value).unwrap(), value.as_str());
                assert_eq!(<$set>::parse(value.as_str()), Some(value));
            }
        )+};
    }

    #[test]
    fn names_agree_with_serde_and_the_schema() {
        assert_names!(
            EntityType,
            LeaseStatus,
            SecretPurpose,
            Grouping,
            MediaOperation,
            crate::ApprovalStatus,
            crate::GateDecision,
            crate::PolicySource,
            crate::ExecutionKind,
            crate::StepStatus,
            crate::ArtifactKind,
            crate::ArtifactStatus,
            crate::ScheduleKind,
            crate::OccurrenceStatus,
            crate::BackgroundStatus,
            crate::ItemKind,
            crate::ItemState,
            crate::ActionKind,
            crate::ActionStatus,
            crate::EventType,
            crate::FileOperation,
            crate::WorkspaceMode,
            crate::LineageKind,
            crate::PatchStatus,
            crate::ErrorCode
        );
        assert_eq!(LeaseStatus::names(), "active, expired or released");
        assert_eq!(
            serde_json::to_value(SecretPurpose::GithubToken).unwrap(),
            "github_token"
        );
    }
}
