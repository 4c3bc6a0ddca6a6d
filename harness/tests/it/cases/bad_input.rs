//! `bad-input`: malformed and hostile requests on both rails, refused with the daemon still serving.

super::cases! { "bad-input":
}
