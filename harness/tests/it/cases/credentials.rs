//! `renewal`: credential renewal: the 75 % re-read, missed remints, expiry, reloadCreds, rogue re-signs.

super::cases! { "credentials":
    /// The shipped 75 % point (nothing overrides it) in both forms.
    the_daemon_adopts_a_renewal_at_75_percent => "adopted-at-75-percent",
    a_missed_remint_is_reported_and_retried => "missed-remint-reported-and-retried",
    an_expiry_is_not_a_disconnect => "expiry-is-not-a-disconnect",
    an_expired_credential_exits_at_the_backstop => "expired-exit-at-the-backstop",
    /// The shipped 60 s retry: only the read every 5 s while expired adopts before the backstop.
    an_expired_daemon_reads_its_store_promptly => "expired-store-read-promptly",
    reload_creds_before_start_up_is_complete_is_refused => "reload-refused-before-startup",
    a_rogue_resign_is_refused_at_75_percent => "rogue-remint-refused",
    the_reconnect_comes_250_ms_after_the_reply => "reconnect-after-reply",
}
