//! `broker-gone`: the broker-gone watchdog: the window, the clock, a frozen daemon credited, the backstop, no other connection.

super::cases! { "broker-gone":
    a_verdict_while_starting_exits_at_the_window => "verdict-while-starting",
}
