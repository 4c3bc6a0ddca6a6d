//! `oversized`: a reply larger than the broker's max_payload refused with its size, at once.

super::cases! { "oversized":
    an_oversized_delivery_reply_is_refused_with_its_size => "delivery-rail-reply",
    an_oversized_admin_reply_is_refused_with_its_size => "admin-rail-reply",
}
