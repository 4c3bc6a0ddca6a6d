//! `data-path`: the fan-out writer, the trusted reader and the membership registry end to end.

super::cases! { "data-path":
    an_offline_member_surfaces_a_durable_post => "offline-member-surfaces",
}
