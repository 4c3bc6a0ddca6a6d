//! `retired`: retired lifecycles: entries deleted on first meeting, acked after the delete, given up after ten redeliveries, the member row removed.

super::cases! { "retired":
    a_retired_entry_is_deleted_the_first_time_the_reader_meets_it => "deleted-on-first-meeting",
    a_fresh_reader_pays_nothing_for_a_retired_lifecycle => "fresh-cursor-pays-nothing",
    a_retired_entry_is_acked_only_after_its_delete => "acked-after-delete",
    a_failed_delete_is_given_up_after_ten_redeliveries => "failed-delete-given-up",
    an_entry_already_gone_counts_as_removed => "entry-already-gone",
    the_retired_member_row_is_removed => "member-row-removed",
    a_failed_member_row_removal_is_retried_by_the_next_entry => "member-row-removal-retried",
    stopping_mid_delete_neither_acks_nor_gives_up => "stops-serving-mid-delete",
    an_unknown_owners_entry_is_given_up_and_kept => "unknown-owner-kept",
}
