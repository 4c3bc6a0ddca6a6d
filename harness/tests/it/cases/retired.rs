//! `retired`: retired lifecycles: entries deleted on first meeting, acked after the delete, given up after ten redeliveries, the member row removed.

super::cases! { "retired":
}
