//! `lifecycle`: start-up, the lease, the pid record, `$SYS` admission and TLS.

super::cases! { "lifecycle":
    clean_start_then_sigterm => "clean-start-sigterm",
    second_daemon_is_refused => "second-daemon-refused",
    lease_permission_denial_names_subject_and_operation => "lease-permission-denied",
    broker_refusal_is_quoted => "broker-refusal-quoted",
    deleted_lease_with_no_rival_is_reacquired => "lease-deleted-no-rival",
    identical_rewrite_is_still_its_own => "lease-rewritten-identical",
    foreign_incarnation_is_not_adopted => "lease-foreign-incarnation",
    frozen_holder_loses_the_handover => "handover-while-frozen",
    reused_pid_is_reported_stale => "stale-pid-record",
    no_workspace_root_is_refused => "no-workspace-root",
    creds_under_another_workspace_is_refused => "creds-under-another-workspace",
    tls_demanded_refuses_a_plaintext_listener => "tls-demanded-plaintext-refused",
    tls_mesh_serves => "tls-mesh-serves",
    admission_refuses_without_an_observer => "admission-observer-missing",
    admission_refuses_an_observer_of_another_account => "admission-observer-other-account",
    /// Mutation seen failing: `sys::pinned_to` accepting any grant list that names the
    /// daemon's account (the daemon is admitted and serves).
    admission_refuses_an_observer_of_several_accounts => "admission-observer-several-accounts",
    admission_refuses_a_torn_rotation => "admission-torn-rotation",
    admission_without_an_evictor_is_deny_new_only => "admission-no-evictor",
    lease_expired_while_frozen_is_recreated => "lease-expired-while-frozen",
}
