//! `admin`: the ctl.delivery-admin rail as a manager meets it.

super::cases! { "admin":
    a_verb_the_daemon_does_not_serve_is_refused => "unserved-verb-refused",
    admin_requests_are_answered_one_at_a_time_in_arrival_order => "one-at-a-time-in-arrival-order",
    an_inventory_fences_a_readable_lifecycle_and_a_narrowed_one_leaves_no_mark => "inventory-fences-readable-lifecycle",
    two_hundred_fifty_six_principals_share_one_sweep => "evict-principals-one-shared-sweep",
    a_torn_or_missing_sys_pair_refuses_eviction => "torn-pair-refuses-eviction",
}
