//! `oversized`: replies larger than the broker's max_payload, refused with their size at once, on both rails.

super::cases! { "oversized":
}
