//! `data-path`: the fan-out writer, the trusted reader and the membership registry end to end.

super::cases! { "data-path":
    an_offline_member_surfaces_a_durable_post => "offline-member-surfaces",
    a_live_channel_mention_reaches_an_authorized_non_member_only => "live-mention-reaches-authorized-non-member",
    two_id_less_posts_are_both_delivered => "id-less-posts-both-delivered",
    a_leave_is_a_hard_read_boundary => "leave-is-a-hard-read-boundary",
    a_leave_bounds_a_copy_made_by_a_writer_that_had_not_seen_it => "leave-boundary-against-a-writer-behind",
    an_acl_narrowed_between_post_and_read_is_not_surfaced => "acl-narrowed-between-post-and-read",
    a_member_who_joins_while_posts_flow_gets_every_post_above_its_join_cursor => "join-while-posts-flow",
    a_rejoin_keeps_the_interval_it_closes => "rejoin-keeps-the-closed-interval",
    a_crash_between_handoff_and_surfacing_loses_nothing => "crash-between-handoff-and-surface",
}
