//! `standby`: standby hosts: kill, return and graceful stop, timed against the lease row's expiry or release.

super::cases! { "standby":
    the_holder_serves_and_the_standby_retries => "held-lease-standby",
    a_killed_holders_row_expires_and_the_standby_takes_it => "holder-killed-takeover",
    a_returning_host_leaves_the_new_holders_row => "returning-host-leaves-row",
    a_graceful_stop_hands_over_at_the_release => "graceful-stop-takeover",
    an_unprovisioned_host_refuses_without_a_dial => "refuses-unprovisioned",
    another_accounts_credential_refuses_without_a_dial => "refuses-other-account",
    a_malformed_credential_refuses_without_a_dial => "refuses-malformed-credential",
    no_observer_refuses_before_the_lease => "refuses-without-observer",
    a_malformed_manifest_refuses_the_whole_start => "malformed-manifest-refused",
    an_invalid_lane_credential_is_retried_until_it_opens => "invalid-lane-credential-retried",
}
