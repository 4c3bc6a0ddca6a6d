//! `broker-gone`: the broker-gone watchdog: the window, the clock, a frozen daemon credited, the backstop, no other connection.

super::cases! { "broker-gone":
    /// At the shipped window in qualify; 1.5 s here.
    the_broker_sigkill_exits_at_the_window => "sigkill-exits-at-the-window",
    /// At the shipped window in qualify; 6 s here (longer than the bind's own 5 s bound).
    a_verdict_while_starting_exits_at_the_window => "verdict-while-starting",
    a_blip_while_starting_is_not_a_start_up_failure => "blip-while-starting",
    a_sigstopped_broker_starts_the_clock_only_after_pings_fail => "sigstop-clock-starts-after-pings",
    a_frozen_daemon_is_credited_its_stall_and_survives => "frozen-daemon-credited",
    /// At the shipped window and backstop in qualify (15 s, 60 s); 2 s and 8 s here.
    repeated_stalls_end_at_the_backstop => "backstop-under-stalls",
    a_backstop_below_the_window_is_raised_to_it => "backstop-never-less-than-the-window",
    a_blackhole_without_stalls_exits_at_the_window => "blackhole-exits-at-the-window",
    no_other_connection_checks_the_broker => "no-other-connection",
    a_reconnect_stops_the_clock => "reconnect-stops-the-clock",
    the_verdict_ends_the_daemon_while_it_renews => "exits-at-the-window-while-renewing",
}
