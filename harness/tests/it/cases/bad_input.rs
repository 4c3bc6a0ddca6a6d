//! `bad-input`: malformed requests on both rails refused clearly, nothing written, the daemon
//! still serving.

super::cases! { "bad-input":
    malformed_delivery_requests_are_refused_and_write_nothing => "delivery-malformed-requests",
    a_channel_outside_the_acl_is_refused_and_written_nowhere => "channel-outside-acl",
    a_caller_cannot_speak_or_be_answered_as_another => "spoofed-caller",
    malformed_admin_requests_are_refused_and_do_nothing => "admin-malformed-requests",
}
